#include "trident/train/distributed.h"

#include <cmath>
#include <cstdio>

#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/log.h"
#include "trident/parallel/data_parallel.h"
#include "trident/train/prediction.h"

namespace trident::train {
namespace {

// Closing the loop (train/prediction.h): calibrate on the real model (and group), print and record the
// prediction before training; print and record the measured figures beside it after.
struct Loop {
  bool enabled = false;
  Prediction prediction;

  void before(const TrainConfig& cfg, Trainer& t, nn::Model& model, ProcessGroup* pg, const DistributedOptions& opts,
              std::FILE* out) {
    enabled = cfg.model == "gpt" && !cfg.eval_only && t.start_step() < cfg.max_iters;
    if (!enabled) return;
    const int vocab = t.dataset().tokenizer().vocab_size();
    PredictionInput in;
    in.num_params = model.num_params();
    in.world = pg != nullptr ? pg->size() : 1;
    in.rank = pg != nullptr ? pg->rank() : 0;
    in.strategy = parallel::parse_strategy(opts.parallel);
    in.overlap = opts.overlap;
    in.bucket_bytes = static_cast<size_t>(opts.bucket_mb * (1 << 20));
    in.batch = cfg.batch_size;
    in.block = cfg.block_size;
    in.accum = cfg.gradient_accumulation_steps;
    in.layers = cfg.n_layer;
    in.hidden = cfg.n_embd;
    in.heads = cfg.n_head;
    in.vocab = vocab;
    in.activation_checkpointing = cfg.activation_checkpointing;
    const double rss0 = current_rss_bytes();  // model, data and the trainer's AdamW are resident by now
    in.cal = calibrate(model, cfg.batch_size, cfg.block_size, vocab, pg);
    prediction = predict(in);
    const auto& mb = prediction.memory_bytes;
    prediction.peak_rss = rss0 + mb.at("activations") +
                          (in.world > 1 ? mb.at("optimizer_state") + mb.at("comm_buffers") : 0.0);
    if (in.world > 1 && in.strategy != parallel::Strategy::kDdp) {
      // ZeRO's step stages its shard and the gathered flat buffer (padded x (1 + 1/N) floats) each step.
      const double padded = std::ceil(static_cast<double>(in.num_params) / in.world) * in.world;
      prediction.peak_rss += (padded + padded / in.world) * 4;
    }
    nlohmann::json rec = prediction.to_json();
    rec["world"] = in.world;
    rec["parallel"] = in.world > 1 ? opts.parallel : "single";
    rec["calibration"] = in.cal.to_json();
    t.emit_record(rec);
    if (in.rank == 0 && !cfg.json) {
      std::fprintf(out, "%s\n", prediction.summary().c_str());
      std::fflush(out);
    }
  }

  void after(const TrainConfig& cfg, Trainer& t, const TrainResult& res, int rank, int world,
             std::map<std::string, double> memory, std::map<std::string, double> comm, std::FILE* out) {
    if (!enabled || res.tokens_per_s <= 0) return;
    Measured m;
    m.step_s = static_cast<double>(cfg.batch_size) * cfg.block_size * cfg.gradient_accumulation_steps * world /
               res.tokens_per_s;
    m.memory_bytes = std::move(memory);
    m.peak_rss = peak_rss_bytes();
    m.comm_bytes = std::move(comm);
    t.emit_record(measured_json(prediction, m));
    if (rank == 0 && !cfg.json) {
      std::fprintf(out, "%s\n", measured_summary(prediction, m).c_str());
      std::fflush(out);
    }
  }
};

}  // namespace

TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks) {
  RendezvousInfo info = rendezvous_from_env();
  std::FILE* out = hooks.out != nullptr ? hooks.out : stdout;
  Loop loop;
  if (info.world_size <= 1) {
    Trainer* trainer = nullptr;
    auto user_ready = hooks.on_ready;
    hooks.on_ready = [&](nn::Model& model) {
      if (user_ready) user_ready(model);
      loop.before(cfg, *trainer, model, nullptr, opts, out);
    };
    auto user_finished = hooks.on_finished;
    hooks.on_finished = [&](const TrainResult& res) {
      if (user_finished) user_finished(res);
      Trainer& t = *trainer;
      const double n = static_cast<double>(t.model().num_params());
      const double moments = static_cast<double>(t.optimizer().exp_avg().size() + t.optimizer().exp_avg_sq().size());
      std::map<std::string, double> mem = {{"parameters", n * 4},   {"gradients", n * 4},
                                           {"optimizer_state", moments * 4}, {"master_weights", 0},
                                           {"comm_buffers", 0}};
      loop.after(cfg, t, res, 0, 1, mem, {}, out);
    };
    Trainer t(cfg, std::move(hooks));
    trainer = &t;
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
    loop.before(cfg, *trainer, model, pg.get(), opts, out);  // before DataParallel installs its hooks
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
  hooks.on_finished = [&](const TrainResult& r) {
    if (dp) loop.after(cfg, *trainer, r, pg->rank(), pg->size(), dp->memory().bytes, dp->last_step_comm().bytes, out);
  };
  Trainer t(cfg, hooks);
  trainer = &t;
  // DataParallel unhooks the model when destroyed: it must go before the Trainer that owns the model
  // (also when run() throws).
  struct DestroyFirst {
    std::unique_ptr<parallel::DataParallel>& dp;
    ~DestroyFirst() { dp.reset(); }
  } destroy_first{dp};
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
