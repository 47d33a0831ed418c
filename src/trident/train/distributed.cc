#include "trident/train/distributed.h"

#include <cstdio>

#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/log.h"
#include "trident/parallel/data_parallel.h"

namespace trident::train {

TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks) {
  RendezvousInfo info = rendezvous_from_env();
  if (info.world_size <= 1) {
    Trainer t(cfg, std::move(hooks));
    return t.run();
  }
  auto pg = init_process_group();
  parallel::DataParallelOptions dpo;
  dpo.strategy = parallel::parse_strategy(opts.parallel);
  dpo.bucket_bytes = static_cast<size_t>(opts.bucket_mb * (1 << 20));
  dpo.overlap = opts.overlap;
  dpo.adamw.beta1 = static_cast<float>(cfg.beta1);
  dpo.adamw.beta2 = static_cast<float>(cfg.beta2);
  dpo.adamw.weight_decay = static_cast<float>(cfg.weight_decay);

  std::unique_ptr<parallel::DataParallel> dp;
  Trainer* trainer = nullptr;
  hooks.rank = pg->rank();
  hooks.world = pg->size();
  hooks.average = [pg](double v) {
    pg->all_reduce(&v, 1, DType::kFloat64, ReduceOp::kAvg);
    return v;
  };
  hooks.on_ready = [&](nn::Model& model) {
    dpo.adamw.eps = trainer->optimizer().config().eps;
    dp = std::make_unique<parallel::DataParallel>(model, pg, dpo);
    dp->broadcast_parameters();
    auto& opt = trainer->optimizer();
    dp->load_optimizer_state(opt.exp_avg(), opt.exp_avg_sq(), opt.step_count());
  };
  hooks.before_micro = [&](int micro, int accum) { dp->set_require_sync(micro == accum - 1); };
  hooks.after_backward = [&](nn::Model&) { dp->finish_gradient_sync(); };
  hooks.clip = [&](nn::Model&, float max_norm) { return dp->clip_grad_norm(max_norm); };
  hooks.step = [&](float lr) { dp->step(lr); };
  hooks.before_save = [&] {
    if (!dp) return;
    std::vector<float> m, v;
    int64_t step = 0;
    dp->gather_optimizer_state(&m, &v, &step);
    trainer->optimizer().load_state(m, v, step);
  };
  hooks.annotate_step = [&](nlohmann::json& rec) {
    double total = 0;
    for (auto& [k, b] : dp->last_step_comm().bytes) {
      rec["comm_bytes"][k] = b;
      total += b;
    }
    rec["comm_bytes_total"] = total;
  };
  Trainer t(cfg, hooks);
  trainer = &t;
  TrainResult res = t.run();
  if (pg->rank() == 0 && dp) {
    auto r = dp->report();
    std::printf("data parallel (%s, %d ranks): persistent bytes per rank:", r["strategy"].get<std::string>().c_str(),
                pg->size());
    for (auto& [k, v] : r["memory_bytes"].items()) std::printf(" %s %.2f MB", k.c_str(), v.get<double>() / 1e6);
    std::printf("\n  bytes sent per step by this rank:");
    for (auto& [k, v] : r["comm_bytes_per_step"].items()) std::printf(" %s %.2f MB", k.c_str(), v.get<double>() / 1e6);
    std::printf("\n");
    std::fflush(stdout);
  }
  pg->barrier();
  return res;
}

}  // namespace trident::train
