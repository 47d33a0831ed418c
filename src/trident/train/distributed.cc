#include "trident/train/distributed.h"

#include <cstdio>
#include <filesystem>
#include <functional>

#include "trident/comm/flight_recorder.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/log.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/parallel_model.h"
#include "trident/train/health.h"
#include "trident/train/prediction.h"
#include "trident/train/model_parallel_run.h"
#include "trident/train/prediction_loop.h"

namespace trident::train {


TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks) {
  RendezvousInfo info = rendezvous_from_env();
  flight_recorder::set_dump_dir((std::filesystem::path(cfg.out_dir) / "flight_recorder").string());
  check_backend(cfg, opts);
  GroupOptions go;
  go.backend = opts.backend;
  if (info.world_size <= 1 && opts.backend != "mpi") {  // (mpi: the world comes from MPI, not the environment)
    if (cfg.tp * cfg.pp > 1) {
      TRIDENT_THROW(InvalidArgument, "tp={} x pp={} needs at least {} processes; start them with --nproc {}", cfg.tp,
                    cfg.pp, cfg.tp * cfg.pp, cfg.tp * cfg.pp);
    }
    // bfloat16 storage lives in the data-parallel wrapper: one process runs it over a group of one.
    if (cfg.param_dtype != "float32") return train_distributed(cfg, opts, std::move(hooks), init_process_group(go));
    return train_distributed(cfg, opts, std::move(hooks), nullptr);
  }
  return train_distributed(cfg, opts, std::move(hooks), init_process_group(go));
}

TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks,
                              std::shared_ptr<ProcessGroup> world) {
  std::FILE* out = hooks.out != nullptr ? hooks.out : stdout;
  PredictionLoop loop;
  if (world && cfg.tp * cfg.pp > 1) return train_model_parallel(cfg, opts, std::move(hooks), world);
  if (world && world->size() > 1 && cfg.dp > 0 && cfg.dp != world->size()) cfg.resolved_dp(world->size());
  if (!world || (world->size() <= 1 && cfg.param_dtype == "float32")) {
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
  auto pg = world;
  parallel::DataParallelOptions dpo;
  dpo.strategy = parallel::parse_strategy(opts.parallel);
  dpo.bucket_bytes = static_cast<size_t>(opts.bucket_mb * (1 << 20));
  dpo.first_bucket_bytes = static_cast<size_t>(opts.first_bucket_mb * (1 << 20));
  dpo.overlap = opts.overlap;
  dpo.shared_gradients = opts.shared_gradients;
  dpo.storage_dtype = parse_dtype(cfg.param_dtype);
  dpo.adamw.beta1 = static_cast<float>(cfg.beta1);
  dpo.adamw.beta2 = static_cast<float>(cfg.beta2);
  dpo.adamw.weight_decay = static_cast<float>(cfg.weight_decay);
  dpo.adamw.offload = cfg.offload == "optimizer";  // each rank offloads the shard it owns

  std::unique_ptr<parallel::DataParallel> dp;
  Trainer* trainer = nullptr;
  hooks.rank = pg->rank();
  hooks.world = pg->size();
  hooks.average = [pg](double v) {
    pg->all_reduce(&v, 1, DType::kFloat64, ReduceOp::kAvg);
    return v;
  };
  if (pg->size() > 1) hooks.gather_ranks = gather_ranks_over(pg);
  // ZeRO-3 initializes each rank's own pieces of a fresh model (DataParallel), never the whole model.
  hooks.defer_initialization = dpo.strategy == parallel::Strategy::kZero3;
  hooks.zero_stage = dpo.strategy == parallel::Strategy::kZero1   ? 1
                     : dpo.strategy == parallel::Strategy::kZero2 ? 2
                     : dpo.strategy == parallel::Strategy::kZero3 ? 3
                                                                  : 0;
  hooks.on_ready = [&](nn::Model& model) {
    loop.before(cfg, *trainer, model, pg.get(), opts, out);  // before DataParallel installs its hooks
    trainer->emit_record(mesh_record({1, 1, pg->size(), "tp-dp-pp"}, rank_hosts(pg.get())));
    dpo.adamw.eps = trainer->optimizer().config().eps;
    dp = std::make_unique<parallel::DataParallel>(model, pg, dpo);
    dp->broadcast_parameters();
    auto& opt = trainer->optimizer();
    if (opt.has_state()) {  // a checkpoint's moments (a fresh optimizer has none: DataParallel's start at zero)
      opt.sync_state_to_host();  // device moments into exp_avg()/exp_avg_sq() (a no-op on the CPU)
      dp->load_optimizer_state(opt.exp_avg(), opt.exp_avg_sq(), opt.step_count());
    }
    // DataParallel owns the (possibly sharded) moments from here on: the trainer's full copy is freed and
    // refilled only around checkpoint writes (before_save), then freed again after the next step.
    opt.release_state();
  };
  // zero3 samples as it trains, gathering one block at a time on every rank (never the whole model); the
  // other strategies hold the whole model and sample on the writer alone.
  hooks.sample_on_every_rank = dpo.strategy == parallel::Strategy::kZero3;
  hooks.sample_model = [&]() -> nn::Model* { return &trainer->model(); };
  hooks.before_micro = [&](int micro, int accum) { dp->set_require_sync(micro == accum - 1); };
  hooks.after_backward = [&](nn::Model&) { dp->finish_gradient_sync(); };
  hooks.clip = [&](nn::Model&, float max_norm) { return dp->clip_grad_norm(max_norm); };
  hooks.step = [&](float lr) { dp->step(lr); };
  hooks.before_save = [&] {
    if (!dp || dp->streams_checkpoints()) return;  // streamed: checkpoint_view reads the shards tensor by tensor
    std::vector<float> m, v;
    int64_t step = 0;
    dp->gather_optimizer_state(&m, &v, &step);
    trainer->optimizer().load_state(std::move(m), std::move(v), step);
  };
  // ZeRO-3 (float32, CPU) writes checkpoints from the shards, one tensor gathered at a time: no rank holds the
  // whole model or its moments for a save.
  hooks.checkpoint_view = [&]() -> TrainerHooks::SaveView {
    TrainerHooks::SaveView v;
    if (!dp || !dp->streams_checkpoints()) return v;
    v.model = &trainer->model();
    v.optimizer_step = dp->optimizer_step();
    v.read = [&](int which, size_t offset, size_t count, float* dst) {
      dp->read_checkpoint_range(which, offset, count, dst);
    };
    return v;
  };
  // Persistent memory between steps, as of the last step: the final checkpoint and evaluation may gather
  // zero3's parameters afterwards (until the next step), which is not what a step holds.
  std::map<std::string, double> step_memory;
  HealthMonitor health(pg, {}, HealthOptions::from_env(),
                       (std::filesystem::path(cfg.out_dir) / "health.jsonl").string());
  hooks.annotate_step = [&](nlohmann::json& rec) {
    health.annotate(rec);
    double peak = peak_rss_bytes();  // the largest rank's high-water mark (every rank annotates each step)
    pg->all_reduce(&peak, 1, DType::kFloat64, ReduceOp::kMax);
    rec["peak_rss_bytes_max_rank"] = peak;
    if (trainer->optimizer().has_state()) trainer->optimizer().release_state();  // refilled by before_save
    step_memory = dp->memory().merged();  // offloaded state included: the process holds it
    double total = 0;
    for (auto& [k, b] : dp->last_step_comm().bytes) {
      rec["comm_bytes"][k] = b;
      total += b;
    }
    rec["comm_bytes_total"] = total;
    const auto& ov = dp->last_step_overlap();  // gradient collectives against backward (this rank)
    if (ov.comm_s > 0) {
      rec["comm_hidden_fraction"] = ov.hidden_fraction();
      rec["comm_exposed_s"] = ov.exposed_s;
    }
  };
  hooks.on_finished = [&](const TrainResult& r) {
    if (dp)
      loop.after(cfg, *trainer, r, pg->rank(), pg->size(), step_memory.empty() ? dp->memory().merged() : step_memory,
                 dp->last_step_comm().bytes, out);
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
    std::printf("data parallel (%s, %d ranks, %s storage): persistent bytes per rank:",
                r["strategy"].get<std::string>().c_str(), pg->size(), r["storage_dtype"].get<std::string>().c_str());
    for (auto& [k, v] : r["memory_bytes"].items()) std::printf(" %s %.2f MB", k.c_str(), v.get<double>() / 1e6);
    if (r.contains("resident_bytes")) {
      std::printf("\n  resident (measured with mincore):");
      for (auto& [k, v] : r["resident_bytes"].items())
        if (v.is_number()) std::printf(" %s %.2f MB", k.c_str(), v.get<double>() / 1e6);
    }
    std::printf("\n  bytes sent per step by this rank:");
    for (auto& [k, v] : r["comm_bytes_per_step"].items()) std::printf(" %s %.2f MB", k.c_str(), v.get<double>() / 1e6);
    if (const auto& ov = r["overlap"]; ov["steps"].get<int>() > 0 && ov["comm_s"].get<double>() > 0)
      std::printf("\n  gradient communication hidden behind backward: %.1f%% of %.2f ms per step (mean of %d steps); "
                  "finish_gradient_sync waited %.2f ms per step; backward window %.2f ms",
                  100 * ov["comm_hidden_fraction"].get<double>(), 1e3 * ov["comm_s"].get<double>(),
                  ov["steps"].get<int>(), 1e3 * ov["comm_exposed_s"].get<double>(),
                  1e3 * ov["backward_window_s"].get<double>());
    std::printf("\n");
    std::fflush(stdout);
  }
  pg->barrier();
  return res;
}

nlohmann::json mesh_record(const parallel::MeshShape& shape, const std::vector<std::string>& hosts) {
  nlohmann::json rec = {{"type", "mesh"}, {"tp", shape.tp}, {"pp", shape.pp}, {"dp", shape.dp}, {"order", shape.order},
                        {"ranks", nlohmann::json::array()}};
  const int world = shape.tp * shape.pp * shape.dp;
  for (int r = 0; r < world; ++r) {
    const parallel::MeshCoord c = parallel::mesh_coord(shape, r);
    rec["ranks"].push_back({{"rank", r}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}});
    if (static_cast<int>(hosts.size()) == world && !hosts[static_cast<size_t>(r)].empty())
      rec["ranks"].back()["host"] = hosts[static_cast<size_t>(r)];
  }
  return rec;
}

std::vector<std::string> rank_hosts(const ProcessGroup* pg) {
  std::vector<std::string> hosts;
  if (pg == nullptr) return hosts;
  for (const PeerTraffic& p : pg->traffic().peers) hosts.push_back(p.host);
  return hosts;
}

std::function<std::vector<double>(const std::vector<double>&)> gather_ranks_over(std::shared_ptr<ProcessGroup> world) {
  return [world](const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * static_cast<size_t>(world->size()));
    world->all_gather(mine.data(), all.data(), mine.size(), DType::kFloat64);
    return all;
  };
}

void check_backend(const TrainConfig& cfg, const DistributedOptions& opts) {
  if (opts.backend != "native" && opts.backend != "mpi" && opts.backend != "nccl")
    TRIDENT_THROW(InvalidArgument, "--backend '{}' is not one of native, mpi, nccl", opts.backend);
  if (opts.backend == "nccl" && cfg.model.device != "cuda")
    TRIDENT_THROW(InvalidArgument,
                  "--backend nccl reduces GPU memory, but device={}: add --device cuda (one GPU per rank), or use "
                  "--backend native",
                  cfg.model.device);
}

void check_parallel_layout(const TrainConfig& cfg, const DistributedOptions& opts, int world_size, int vocab_size) {
  cfg.validate();
  check_backend(cfg, opts);
  const int dp_size = cfg.resolved_dp(world_size);
  parallel::validate_mesh({cfg.tp, cfg.pp, dp_size, cfg.mesh_order}, world_size);
  if (cfg.tp * cfg.pp == 1) return;
  require_strategy_for_model_parallel(opts);
  if (cfg.pp > 1) {
    parallel::validate_schedule_args(parallel::parse_schedule(cfg.schedule), cfg.pp, cfg.resolved_microbatches(),
                                     cfg.virtual_stages);
  }
  parallel::ParallelModel::validate_layout(model_config_json(cfg, vocab_size), layout_of(cfg, 0, 0));
}

}  // namespace trident::train
