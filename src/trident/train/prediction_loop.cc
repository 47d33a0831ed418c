#include "trident/train/prediction_loop.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "trident/comm/process_group.h"
#include "trident/core/timeline.h"
#include "trident/kernels/device.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/parallel/profile.h"
#include "trident/parallel/schedule.h"
#include "trident/plan/hardware.h"
#include "trident/plan/planner.h"
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


// The calibrated step model (plan/step_model.h) describes blocks of the GPT's shape: full multi-head attention
// and an ungated MLP 4 n_embd wide.
bool step_model_describes(const plan::ModelSpec& m) {
  return m.transformer && !m.gated_mlp && m.kv() == m.heads && m.ffn() == 4 * m.hidden;
}

}  // namespace

// Closing the loop (train/prediction.h): calibrate on the real model (and group), print and record the
// prediction before training; print and record the measured figures beside it after.
struct PredictionLoop::State {
  bool enabled = false;
  Prediction prediction;

  void before(const TrainConfig& cfg, Trainer& t, nn::Model& model, ProcessGroup* pg, const DistributedOptions& opts,
              std::FILE* out) {
    if (cfg.eval_only || t.start_step() >= cfg.max_iters) return;
    const plan::ModelSpec spec = plan_model_spec(cfg, t.dataset().tokenizer().vocab_size());
    if (!spec.transformer) return;  // the planner models transformers
    if (cfg.model.device == "cuda") {
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
    in.block = cfg.model.block_size;
    in.accum = cfg.gradient_accumulation_steps;
    in.layers = cfg.model.n_layer;
    in.hidden = cfg.model.n_embd;
    in.heads = cfg.model.n_head;
    in.vocab = vocab;
    in.activation_checkpointing = cfg.model.activation_checkpointing;
    in.storage_bytes = cfg.param_dtype == "bfloat16" ? 2 : 4;
    const double rss0 = current_rss_bytes();  // model, data and the trainer's AdamW are resident by now
    in.cal = calibrate(model, cfg.batch_size, cfg.model.block_size, vocab, pg);
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
  std::string gpu_parts;  // the prediction's parts, printed beside it

  void before_gpu(const TrainConfig& cfg, Trainer& t, std::FILE* out) {
    gpu = true;
    device_name = kernels::device_ops(kernels::Device::kCuda).describe();
    gpu_name = plan::gpu_for_device_name(device_name);
    const bool bf16 = cfg.model.dtype == "bfloat16";
    plan::TrainSpec ts;
    ts.model = plan_model_spec(cfg, t.dataset().tokenizer().vocab_size());
    ts.global_batch = cfg.batch_size * cfg.gradient_accumulation_steps;
    ts.precision = bf16 ? plan::Precision::kMixed : plan::Precision::kFp32;
    // trident's CUDA kernels keep activations in float32; under bf16 each GEMM and attention call rounds
    // its operands to a bf16 copy.
    ts.activation_bytes = 4;
    ts.operand_copy_bytes = bf16 ? 2 : 0;
    plan::Layout l;
    l.micro_batch = cfg.batch_size;
    l.microbatches = cfg.gradient_accumulation_steps;
    l.recompute = cfg.model.activation_checkpointing ? plan::Recompute::kFull : plan::Recompute::kNone;
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
      rec["attention_efficiency"] = {c.attention_fwd_efficiency, c.attention_bwd_efficiency};
      rec["elementwise_Bps"] = c.elementwise_Bps;
      const plan::ComputeTime ct = plan::compute_time(ts, c, l, ts.model.layers, true);
      rec["gemm_s"] = ct.gemm_s * l.microbatches;
      rec["attention_s"] = ct.attention_s * l.microbatches;
      rec["elementwise_s"] = ct.elementwise_s * l.microbatches;
      gpu_parts = fmt::format("GEMMs {:.1f} ms at {:.0f}% of peak, attention {:.1f} ms at {:.0f}%/{:.0f}% (forward/backward), "
                              "elementwise kernels {:.1f} ms at {:.0f} GB/s",
                              1e3 * ct.gemm_s * l.microbatches, 100 * c.matmul_efficiency,
                              1e3 * ct.attention_s * l.microbatches, 100 * c.attention_fwd_efficiency,
                              100 * c.attention_bwd_efficiency, 1e3 * ct.elementwise_s * l.microbatches,
                              c.elementwise_Bps / 1e9);
    }
    t.emit_record(rec);
    if (cfg.json) return;
    if (gpu_name.empty()) {
      std::fprintf(out, "prediction: none: '%s' is not a GPU of the hardware catalog (plan/hardware.cc), so there is "
                        "no peak to predict the step or MFU from\n",
                   device_name.c_str());
    } else {
      std::fprintf(out, "prediction (planner, %s, %s peak %.0f TFLOP/s): step %.1f ms (%s), %.0f tokens/s, MFU %.1f%%\n",
                   gpu_name.c_str(), bf16 ? "bf16 dense" : "fp32 (no TF32)", peak_flops / 1e12,
                   gpu_eval.step_time_s * 1e3, gpu_parts.c_str(), gpu_eval.tokens_per_s, 100 * gpu_eval.mfu);
    }
    std::fflush(out);
  }

  void after_gpu(const TrainConfig& cfg, Trainer& t, const TrainResult& res, std::FILE* out) {
    const double tokens = static_cast<double>(cfg.batch_size) * cfg.model.block_size * cfg.gradient_accumulation_steps;
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
    m.step_s = static_cast<double>(cfg.batch_size) * cfg.model.block_size * cfg.gradient_accumulation_steps * world /
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
              cfg.model.device == "cpu" && !cfg.eval_only && t.start_step() < cfg.max_iters;
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
    in.block = cfg.model.block_size;
    in.accum = cfg.gradient_accumulation_steps;
    in.hidden = cfg.model.n_embd;
    in.local_layers = 0;
    for (int c = 0; c < pm.num_chunks(); ++c) in.local_layers += pm.chunk_layers(c).second - pm.chunk_layers(c).first;
    in.world = world.size();
    in.cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    const double rss0 = current_rss_bytes();  // model, data and the trainer's AdamW are resident by now
    in.cal = calibrate_model_parallel(pm, mesh, cfg.batch_size / in.microbatches, cfg.model.block_size,
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
    double step = res.tokens_per_s > 0 ? static_cast<double>(cfg.batch_size) * cfg.model.block_size *
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
    // The moments: DataParallel's (sharded) when there is data parallelism, else the trainer's AdamW's, which
    // holds both for every local parameter from its first step on.
    double optimizer = dp != nullptr ? 0.0 : 2 * n * 4;
    double comm_buffers = 0;
    if (dp != nullptr) {
      const auto mem = dp->memory().merged();  // wherever it lives (offload: the host)
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

PredictionLoop::PredictionLoop() : s_(std::make_unique<State>()) {}
PredictionLoop::~PredictionLoop() = default;

void PredictionLoop::before(const TrainConfig& cfg, Trainer& t, nn::Model& model, ProcessGroup* pg,
                            const DistributedOptions& opts, std::FILE* out) {
  s_->before(cfg, t, model, pg, opts, out);
}
void PredictionLoop::after(const TrainConfig& cfg, Trainer& t, const TrainResult& res, int rank, int world,
                           std::map<std::string, double> memory, std::map<std::string, double> comm, std::FILE* out) {
  s_->after(cfg, t, res, rank, world, std::move(memory), std::move(comm), out);
}
void PredictionLoop::before_model_parallel(const TrainConfig& cfg, Trainer& t, parallel::ParallelModel& pm,
                                           const parallel::DeviceMesh& mesh, const DistributedOptions& opts,
                                           std::FILE* out, const std::function<void()>& rehearse) {
  s_->before_model_parallel(cfg, t, pm, mesh, opts, out, rehearse);
}
void PredictionLoop::after_model_parallel(const TrainConfig& cfg, Trainer& t, const TrainResult& res,
                                          parallel::ParallelModel& pm, parallel::DataParallel* dp,
                                          const parallel::DeviceMesh& mesh, double measured_bubble,
                                          const std::vector<Span>& spans,
                                          const std::vector<std::pair<int64_t, int64_t>>& windows, std::FILE* out) {
  s_->after_model_parallel(cfg, t, res, pm, dp, mesh, measured_bubble, spans, windows, out);
}

}  // namespace trident::train
