#include "trident/train/model_parallel_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "trident/comm/process_group.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"
#include "trident/optim/schedule.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/parallel/pipeline.h"
#include "trident/parallel/profile.h"
#include "trident/parallel/schedule.h"
#include "trident/plan/hardware.h"
#include "trident/train/health.h"
#include "trident/train/prediction_loop.h"

namespace trident::train {
namespace {


// A model's flat parameter buffer to and from host memory (it lives in the memory of the model's device).
std::vector<float> params_to_host(const nn::Model& m) {
  std::vector<float> v(m.num_params());
  kernels::device_ops(m.device()).to_host(v.data(), const_cast<nn::Model&>(m).param_data(), v.size() * sizeof(float));
  return v;
}
void params_from_host(nn::Model& m, const std::vector<float>& v) {
  TRIDENT_CHECK(v.size() == m.num_params(), InvalidArgument, "{} values for a model of {} parameters", v.size(),
                m.num_params());
  kernels::device_ops(m.device()).to_device(m.param_data(), v.data(), v.size() * sizeof(float));
}
void zero_params(nn::Model& m) {
  kernels::device_ops(m.device()).memset_zero(m.param_data(), m.num_params() * sizeof(float));
}


// ---- model parallelism -------------------------------------------------------------------------------

// Per-rank time accounting of the training steps (from the timeline), summed over steps.
struct StepClock {
  std::vector<std::pair<int64_t, int64_t>> pipeline;  // [t0, t1) of each training forward+backward
  double step_s = 0;                                  // sum of whole-step wall times
  int64_t step_t0 = 0;
};

std::string fmt_s(double s) { return s >= 1 ? fmt::format("{:.2f} s", s) : fmt::format("{:.1f} ms", s * 1e3); }

}  // namespace

void require_strategy_for_model_parallel(const DistributedOptions& opts) {
  if (opts.parallel != "ddp" && opts.parallel != "zero1") {
    TRIDENT_THROW(InvalidArgument,
                  "--parallel {} is not supported with model parallelism (tp x pp > 1): ZeRO-2/3 keep only a "
                  "data-parallel shard of each gradient (and parameter), while the model-parallel shards need "
                  "their whole gradients after the pipeline flush for the tied-embedding sum and the global "
                  "norm; use --parallel ddp or --parallel zero1 (which shards the optimizer state)",
                  opts.parallel);
  }
}

parallel::ModelLayout layout_of(const TrainConfig& cfg, int tp_rank, int pp_rank) {
  parallel::ModelLayout l;
  l.tp_rank = tp_rank;
  l.tp_size = cfg.tp;
  l.pp_rank = pp_rank;
  l.pp_size = cfg.pp;
  l.virtual_stages = cfg.virtual_stages;
  return l;
}

namespace {

struct RankTimes;

// One model-parallel training run (tp x pp x dp over `pg`): the mesh, this rank's shard and the objects
// built around it, shared by the trainer hooks below. Lifetime: the duration of train_model_parallel.
struct ModelParallelRun {
  const TrainConfig& cfg;
  const DistributedOptions& opts;
  std::shared_ptr<ProcessGroup> pg;
  std::FILE* out = stdout;
  int dp_size = 1;
  std::shared_ptr<parallel::DeviceMesh> mesh;
  parallel::ModelLayout layout;
  std::shared_ptr<ProcessGroup> mp_group;  // the tp x pp ranks of one data-parallel replica
  bool gather_root = false;  // replica 0 gathers the logical model to world rank 0
  bool is_root = false;

  parallel::ParallelModel* pm = nullptr;
  std::unique_ptr<parallel::PipelineEngine> engine;
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<nn::Model> full;  // the logical model on world rank 0 (checkpoints, sampling)
  std::vector<float> full_m, full_v;
  Trainer* trainer = nullptr;
  StepClock clock;
  PredictionLoop loop;  // prediction before training, measured figures beside it after (train/prediction.h)
  std::unique_ptr<HealthMonitor> health;  // slow links and late ranks, checked each step

  ModelParallelRun(const TrainConfig& c, const DistributedOptions& o, std::shared_ptr<ProcessGroup> g, std::FILE* f)
      : cfg(c), opts(o), pg(std::move(g)), out(f ? f : stdout) {}

  void setup_mesh();
  void install_model_hooks(TrainerHooks& hooks);
  void install_step_hooks(TrainerHooks& hooks);
  void report(const TrainResult& res, int64_t run_t0);
  std::vector<RankTimes> gather_rank_times(const std::vector<Span>& spans);
  void print_time_breakdown(const std::vector<RankTimes>& all) const;

  // The logical model's slices of a flat buffer in the shard's layout (moments): put them in the shard's
  // parameter buffer, gather, take them out of the full model (values restored afterwards).
  void gather_flat(const std::vector<float>& local, std::vector<float>* out_full) {
    const std::vector<float> keep = params_to_host(*pm);
    params_from_host(*pm, local);
    if (full) zero_params(*full);
    pm->gather_to_full(full.get(), *mp_group, 0);
    if (full) *out_full = params_to_host(*full);
    params_from_host(*pm, keep);
  }
  void ensure_full() {
    if (is_root && !full) full = nn::make_model(pm->config());
  }
  // The pipeline engine (pp > 1), the prediction (collective) and data parallelism over the replicas.
  void build_around_model(nn::Model& model);
};

// Mesh setup: tp x pp x dp over the world, this rank's layout, the mesh line.
void ModelParallelRun::setup_mesh() {
  require_strategy_for_model_parallel(opts);
  dp_size = cfg.resolved_dp(pg->size());
  if (cfg.pp > 1) {
    parallel::validate_schedule_args(parallel::parse_schedule(cfg.schedule), cfg.pp, cfg.resolved_microbatches(),
                                     cfg.virtual_stages);
  }
  parallel::MeshShape shape{cfg.tp, cfg.pp, dp_size, cfg.mesh_order};
  mesh = std::make_shared<parallel::DeviceMesh>(pg, shape);
  layout = layout_of(cfg, mesh->tp_rank(), mesh->pp_rank());
  mp_group = mesh->model_parallel_group();
  gather_root = mesh->dp_rank() == 0;
  is_root = pg->rank() == 0;
  if (is_root && !cfg.json) {
    std::fprintf(out, "mesh: tp %d x pp %d x dp %d (order %s)%s\n", cfg.tp, cfg.pp, dp_size, cfg.mesh_order.c_str(),
                 cfg.pp > 1 ? fmt::format(", schedule {} with {} microbatches, {} virtual stage(s)", cfg.schedule,
                                          cfg.resolved_microbatches(), cfg.virtual_stages)
                                  .c_str()
                            : "");
  }
}

// Model build: this rank's shard, checkpoints read into it and written from the gathered logical model.
void ModelParallelRun::install_model_hooks(TrainerHooks& hooks) {
  hooks.rank = mesh->dp_rank();
  hooks.world = dp_size;
  hooks.writer = is_root ? 1 : 0;
  if (dp_size > 1) {  // DataParallel over the dp group shards each rank's slices by this stage
    const parallel::Strategy s = parallel::parse_strategy(opts.parallel);
    hooks.zero_stage = s == parallel::Strategy::kZero1   ? 1
                       : s == parallel::Strategy::kZero2 ? 2
                       : s == parallel::Strategy::kZero3 ? 3
                                                         : 0;
  }
  hooks.make_model = [this](const nlohmann::json& config) -> std::unique_ptr<nn::Model> {
    parallel::ParallelModel::validate_layout(config, layout);
    auto m = parallel::make_parallel_model(config, layout, cfg.tp > 1 ? mesh->tp_group() : nullptr,
                                           mesh->embedding_group());
    pm = m.get();
    return m;
  };
  hooks.load_checkpoint = [this](nn::Model&, optim::AdamW& opt, const LoadedCheckpoint& ck) {
    // Every rank reads the logical checkpoint and keeps its slices (of the weights and of the moments).
    auto logical = nn::make_model(ck.meta.model_config);
    if (ck.meta.has_optimizer) {
      std::vector<float> m, v;
      load_optimizer_moments(*logical, ck.optimizer, m, v, ck.dir);
      params_from_host(*logical, m);
      pm->load_from_full(*logical);
      const std::vector<float> ml = params_to_host(*pm);
      params_from_host(*logical, v);
      pm->load_from_full(*logical);
      const std::vector<float> vl = params_to_host(*pm);
      opt.load_state(ml, vl, ck.meta.optimizer_step);
    }
    load_weights(*logical, ck.weights, ck.dir);
    pm->load_from_full(*logical);
  };
  hooks.on_ready = [this](nn::Model& model) { build_around_model(model); };
  hooks.before_save = [this] {
    if (!dp) return;
    std::vector<float> m, v;
    int64_t step = 0;
    dp->gather_optimizer_state(&m, &v, &step);
    trainer->optimizer().load_state(std::move(m), std::move(v), step);
  };
  hooks.checkpoint_view = [this]() {
    TrainerHooks::SaveView view;
    if (!gather_root) return view;  // only replica 0 gathers (its ranks hold what the others hold)
    ensure_full();
    auto& opt = trainer->optimizer();
    opt.sync_state_to_host();
    gather_flat(opt.exp_avg(), &full_m);
    gather_flat(opt.exp_avg_sq(), &full_v);
    if (full) zero_params(*full);
    pm->gather_to_full(full.get(), *mp_group, 0);
    if (is_root) {
      view.model = full.get();
      view.exp_avg = &full_m;
      view.exp_avg_sq = &full_v;
      view.optimizer_step = opt.step_count();
    }
    return view;
  };
  hooks.sample_model = [this]() -> nn::Model* {
    if (!gather_root) return nullptr;
    ensure_full();
    pm->gather_to_full(full.get(), *mp_group, 0);
    return is_root ? full.get() : nullptr;
  };
}

void ModelParallelRun::build_around_model(nn::Model& model) {
  TRIDENT_CHECK(pm != nullptr && &model == pm, InvalidArgument, "model parallelism: the trainer's model is not the "
                "ParallelModel its make_model hook built");
  if (cfg.pp > 1) {
    std::vector<parallel::Stage*> chunks;
    for (int c = 0; c < pm->num_chunks(); ++c) chunks.push_back(&pm->chunk(c));
    parallel::PipelineOptions po;
    po.schedule = parallel::parse_schedule(cfg.schedule);
    po.microbatches = cfg.resolved_microbatches();
    po.virtual_stages = cfg.virtual_stages;
    engine = std::make_unique<parallel::PipelineEngine>(chunks, mesh->pp_group(), po);
  }
  // Prediction before training (collective): after the engine's groups exist (resident), before
  // DataParallel hooks the model (calibration runs backward) and before the timeline starts.
  {
    // The calibration rehearses real steps of this run (synthetic tokens, same on every rank).
    const int B = cfg.batch_size, T = cfg.model.block_size, V = trainer->dataset().tokenizer().vocab_size();
    std::vector<int32_t> rx(static_cast<size_t>(B) * T), ry(rx.size());
    for (size_t i = 0; i < rx.size(); ++i)
      rx[i] = static_cast<int32_t>((i * 7919) % V), ry[i] = static_cast<int32_t>((i * 104729 + 1) % V);
    auto rehearse = [&] {
      if (engine) engine->run(rx.data(), ry.data(), B, T, true, 1.0f);
      else pm->forward_backward(rx.data(), ry.data(), B, T, true, 1.0f);
    };
    loop.before_model_parallel(cfg, *trainer, *pm, *mesh, opts, out, rehearse);
  }
  trainer->emit_record(mesh_record(mesh->shape(), rank_hosts(pg.get())));
  if (dp_size > 1) {
    parallel::DataParallelOptions dpo;
    dpo.strategy = parallel::parse_strategy(opts.parallel);
    dpo.bucket_bytes = static_cast<size_t>(opts.bucket_mb * (1 << 20));
    dpo.first_bucket_bytes = static_cast<size_t>(opts.first_bucket_mb * (1 << 20));
    // Gradients are final only after the pipeline flush (and the tied-embedding sum): no overlap then.
    dpo.overlap = opts.overlap && cfg.pp == 1;
    dpo.shared_gradients = opts.shared_gradients;
    dpo.adamw.beta1 = static_cast<float>(cfg.beta1);
    dpo.adamw.beta2 = static_cast<float>(cfg.beta2);
    dpo.adamw.weight_decay = static_cast<float>(cfg.weight_decay);
  dpo.adamw.offload = cfg.offload == "optimizer";  // each rank offloads the shard it owns
    dpo.adamw.eps = trainer->optimizer().config().eps;
    dp = std::make_unique<parallel::DataParallel>(model, mesh->dp_group(), dpo);
    dp->broadcast_parameters();
    auto& opt = trainer->optimizer();
    if (opt.has_state()) {  // a checkpoint's moments (a fresh optimizer has none: DataParallel's start at zero)
      opt.sync_state_to_host();  // device moments into exp_avg()/exp_avg_sq() (a no-op on the CPU)
      dp->load_optimizer_state(opt.exp_avg(), opt.exp_avg_sq(), opt.step_count());
    }
  }
  timeline().enable(true);
}

// Step: forward/backward through the pipeline (or the one chunk), the tied-embedding and data-parallel
// gradient sums, the global norm over the shards, the optimizer, the averaged loss.
void ModelParallelRun::install_step_hooks(TrainerHooks& hooks) {
  hooks.forward_backward = [this](const int32_t* x, const int32_t* y, int B, int T, bool backward, float scale) {
    const int64_t t0 = Timeline::now_ns();
    double loss;
    if (engine) {
      loss = engine->run(x, y, B, T, backward, scale);
    } else {
      ScopedSpan span(SpanKind::kCompute, backward ? "forward_backward" : "forward");
      loss = pm->forward_backward(x, y, B, T, backward, scale);
    }
    if (backward) clock.pipeline.emplace_back(t0, Timeline::now_ns());
    return loss;
  };
  hooks.before_micro = [this](int micro, int accum) {
    if (micro == 0) clock.step_t0 = Timeline::now_ns();
    if (dp) dp->set_require_sync(micro == accum - 1);
  };
  hooks.after_backward = [this](nn::Model&) {
    pm->sync_tied_gradients();
    if (dp) {
      ScopedSpan span(SpanKind::kComm, "dp_grad_sync");
      dp->finish_gradient_sync();
    }
  };
  hooks.clip = [this](nn::Model&, float max_norm) {
    // Global norm over the logical model: every element counted once over the tp x pp shards (the dp
    // replicas hold identical averaged gradients).
    double ss = pm->grad_sum_squares();
    {
      ScopedSpan span(SpanKind::kComm, "clip_norm(mp)", -1, -1, sizeof(double));
      mp_group->all_reduce(&ss, 1, DType::kFloat64, ReduceOp::kSum);
    }
    const double norm = std::sqrt(ss);
    const float coef = optim::clip_coefficient(norm, max_norm);
    if (coef < 1.0f) {
      // On the model's device (its gradients may be device memory).
      kernels::device_ops(pm->device()).scale_inplace(pm->grad_data(), coef, pm->num_params());
    }
    return norm;
  };
  if (dp_size > 1) {
    hooks.step = [this](float lr) {
      ScopedSpan span(SpanKind::kCompute, "optimizer_dp");
      dp->step(lr);
    };
  }
  hooks.average = [this](double v) {
    if (dp_size > 1) mesh->dp_group()->all_reduce(&v, 1, DType::kFloat64, ReduceOp::kAvg);
    return v;
  };
  hooks.gather_ranks = gather_ranks_over(pg);
  health = std::make_unique<HealthMonitor>(
      pg, std::vector<std::shared_ptr<ProcessGroup>>{mesh->tp_group(), mesh->pp_group(), mesh->dp_group(),
                                                     mesh->embedding_group()},
      HealthOptions::from_env(), (std::filesystem::path(cfg.out_dir) / "health.jsonl").string());
  hooks.annotate_step = [this](nlohmann::json& rec) {
    clock.step_s += static_cast<double>(Timeline::now_ns() - clock.step_t0) * 1e-9;
    health->annotate(rec);
    if (dp) {
      double total = 0;
      for (auto& [k, b] : dp->last_step_comm().bytes) {
        rec["comm_bytes"][k] = b;
        total += b;
      }
      rec["comm_bytes_total"] = total;
    }
  };
}

// Where one rank's training-step time went (seconds summed over the steps) and where it sits in the mesh.
struct RankTimes {
  double step = 0, window = 0, compute = 0, tp = 0, p2p = 0, dp = 0;  // window: the pipeline windows
  double tp_rank = 0, pp_rank = 0, dp_rank = 0, steps = 0;
  // Idle share of the pipeline windows (0 without any).
  double bubble() const { return window > 0 ? std::max(0.0, 1.0 - compute / window) : 0.0; }
};
static_assert(sizeof(RankTimes) == 10 * sizeof(double), "RankTimes travels as 10 doubles");

// Every rank's RankTimes (collective over the world): pipeline windows (compute incl. nested TP
// collectives, p2p waits, bubble), then the rest of each step (DP communication, clipping, optimizer).
std::vector<RankTimes> ModelParallelRun::gather_rank_times(const std::vector<Span>& spans) {
  // The pipeline window of a step is common to its pipeline ranks: from the first rank's start to the last
  // rank's end (a rank that enters the step late, still busy with its optimizer, has idled meanwhile).
  if (cfg.pp > 1) {
    const size_t n = clock.pipeline.size();
    std::vector<int64_t> mine_w(2 * n), all_w(2 * n * static_cast<size_t>(cfg.pp));
    for (size_t i = 0; i < n; ++i) mine_w[2 * i] = clock.pipeline[i].first, mine_w[2 * i + 1] = clock.pipeline[i].second;
    mesh->pp_group()->all_gather(mine_w.data(), all_w.data(), 2 * n, DType::kInt64);
    for (size_t i = 0; i < n; ++i) {
      for (int p = 0; p < cfg.pp; ++p) {
        const int64_t* w = all_w.data() + static_cast<size_t>(p) * 2 * n + 2 * i;
        clock.pipeline[i].first = std::min(clock.pipeline[i].first, w[0]);
        clock.pipeline[i].second = std::max(clock.pipeline[i].second, w[1]);
      }
    }
  }
  RankTimes mine;
  mine.step = clock.step_s;
  for (auto [a, b] : clock.pipeline) {
    parallel::RankProfile rp = parallel::profile_spans(spans, a, b);
    mine.window += rp.window_s;
    mine.compute += rp.compute_s;
    for (auto& [name, sec] : rp.comm_s) {
      if (name.find("(tp)") != std::string::npos) mine.tp += sec;
      else if (name.rfind("send_", 0) == 0 || name.rfind("recv_", 0) == 0) mine.p2p += sec;
    }
  }
  for (const auto& sp : spans)
    if (sp.name == "dp_grad_sync") mine.dp += static_cast<double>(sp.t1_ns - sp.t0_ns) * 1e-9;
  mine.tp_rank = mesh->tp_rank();
  mine.pp_rank = mesh->pp_rank();
  mine.dp_rank = mesh->dp_rank();
  mine.steps = static_cast<double>(clock.pipeline.size());
  std::vector<RankTimes> all(static_cast<size_t>(pg->size()));
  pg->all_gather(&mine, all.data(), 10, DType::kFloat64);
  return all;
}

void ModelParallelRun::print_time_breakdown(const std::vector<RankTimes>& all) const {
  std::fprintf(out, "where the time went (training steps; compute includes the tensor-parallel collectives inside it):\n");
  double bubble_sum = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const RankTimes& f = all[r];
    const double step = f.step > 0 ? f.step : 1e-12;
    bubble_sum += f.bubble();
    std::fprintf(out,
                 "  rank %zu (tp %d, pp %d, dp %d): steps %s | compute %s (%.0f%%) | TP comm %s (%.1f%%) | pipeline "
                 "p2p wait %s (%.1f%%) | DP comm %s (%.1f%%) | bubble %.1f%% of the pipeline time\n",
                 r, static_cast<int>(f.tp_rank), static_cast<int>(f.pp_rank), static_cast<int>(f.dp_rank),
                 fmt_s(f.step).c_str(), fmt_s(f.compute).c_str(), 100 * f.compute / step, fmt_s(f.tp).c_str(),
                 100 * f.tp / step, fmt_s(f.p2p).c_str(), 100 * f.p2p / step, fmt_s(f.dp).c_str(), 100 * f.dp / step,
                 100 * f.bubble());
  }
  if (cfg.pp > 1) {
    const int m = cfg.resolved_microbatches(), P = cfg.pp, v = cfg.virtual_stages;
    std::fprintf(out, "  mean bubble %.1f%% (schedule %s, P=%d, m=%d, v=%d; uniform-stage theory %.1f%%)\n",
                 100 * bubble_sum / static_cast<double>(all.size()), cfg.schedule.c_str(), P, m, v,
                 100.0 * (P - 1) / (static_cast<double>(v) * m + P - 1));
  }
  std::fflush(out);
}

// Report (collective): where the time went per rank, the measured figures beside the prediction, the trace.
void ModelParallelRun::report(const TrainResult& res, int64_t run_t0) {
  const std::vector<Span> spans = timeline().spans();
  const std::vector<RankTimes> all = gather_rank_times(spans);
  if (is_root && !cfg.json && res.losses.size() > 0) print_time_breakdown(all);
  // Measured beside predicted (collective): the mean bubble over ranks as printed above.
  double bubble_mean = 0;
  for (const auto& f : all) bubble_mean += f.bubble() / static_cast<double>(all.size());
  loop.after_model_parallel(cfg, *trainer, res, *pm, dp.get(), *mesh, bubble_mean, spans, clock.pipeline, out);
  if (!cfg.trace.empty()) {
    parallel::write_chrome_trace(*pg, cfg.trace, run_t0);
    if (is_root && !cfg.json) std::fprintf(out, "trace: %s (chrome://tracing or ui.perfetto.dev)\n", cfg.trace.c_str());
  }
  pg->barrier();
}

}  // namespace

TrainResult train_model_parallel(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks,
                                 std::shared_ptr<ProcessGroup> pg) {
  ModelParallelRun run(cfg, opts, std::move(pg), hooks.out);
  run.setup_mesh();
  run.install_model_hooks(hooks);
  run.install_step_hooks(hooks);
  Trainer t(cfg, hooks);
  run.trainer = &t;
  struct DestroyFirst {
    ModelParallelRun& run;
    ~DestroyFirst() {
      run.dp.reset();
      run.engine.reset();
      timeline().enable(false);
    }
  } destroy_first{run};
  const int64_t run_t0 = Timeline::now_ns();
  TrainResult res = t.run();
  run.report(res, run_t0);
  return res;
}

}  // namespace trident::train
