#include "trident/train/distributed.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>

#include "trident/comm/flight_recorder.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/log.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/parallel/pipeline.h"
#include "trident/parallel/profile.h"
#include "trident/parallel/schedule.h"
#include "trident/plan/hardware.h"
#include "trident/plan/planner.h"
#include "trident/train/health.h"
#include "trident/train/prediction.h"

namespace trident::train {
namespace {

using plan::Measured;
using plan::MpPrediction;
using plan::MpPredictionInput;
using plan::Prediction;
using plan::PredictionInput;

// DataParallel's strategy as the step model counts it: the ZeRO stage (ddp = 0).
int zero_stage(const std::string& parallel) {
  switch (parallel::parse_strategy(parallel)) {
    case parallel::Strategy::kDdp: return 0;
    case parallel::Strategy::kZero1: return 1;
    case parallel::Strategy::kZero2: return 2;
    case parallel::Strategy::kZero3: return 3;
  }
  return 0;
}

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

// The calibrated step model (plan/step_model.h) describes blocks of the GPT's shape: full multi-head attention
// and an ungated MLP 4 n_embd wide.
bool step_model_describes(const plan::ModelSpec& m) {
  return m.transformer && !m.gated_mlp && m.kv() == m.heads && m.ffn() == 4 * m.hidden;
}

// Closing the loop (train/prediction.h): calibrate on the real model (and group), print and record the
// prediction before training; print and record the measured figures beside it after.
struct Loop {
  bool enabled = false;
  Prediction prediction;

  void before(const TrainConfig& cfg, Trainer& t, nn::Model& model, ProcessGroup* pg, const DistributedOptions& opts,
              std::FILE* out) {
    if (cfg.eval_only || t.start_step() >= cfg.max_iters) return;
    const plan::ModelSpec spec = plan_model_spec(cfg, t.dataset().tokenizer().vocab_size());
    if (!spec.transformer) return;  // the planner models transformers
    if (cfg.device == "cuda") {
      // The GPU model is of one process on one GPU; ranks may share a GPU, which it does not model.
      if (pg == nullptr || pg->size() == 1) before_gpu(cfg, t, out);
      return;
    }
    // The calibrated cost model predicts CPU time and host memory, for blocks of the GPT's shape.
    if (!step_model_describes(spec)) return;
    enabled = true;
    const int vocab = t.dataset().tokenizer().vocab_size();
    PredictionInput in;
    in.num_params = model.num_params();
    in.world = pg != nullptr ? pg->size() : 1;
    in.rank = pg != nullptr ? pg->rank() : 0;
    in.zero_stage = zero_stage(opts.parallel);
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
    in.storage_bytes = cfg.param_dtype == "bfloat16" ? 2 : 4;
    const double rss0 = current_rss_bytes();  // model, data and the trainer's AdamW are resident by now
    in.cal = calibrate(model, cfg.batch_size, cfg.block_size, vocab, pg);
    prediction = plan::predict(in);
    prediction.peak_rss = rss0 + plan::rss_growth(in, prediction);
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

  // ---- one GPU: the planner's model of the GPU (plan/planner.h, the catalog's peak and GEMM efficiency)
  // beside the measured step, and MFU against the catalog's peak for the run's precision ----
  bool gpu = false;
  std::string device_name, gpu_name;  // gpu_name empty: the device is not in the catalog
  double peak_flops = 0;
  plan::Evaluation gpu_eval;

  void before_gpu(const TrainConfig& cfg, Trainer& t, std::FILE* out) {
    gpu = true;
    device_name = kernels::device_ops(kernels::Device::kCuda).describe();
    gpu_name = plan::gpu_for_device_name(device_name);
    const bool bf16 = cfg.dtype == "bfloat16";
    plan::TrainSpec ts;
    ts.model = plan_model_spec(cfg, t.dataset().tokenizer().vocab_size());
    ts.global_batch = cfg.batch_size * cfg.gradient_accumulation_steps;
    ts.precision = bf16 ? plan::Precision::kMixed : plan::Precision::kFp32;
    plan::Layout l;
    l.micro_batch = cfg.batch_size;
    l.microbatches = cfg.gradient_accumulation_steps;
    l.recompute = cfg.activation_checkpointing ? plan::Recompute::kFull : plan::Recompute::kNone;
    plan::ClusterSpec c;  // model FLOPs do not depend on it; step time and MFU need the catalog's GPU
    if (!gpu_name.empty()) {
      const auto cat = plan::HardwareCatalog::builtin();
      c = plan::make_cluster(cat, gpu_name, 1, 1, "", "", "", ts.precision);
      // trident's float32 GEMMs on CUDA use no TF32: their peak is the CUDA cores'.
      if (!bf16) c.peak_flops = cat.gpu(gpu_name).peak_fp32_flops;
      peak_flops = c.peak_flops;
    }
    try {
      gpu_eval = plan::evaluate(ts, c, l);
    } catch (const std::exception& e) {  // a model the planner cannot lay out still trains
      gpu = false;
      if (!cfg.json) std::fprintf(out, "prediction: none: the planner refused this model: %s\n", e.what());
      return;
    }
    nlohmann::json rec = {{"type", "prediction"},
                          {"device", device_name},
                          {"gpu", gpu_name},
                          {"model_flops_per_step", gpu_eval.model_flops_per_iter}};
    if (!gpu_name.empty()) {
      rec["step_s"] = gpu_eval.step_time_s;
      rec["tokens_per_s"] = gpu_eval.tokens_per_s;
      rec["mfu"] = gpu_eval.mfu;
      rec["peak_flops"] = peak_flops;
      rec["matmul_efficiency"] = c.matmul_efficiency;
    }
    t.emit_record(rec);
    if (cfg.json) return;
    if (gpu_name.empty()) {
      std::fprintf(out, "prediction: none: '%s' is not a GPU of the hardware catalog (plan/hardware.cc), so there is "
                        "no peak to predict the step or MFU from\n",
                   device_name.c_str());
    } else {
      std::fprintf(out, "prediction (planner, %s, %s peak %.0f TFLOP/s, GEMMs at %.0f%% of it): step %.1f ms, %.0f "
                        "tokens/s, MFU %.1f%%\n",
                   gpu_name.c_str(), bf16 ? "bf16 dense" : "fp32 (no TF32)", peak_flops / 1e12,
                   100 * c.matmul_efficiency, gpu_eval.step_time_s * 1e3, gpu_eval.tokens_per_s, 100 * gpu_eval.mfu);
    }
    std::fflush(out);
  }

  void after_gpu(const TrainConfig& cfg, Trainer& t, const TrainResult& res, std::FILE* out) {
    const double tokens = static_cast<double>(cfg.batch_size) * cfg.block_size * cfg.gradient_accumulation_steps;
    const double step = tokens / res.tokens_per_s, flops = gpu_eval.model_flops_per_iter / step;
    nlohmann::json rec = {{"type", "measured"},     {"device", device_name},          {"gpu", gpu_name},
                          {"step_s", step},         {"tokens_per_s", res.tokens_per_s}, {"model_flops_per_s", flops}};
    if (peak_flops > 0) {
      rec["mfu"] = flops / peak_flops;
      rec["predicted_over_measured"] = {{"step_s", gpu_eval.step_time_s / step}};
    }
    t.emit_record(rec);
    if (cfg.json) return;
    std::fprintf(out, "measured: step %.1f ms", step * 1e3);
    if (peak_flops > 0)
      std::fprintf(out, " (predicted %.1f ms, predicted/measured %.2f)", gpu_eval.step_time_s * 1e3,
                   gpu_eval.step_time_s / step);
    std::fprintf(out, ", %.0f tokens/s, model FLOPs %.1f TFLOP/s", res.tokens_per_s, flops / 1e12);
    if (peak_flops > 0)
      std::fprintf(out, ", MFU %.1f%% of %s's %.0f TFLOP/s", 100 * flops / peak_flops, gpu_name.c_str(),
                   peak_flops / 1e12);
    std::fprintf(out, " on %s\n", device_name.c_str());
    std::fflush(out);
  }

  void after(const TrainConfig& cfg, Trainer& t, const TrainResult& res, int rank, int world,
             std::map<std::string, double> memory, std::map<std::string, double> comm, std::FILE* out) {
    if (gpu && res.tokens_per_s > 0) {
      after_gpu(cfg, t, res, out);
      return;
    }
    if (!enabled || res.tokens_per_s <= 0) return;
    Measured m;
    m.step_s = static_cast<double>(cfg.batch_size) * cfg.block_size * cfg.gradient_accumulation_steps * world /
               res.tokens_per_s;
    m.memory_bytes = std::move(memory);
    m.peak_rss = peak_rss_bytes();
    m.comm_bytes = std::move(comm);
    t.emit_record(plan::measured_json(prediction, m));
    if (rank == 0 && !cfg.json) {
      std::fprintf(out, "%s\n", plan::measured_summary(prediction, m).c_str());
      std::fflush(out);
    }
  }

  // ---- model parallelism (train_model_parallel; collectives over the mesh's world: every rank calls) ----
  MpPredictionInput mp_in;
  MpPrediction mp;
  double mp_cpu0 = 0, mp_wall0 = 0;  // process CPU and wall clock after the calibration (cores the run used)

  // Call in on_ready after the pipeline engine exists, before DataParallel hooks the model (calibration runs
  // backward) and before the timeline is enabled.
  void before_model_parallel(const TrainConfig& cfg, Trainer& t, parallel::ParallelModel& pm,
                             const parallel::DeviceMesh& mesh, const DistributedOptions& opts, std::FILE* out,
                             const std::function<void()>& rehearse = {}) {
    // The cost model predicts CPU time and host memory: nothing to close the loop on for a GPU run.
    enabled = step_model_describes(plan_model_spec(cfg, t.dataset().tokenizer().vocab_size())) &&
              cfg.device == "cpu" && !cfg.eval_only && t.start_step() < cfg.max_iters;
    if (!enabled) return;
    ProcessGroup& world = *mesh.world();
    const int P = mesh.pp_size();
    MpPredictionInput& in = mp_in;
    in.tp = mesh.tp_size();
    in.pp = P;
    in.dp = mesh.dp_size();
    in.virtual_stages = pm.num_chunks();
    in.microbatches = P > 1 ? cfg.resolved_microbatches() : 1;
    in.schedule = P > 1 ? parallel::parse_schedule(cfg.schedule) : parallel::ScheduleKind::k1F1B;
    in.pp_rank = mesh.pp_rank();
    in.num_params = pm.num_params();
    for (const auto& sp : pm.shard_specs()) {
      if (P > 1 && mesh.embedding_group() && (sp.role == nn::Role::kWte || sp.role == nn::Role::kWteCopy)) {
        size_t numel = 1;
        for (auto d : sp.shape) numel *= static_cast<size_t>(d);
        in.tied_params = std::max(in.tied_params, numel);
      }
    }
    in.zero_stage = zero_stage(opts.parallel);
    in.batch = cfg.batch_size;
    in.block = cfg.block_size;
    in.accum = cfg.gradient_accumulation_steps;
    in.hidden = cfg.n_embd;
    in.local_layers = 0;
    for (int c = 0; c < pm.num_chunks(); ++c) in.local_layers += pm.chunk_layers(c).second - pm.chunk_layers(c).first;
    in.world = world.size();
    in.cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    const double rss0 = current_rss_bytes();  // model, data and the trainer's AdamW are resident by now
    in.cal = calibrate_model_parallel(pm, mesh, cfg.batch_size / in.microbatches, cfg.block_size,
                                      t.dataset().tokenizer().vocab_size(), 0, rehearse, in.microbatches);
    mp = plan::predict_model_parallel(in);
    mp.peak_rss = rss0 + plan::rss_growth(in, mp);
    {
      // World rank 0 gathers the logical model and its moments for the final checkpoint: a full model
      // (values + gradients) and two moment vectors, 16 bytes per logical parameter.
      double logical = 0;
      for (const auto& sp : pm.shard_specs()) {
        if (sp.tied_copy || (sp.replicated && mesh.tp_rank() != 0)) continue;
        double numel = 1;
        for (auto d : sp.shape) numel *= static_cast<double>(d);
        logical += numel;
      }
      mesh.model_parallel_group()->all_reduce(&logical, 1, DType::kFloat64, ReduceOp::kSum);
      if (world.rank() == 0) mp.peak_rss += 16 * logical;
    }
    // The step is paced by the slowest rank.
    world.all_reduce(&mp.step_s, 1, DType::kFloat64, ReduceOp::kMax);
    constexpr int kF = 4;
    double mine[kF] = {mp.persistent_bytes(), mp.memory_bytes.at("activations"), static_cast<double>(mp.inflight),
                       mp.peak_rss};
    std::vector<double> all(static_cast<size_t>(kF) * world.size());
    world.all_gather(mine, all.data(), kF, DType::kFloat64);
    nlohmann::json rec = mp.to_json();
    rec["world"] = world.size();
    rec["layout"] = {{"tp", in.tp}, {"pp", in.pp}, {"dp", in.dp}, {"schedule", P > 1 ? cfg.schedule : "none"},
                     {"microbatches", in.microbatches}, {"virtual_stages", in.virtual_stages}};
    rec["calibration"] = in.cal.to_json();
    rec["calibration"]["concurrent"] = true;
    for (int r = 0; r < world.size(); ++r) {
      const double* f = all.data() + static_cast<size_t>(r) * kF;
      rec["per_rank"].push_back({{"rank", r}, {"persistent_bytes", f[0]}, {"activation_bytes", f[1]},
                                 {"inflight_microbatches", f[2]}, {"peak_rss_bytes", f[3]}});
    }
    t.emit_record(rec);
    if (world.rank() == 0 && !cfg.json) {
      std::fprintf(out, "prediction (model parallel, rank 0; every rank calibrated its chunks at the same moment): %s\n",
                   mp.summary().c_str());
      for (int r = 0; r < world.size(); ++r) {
        const double* f = all.data() + static_cast<size_t>(r) * kF;
        std::fprintf(out, "  rank %d: memory %.2f MB (persistent %.2f, activations %.2f = %d microbatch(es)), peak RSS %.2f MB\n",
                     r, (f[0] + f[1]) / 1e6, f[0] / 1e6, f[1] / 1e6, static_cast<int>(f[2]), f[3] / 1e6);
      }
      std::fflush(out);
    }
    mp_cpu0 = process_cpu_seconds();
    mp_wall0 = static_cast<double>(Timeline::now_ns()) * 1e-9;
  }

  // Call on every rank after training, with the measured mean bubble (over ranks) and the pipeline windows.
  void after_model_parallel(const TrainConfig& cfg, Trainer& t, const TrainResult& res, parallel::ParallelModel& pm,
                            parallel::DataParallel* dp, const parallel::DeviceMesh& mesh, double measured_bubble,
                            const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                            std::FILE* out) {
    if (!enabled) return;
    ProcessGroup& world = *mesh.world();
    const int P = mesh.pp_size(), v = pm.num_chunks(), p = mesh.pp_rank();
    double step = res.tokens_per_s > 0 ? static_cast<double>(cfg.batch_size) * cfg.block_size *
                                             cfg.gradient_accumulation_steps * mesh.dp_size() / res.tokens_per_s
                                       : 0.0;
    world.all_reduce(&step, 1, DType::kFloat64, ReduceOp::kMax);
    // Cores the run's ranks used from the calibration to here (sum of CPU / wall; one host), and the model's
    // step at that share: tells a model error from a machine that gave the run less than its cores.
    const double wall = static_cast<double>(Timeline::now_ns()) * 1e-9 - mp_wall0;
    double cores_used = (process_cpu_seconds() - mp_cpu0) / std::max(1e-9, wall);
    world.all_reduce(&cores_used, 1, DType::kFloat64, ReduceOp::kSum);
    const double at_used = mp.step_s + plan::step_at_cores_used(mp_in, cores_used) - plan::predict_model_parallel(mp_in).step_s;
    // The measured per-microbatch compute times replayed through the schedule (the bubble without p2p).
    double replayed_bubble = 0;
    if (P > 1) {
      std::vector<double> f, b, sf(static_cast<size_t>(P) * v, 0.0), sb(sf);
      mean_chunk_times(spans, windows, v, &f, &b);
      for (int c = 0; c < v; ++c) sf[static_cast<size_t>(c) * P + p] = f[c], sb[static_cast<size_t>(c) * P + p] = b[c];
      world.all_reduce(sf.data(), sf.size(), DType::kFloat64, ReduceOp::kMax);
      world.all_reduce(sb.data(), sb.size(), DType::kFloat64, ReduceOp::kMax);
      bool have = true;
      for (size_t i = 0; i < sf.size(); ++i) have = have && sf[i] > 0 && sb[i] > 0;
      if (have) {
        const auto kind = parallel::parse_schedule(cfg.schedule);
        auto r = parallel::replay(parallel::make_schedule(kind, P, mp_in.microbatches,
                                                          kind == parallel::ScheduleKind::kInterleaved ? v : 1),
                                  P, v, parallel::ReplayTimes{sf, sb, 0.0});
        for (int q = 0; q < P; ++q) replayed_bubble += r.idle[static_cast<size_t>(q)] / r.makespan / P;  // mean, as measured
      }
    }
    const double n = static_cast<double>(pm.num_params());
    double optimizer = static_cast<double>(t.optimizer().exp_avg().size() + t.optimizer().exp_avg_sq().size()) * 4;
    double comm_buffers = 0;
    if (dp != nullptr) {
      const auto mem = dp->memory().bytes;
      if (mem.count("optimizer_state")) optimizer += mem.at("optimizer_state");
      if (mem.count("comm_buffers")) comm_buffers = mem.at("comm_buffers");
    }
    double acts = 0;
    for (int c = 0; c < v; ++c) acts += static_cast<double>(pm.chunk(c).peak_activation_bytes());
    const double persistent = 2 * n * 4 + optimizer + comm_buffers;
    constexpr int kF = 6;
    double mine[kF] = {mp.persistent_bytes(), persistent, mp.memory_bytes.at("activations"), acts, mp.peak_rss,
                       peak_rss_bytes()};
    std::vector<double> all(static_cast<size_t>(kF) * world.size());
    world.all_gather(mine, all.data(), kF, DType::kFloat64);
    auto ratio = [](double a, double b) { return b > 0 ? a / b : (a == 0 ? 1.0 : 0.0); };
    nlohmann::json rec = {{"type", "measured"},
                          {"model_parallel", true},
                          {"step_s", step},
                          {"bubble_fraction", measured_bubble},
                          {"replayed_bubble_fraction", replayed_bubble},
                          {"cores_used", cores_used},
                          {"step_at_cores_used_s", at_used},
                          {"predicted_over_measured", {{"step_s", ratio(mp.step_s, step)}}}};
    for (int r = 0; r < world.size(); ++r) {
      const double* f = all.data() + static_cast<size_t>(r) * kF;
      rec["per_rank"].push_back({{"rank", r},
                                 {"persistent_bytes", f[1]},
                                 {"peak_activation_bytes", f[3]},
                                 {"memory_bytes_total", f[1] + f[3]},
                                 {"peak_rss_bytes", f[5]},
                                 {"predicted_over_measured",
                                  {{"memory", ratio(f[0] + f[2], f[1] + f[3])},
                                   {"activations", ratio(f[2], f[3])},
                                   {"peak_rss", ratio(f[4], f[5])}}}});
    }
    t.emit_record(rec);
    if (world.rank() == 0 && !cfg.json) {
      std::fprintf(out, "measured: step %.1f ms (predicted %.1f ms, predicted/measured %.2f)", step * 1e3, mp.step_s * 1e3,
                   ratio(mp.step_s, step));
      if (P > 1) {
        std::fprintf(out, ", bubble %.1f%% (predicted %.1f%%; measured per-microbatch times replayed through the "
                          "schedule %.1f%%; uniform theory %.1f%%)",
                     100 * measured_bubble, 100 * mp.bubble_fraction, 100 * replayed_bubble, 100 * mp.bubble_theory);
      }
      std::fprintf(out, "; the ranks used %.2f cores: at that share the model predicts %.1f ms (ratio %.2f)\n", cores_used,
                   at_used * 1e3, ratio(at_used, step));
      for (int r = 0; r < world.size(); ++r) {
        const double* f = all.data() + static_cast<size_t>(r) * kF;
        std::fprintf(out, "  rank %d: memory %.2f MB (predicted %.2f, ratio %.3f; activations peak %.2f MB, predicted "
                          "%.2f), peak RSS %.2f MB (predicted %.2f, ratio %.2f)\n",
                     r, (f[1] + f[3]) / 1e6, (f[0] + f[2]) / 1e6, ratio(f[0] + f[2], f[1] + f[3]), f[3] / 1e6,
                     f[2] / 1e6, f[5] / 1e6, f[4] / 1e6, ratio(f[4], f[5]));
      }
      std::fflush(out);
    }
  }
};


// ---- model parallelism -------------------------------------------------------------------------------

// Per-rank time accounting of the training steps (from the timeline), summed over steps.
struct StepClock {
  std::vector<std::pair<int64_t, int64_t>> pipeline;  // [t0, t1) of each training forward+backward
  double step_s = 0;                                  // sum of whole-step wall times
  int64_t step_t0 = 0;
};

std::string fmt_s(double s) { return s >= 1 ? fmt::format("{:.2f} s", s) : fmt::format("{:.1f} ms", s * 1e3); }

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
  Loop loop;  // prediction before training, measured figures beside it after (train/prediction.h)
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
    trainer->optimizer().load_state(m, v, step);
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
    const int B = cfg.batch_size, T = cfg.block_size, V = trainer->dataset().tokenizer().vocab_size();
    std::vector<int32_t> rx(static_cast<size_t>(B) * T), ry(rx.size());
    for (size_t i = 0; i < rx.size(); ++i)
      rx[i] = static_cast<int32_t>((i * 7919) % V), ry[i] = static_cast<int32_t>((i * 104729 + 1) % V);
    auto rehearse = [&] {
      if (engine) engine->run(rx.data(), ry.data(), B, T, true, 1.0f);
      else pm->forward_backward(rx.data(), ry.data(), B, T, true, 1.0f);
    };
    loop.before_model_parallel(cfg, *trainer, *pm, *mesh, opts, out, rehearse);
  }
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
    dpo.adamw.eps = trainer->optimizer().config().eps;
    dp = std::make_unique<parallel::DataParallel>(model, mesh->dp_group(), dpo);
    dp->broadcast_parameters();
    auto& opt = trainer->optimizer();
    opt.sync_state_to_host();  // device moments into exp_avg()/exp_avg_sq() (a no-op on the CPU)
    dp->load_optimizer_state(opt.exp_avg(), opt.exp_avg_sq(), opt.step_count());
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
    const double coef = max_norm > 0 ? static_cast<double>(max_norm) / (norm + 1e-6) : 1.0;
    if (coef < 1.0) {
      // On the model's device (its gradients may be device memory).
      kernels::device_ops(pm->device()).scale_inplace(pm->grad_data(), static_cast<float>(coef), pm->num_params());
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
  health = std::make_unique<HealthMonitor>(
      pg, std::vector<std::shared_ptr<ProcessGroup>>{mesh->tp_group(), mesh->pp_group(), mesh->dp_group(),
                                                     mesh->embedding_group()},
      HealthOptions::from_env());
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

}  // namespace

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
  Loop loop;
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
    opt.sync_state_to_host();  // device moments into exp_avg()/exp_avg_sq() (a no-op on the CPU)
    dp->load_optimizer_state(opt.exp_avg(), opt.exp_avg_sq(), opt.step_count());
    // DataParallel owns the (possibly sharded) moments from here on: the trainer's full copy is freed and
    // refilled only around checkpoint writes (before_save), then freed again after the next step.
    opt.release_state();
  };
  hooks.sample_model = [&]() -> nn::Model* {
    // zero3 keeps only shards: gather the whole model on every rank first (collective), so rank 0's
    // sampling runs no block gathers of its own. A no-op for the other strategies.
    if (dp) dp->gather_full_parameters();
    return &trainer->model();
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
  // Persistent memory between steps, as of the last step: the final checkpoint and evaluation may gather
  // zero3's parameters afterwards (until the next step), which is not what a step holds.
  std::map<std::string, double> step_memory;
  HealthMonitor health(pg, {}, HealthOptions::from_env());
  hooks.annotate_step = [&](nlohmann::json& rec) {
    health.annotate(rec);
    if (trainer->optimizer().has_state()) trainer->optimizer().release_state();  // refilled by before_save
    step_memory = dp->memory().bytes;
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
      loop.after(cfg, *trainer, r, pg->rank(), pg->size(), step_memory.empty() ? dp->memory().bytes : step_memory,
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

void check_backend(const TrainConfig& cfg, const DistributedOptions& opts) {
  if (opts.backend != "native" && opts.backend != "mpi" && opts.backend != "nccl")
    TRIDENT_THROW(InvalidArgument, "--backend '{}' is not one of native, mpi, nccl", opts.backend);
  if (opts.backend == "nccl" && cfg.device != "cuda")
    TRIDENT_THROW(InvalidArgument,
                  "--backend nccl reduces GPU memory, but device={}: add --device cuda (one GPU per rank), or use "
                  "--backend native",
                  cfg.device);
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
