#include "trident/train/prediction.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "trident/kernels/cpu/ops.h"
#include "trident/plan/model.h"

namespace trident::train {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double sum_map(const std::map<std::string, double>& m) {
  double t = 0;
  for (auto& [k, v] : m) t += v;
  return t;
}
double ratio(double p, double m) { return m > 0 ? p / m : 0.0; }
}  // namespace

nlohmann::json Calibration::to_json() const {
  return {{"forward_backward_s", forward_backward_s},
          {"optimizer_s_per_param", optimizer_s_per_param},
          {"allreduce_bus_Bps", allreduce_bus_Bps}};
}

double Prediction::persistent_bytes() const {
  double t = 0;
  for (auto& [k, v] : memory_bytes)
    if (k != "activations") t += v;
  return t;
}
double Prediction::memory_total() const { return sum_map(memory_bytes); }
double Prediction::comm_total() const { return sum_map(comm_bytes); }
double Measured::memory_total() const { return sum_map(memory_bytes); }
double Measured::comm_total() const { return sum_map(comm_bytes); }

Prediction predict(const PredictionInput& in) {
  Prediction p;
  const double n = static_cast<double>(in.num_params);
  const int N = std::max(1, in.world);
  const bool zero = in.strategy != parallel::Strategy::kDdp && N > 1;
  const double padded = std::ceil(n / N) * N;
  // This rank's shard of the flat buffer (DataParallel's constructor; ddp or one rank: everything).
  double shard = n;
  if (zero) {
    const double s = padded / N;
    shard = std::min(n, (in.rank + 1) * s) - std::min(n, in.rank * s);
  }

  // Memory per rank: DataParallel::memory()'s categories, float32 throughout.
  p.memory_bytes["parameters"] = n * 4;
  p.memory_bytes["gradients"] = n * 4;
  p.memory_bytes["optimizer_state"] = 2 * shard * 4;
  p.memory_bytes["master_weights"] = 0;
  p.memory_bytes["comm_buffers"] = 0.0;
  if (in.strategy == parallel::Strategy::kZero2 && N > 1) {
    // zero2 (parallel/data_parallel.h): fixed chunks of a multiple of N elements from the top; a rank keeps
    // a padded/N shard of gradients and moments; staging only when one partial chunk is the whole buffer.
    const double chunk = std::ceil(std::max(16.0, std::floor(in.bucket_bytes / 4.0)) / N) * N;
    p.memory_bytes["gradients"] = padded / N * 4;
    p.memory_bytes["optimizer_state"] = 2 * padded / N * 4;
    p.memory_bytes["comm_buffers"] = padded != n && n < chunk ? padded * 4 : 0.0;
  }
  plan::ModelSpec spec;
  spec.name = "this-run";
  spec.layers = in.layers;
  spec.hidden = in.hidden;
  spec.heads = in.heads;
  spec.vocab = in.vocab;
  spec.seq = in.block;
  plan::ActivationConfig ac;
  ac.micro_batch = in.batch;
  ac.precision = plan::Precision::kFp32;
  ac.recompute = in.activation_checkpointing ? plan::Recompute::kFull : plan::Recompute::kNone;
  // Stored activations of one micro-batch (accumulation frees them after each backward) + the logits.
  p.memory_bytes["activations"] = plan::activation_bytes_per_layer(spec, ac) * in.layers +
                                  static_cast<double>(in.batch) * in.block * in.vocab * 4;

  // Communication per step, bytes this rank sends.
  if (N > 1) {
    if (in.strategy == parallel::Strategy::kZero2) {
      p.comm_bytes["reduce_scatter"] = (N - 1.0) / N * padded * 4;
    } else {
      p.comm_bytes["all_reduce"] = 2.0 * (N - 1) / N * n * 4;
    }
    if (zero) p.comm_bytes["all_gather"] = (N - 1.0) / N * padded * 4;
  }

  // Time.
  const double tokens = static_cast<double>(in.batch) * in.block * in.accum;
  p.model_flops_per_step = plan::model_flops_per_iteration(spec, tokens);
  const double fb = in.cal.forward_backward_s;
  p.compute_s = in.accum * fb + in.cal.optimizer_s_per_param * shard;
  double exposed = 0, comm = 0;
  const double bw = in.cal.allreduce_bus_Bps;
  if (N > 1 && bw > 0) {
    for (auto& [kind, bytes] : p.comm_bytes) {
      const double t = bytes / bw;
      comm += t;
      if (kind == "all_reduce" && in.overlap) {
        // Buckets start during the last micro-step's backward (about 2/3 of forward+backward); what does
        // not fit under it is exposed, and the last bucket always is.
        const double last_bucket = t * std::min(1.0, static_cast<double>(in.bucket_bytes) / std::max(1.0, n * 4));
        exposed += std::max(last_bucket, t - fb * 2.0 / 3.0);
      } else {
        exposed += t;
      }
    }
  }
  p.comm_s = comm;
  p.exposed_comm_s = exposed;
  p.step_s = p.compute_s + exposed;
  return p;
}

nlohmann::json Prediction::to_json() const {
  nlohmann::json j = {{"type", "prediction"},
                      {"step_s", step_s},
                      {"compute_s", compute_s},
                      {"comm_s", comm_s},
                      {"exposed_comm_s", exposed_comm_s},
                      {"memory_bytes_total", memory_total()},
                      {"persistent_bytes", persistent_bytes()},
                      {"comm_bytes_total", comm_total()},
                      {"model_flops_per_step", model_flops_per_step},
                      {"peak_rss_bytes", peak_rss}};
  for (auto& [k, v] : memory_bytes) j["memory_bytes"][k] = v;
  j["comm_bytes"] = nlohmann::json::object();
  for (auto& [k, v] : comm_bytes) j["comm_bytes"][k] = v;
  return j;
}

std::string Prediction::summary() const {
  std::string s = fmt::format(
      "prediction: step {:.1f} ms (compute {:.1f}, comm {:.1f} exposed {:.1f}), memory per rank {:.2f} MB "
      "(parameters {:.2f}, gradients {:.2f}, optimizer {:.2f}, comm buffers {:.2f}, activations {:.2f}), "
      "comm per step {:.2f} MB, peak RSS {:.2f} MB",
      step_s * 1e3, compute_s * 1e3, comm_s * 1e3, exposed_comm_s * 1e3, memory_total() / 1e6,
      memory_bytes.at("parameters") / 1e6, memory_bytes.at("gradients") / 1e6,
      memory_bytes.at("optimizer_state") / 1e6, memory_bytes.at("comm_buffers") / 1e6,
      memory_bytes.at("activations") / 1e6, comm_total() / 1e6, peak_rss / 1e6);
  return s;
}

Calibration calibrate(nn::Model& model, int batch, int block, int vocab, ProcessGroup* pg) {
  Calibration c;
  std::vector<int32_t> x(static_cast<size_t>(batch) * block), y(x.size());
  std::mt19937 rng(12345);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    y[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  if (pg != nullptr) pg->barrier();
  model.forward_backward(x.data(), y.data(), batch, block, true);  // warm-up (allocations, caches)
  auto t0 = Clock::now();
  for (int k = 0; k < 2; ++k) model.forward_backward(x.data(), y.data(), batch, block, true);
  c.forward_backward_s = since(t0) / 2;
  model.zero_grad();

  // AdamW + squared norm on a 128K-element slice of scratch memory (2 MB, small beside the model; not the
  // model's own buffers: its state must not change).
  const size_t slice = std::min<size_t>(model.num_params(), size_t{1} << 17);
  std::vector<float> pp(slice, 0.01f), g(slice, 0.001f), m(slice, 0.0f), v(slice, 0.0f);
  kernels::cpu::adamw_update(pp.data(), g.data(), m.data(), v.data(), slice, 1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 1);
  t0 = Clock::now();
  for (int k = 0; k < 2; ++k) {
    kernels::cpu::adamw_update(pp.data(), g.data(), m.data(), v.data(), slice, 1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 2 + k);
    volatile double sq = kernels::cpu::sum_squares(g.data(), slice);
    (void)sq;
  }
  c.optimizer_s_per_param = since(t0) / 2 / static_cast<double>(slice);

  if (pg != nullptr && pg->size() > 1) {
    const int N = pg->size();
    const size_t n = model.num_params();
    double best = 1e30;
    for (int k = 0; k < 2; ++k) {
      pg->barrier();
      t0 = Clock::now();
      pg->all_reduce(model.grad_data(), n, DType::kFloat32, ReduceOp::kAvg);
      best = std::min(best, since(t0));
    }
    // Every rank agrees on the rate (the slowest rank's view).
    pg->all_reduce(&best, 1, DType::kFloat64, ReduceOp::kMax);
    c.allreduce_bus_Bps = 2.0 * (N - 1) / N * static_cast<double>(n) * 4 / best;
    model.zero_grad();
  }
  return c;
}

namespace {
double status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(key.size()));
      double kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return 0;
}
}  // namespace

double peak_rss_bytes() { return status_kb("VmHWM:"); }
double current_rss_bytes() { return status_kb("VmRSS:"); }

nlohmann::json measured_json(const Prediction& p, const Measured& m) {
  nlohmann::json j = {{"type", "measured"},
                      {"step_s", m.step_s},
                      {"persistent_bytes", m.memory_total()},
                      {"peak_rss_bytes", m.peak_rss},
                      {"comm_bytes_total", m.comm_total()},
                      {"predicted_over_measured",
                       {{"step_s", ratio(p.step_s, m.step_s)},
                        {"persistent_bytes", ratio(p.persistent_bytes(), m.memory_total())},
                        {"peak_rss", ratio(p.peak_rss, m.peak_rss)},
                        {"comm_bytes", m.comm_total() > 0 ? ratio(p.comm_total(), m.comm_total())
                                                          : (p.comm_total() == 0 ? 1.0 : 0.0)}}}};
  for (auto& [k, v] : m.memory_bytes) j["memory_bytes"][k] = v;
  j["comm_bytes"] = nlohmann::json::object();
  for (auto& [k, v] : m.comm_bytes) j["comm_bytes"][k] = v;
  return j;
}

std::string measured_summary(const Prediction& p, const Measured& m) {
  return fmt::format(
      "measured: step {:.1f} ms (predicted/measured {:.2f}), memory per rank {:.2f} MB persistent "
      "(predicted/measured {:.2f}), peak RSS {:.2f} MB (predicted {:.2f} MB, ratio {:.2f}), "
      "comm per step {:.2f} MB (predicted/measured {:.2f})",
      m.step_s * 1e3, ratio(p.step_s, m.step_s), m.memory_total() / 1e6, ratio(p.persistent_bytes(), m.memory_total()),
      m.peak_rss / 1e6, p.peak_rss / 1e6, ratio(p.peak_rss, m.peak_rss), m.comm_total() / 1e6,
      m.comm_total() > 0 ? ratio(p.comm_total(), m.comm_total()) : (p.comm_total() == 0 ? 1.0 : 0.0));
}

}  // namespace trident::train
