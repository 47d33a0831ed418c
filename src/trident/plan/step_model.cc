#include "trident/plan/step_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "trident/comm/types.h"
#include "trident/core/error.h"
#include "trident/plan/comm_cost.h"
#include "trident/plan/model.h"

namespace trident::plan {
namespace {
double sum_map(const std::map<std::string, double>& m) {
  double t = 0;
  for (auto& [k, v] : m) t += v;
  return t;
}
double ratio(double p, double m) { return m > 0 ? p / m : 0.0; }
}  // namespace

double exposed_after_overlap(double comm_s, double backward_s, double last_bucket_fraction) {
  return std::max(comm_s * last_bucket_fraction, comm_s - backward_s);
}

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
  TRIDENT_CHECK(in.zero_stage >= 0 && in.zero_stage <= 3, InvalidArgument,
                "predict: zero_stage {} is not a data-parallel strategy (0 ddp, 1 zero1, 2 zero2, 3 zero3)",
                in.zero_stage);
  TRIDENT_CHECK(in.storage_bytes == 2 || in.storage_bytes == 4, InvalidArgument,
                "predict: storage_bytes {} is neither 4 (float32) nor 2 (bfloat16)", in.storage_bytes);
  Prediction p;
  const double n = static_cast<double>(in.num_params);
  const int N = std::max(1, in.world);
  const bool zero = in.zero_stage > 0 && N > 1;
  const double padded = std::ceil(n / N) * N;
  // This rank's shard of the flat buffer (DataParallel's constructor; ddp or one rank: everything).
  double shard = n;
  if (zero) {
    const double s = padded / N;
    shard = std::min(n, (in.rank + 1) * s) - std::min(n, in.rank * s);
  }

  // Memory per rank: DataParallel::memory()'s categories (parallel/data_parallel.h). e = bytes per stored
  // parameter/gradient; with bfloat16 storage the float32 master weights are a category of their own
  // (float32: the parameters are the master weights). "own" is what this rank keeps of a sharded tensor:
  // zero1 its contiguous shard, zero2/3 one piece of every unit (padded / N elements).
  const bool bf16 = in.storage_bytes == 2;
  const double e = in.storage_bytes;
  const bool sharded_grads = N > 1 && in.zero_stage >= 2;
  const bool sharded_params = N > 1 && in.zero_stage == 3;
  const double pieces = padded / N;
  const double own = sharded_grads ? pieces : shard;
  p.memory_bytes["parameters"] = (sharded_params ? pieces : n) * e;
  p.memory_bytes["gradients"] = (sharded_grads ? pieces : n) * e;
  p.memory_bytes["optimizer_state"] = 2 * own * 4;
  p.memory_bytes["master_weights"] = bf16 ? own * 4 : 0.0;
  p.memory_bytes["comm_buffers"] = 0.0;
  if (in.zero_stage == 2 && N > 1) {
    // zero2: fixed chunks of a multiple of N elements from the top; staging only when one partial chunk is
    // the whole buffer.
    const double chunk = std::ceil(std::max(16.0, std::floor(in.bucket_bytes / e)) / N) * N;
    p.memory_bytes["comm_buffers"] = padded != n && n < chunk ? padded * e : 0.0;
  }
  ModelSpec spec;
  spec.name = "this-run";
  spec.layers = in.layers;
  spec.hidden = in.hidden;
  spec.heads = in.heads;
  spec.vocab = in.vocab;
  spec.seq = in.block;
  ActivationConfig ac;
  ac.micro_batch = in.batch;
  ac.precision = Precision::kFp32;
  ac.recompute = in.activation_checkpointing ? Recompute::kFull : Recompute::kNone;
  // Stored activations of one micro-batch (accumulation frees them after each backward) + the logits.
  p.memory_bytes["activations"] = activation_bytes_per_layer(spec, ac) * in.layers +
                                  static_cast<double>(in.batch) * in.block * in.vocab * 4;

  // Communication per step, bytes this rank sends (elements of e bytes): ddp all-reduce; zero1 all-reduce +
  // parameter all-gather; zero2 reduce-scatter + all-gather; zero3 reduce-scatter + an all-gather before
  // forward and another before backward.
  if (N > 1) {
    if (sharded_grads) {
      p.comm_bytes["reduce_scatter"] = bus_bytes(OpKind::kReduceScatter, padded * e, N);
    } else {
      p.comm_bytes["all_reduce"] = bus_bytes(OpKind::kAllReduce, n * e, N);
    }
    if (zero) p.comm_bytes["all_gather"] = (sharded_params ? 2.0 : 1.0) * bus_bytes(OpKind::kAllGather, padded * e, N);
  }

  // Time.
  const double tokens = static_cast<double>(in.batch) * in.block * in.accum;
  p.model_flops_per_step = model_flops_per_iteration(spec, tokens);
  const double fb = in.cal.forward_backward_s;
  p.compute_s = in.accum * fb + in.cal.optimizer_s_per_param * shard;
  double exposed = 0, comm = 0;
  const double bw = in.cal.allreduce_bus_Bps;
  if (N > 1 && bw > 0) {
    for (auto& [kind, bytes] : p.comm_bytes) {
      const double t = bytes / bw;
      comm += t;
      if (kind == "all_reduce" && in.overlap) {
        // Buckets start during the last micro-step's backward (about 2/3 of forward+backward).
        const double last_bucket = std::min(1.0, static_cast<double>(in.bucket_bytes) / std::max(1.0, n * e));
        exposed += exposed_after_overlap(t, fb * 2.0 / 3.0, last_bucket);
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
      "(parameters {:.2f}, gradients {:.2f}, {}optimizer {:.2f}, comm buffers {:.2f}, activations {:.2f}), "
      "comm per step {:.2f} MB, peak RSS {:.2f} MB",
      step_s * 1e3, compute_s * 1e3, comm_s * 1e3, exposed_comm_s * 1e3, memory_total() / 1e6,
      memory_bytes.at("parameters") / 1e6, memory_bytes.at("gradients") / 1e6,
      memory_bytes.count("master_weights") && memory_bytes.at("master_weights") > 0
          ? fmt::format("master weights {:.2f}, ", memory_bytes.at("master_weights") / 1e6)
          : std::string(),
      memory_bytes.at("optimizer_state") / 1e6, memory_bytes.at("comm_buffers") / 1e6,
      memory_bytes.at("activations") / 1e6, comm_total() / 1e6, peak_rss / 1e6);
  return s;
}


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


nlohmann::json StageCalibration::to_json() const {
  return {{"forward_s", forward_s},
          {"backward_s", backward_s},
          {"activation_bytes", activation_bytes},
          {"p2p_latency_s", p2p_latency_s},
          {"p2p_Bps", p2p_Bps},
          {"dp_allreduce_bus_Bps", dp_allreduce_bus_Bps},
          {"optimizer_s_per_param", optimizer_s_per_param},
          {"forward_cpu_s", forward_cpu_s},
          {"backward_cpu_s", backward_cpu_s},
          {"cores_received", cores_received},
          {"handoff_loaded_s", handoff_loaded_s},
          {"rehearsal_factor", rehearsal_factor},
          {"rehearsal_wall_s", rehearsal_wall_s},
          {"seconds", seconds}};
}

double MpPrediction::memory_total() const { return sum_map(memory_bytes); }
double MpPrediction::persistent_bytes() const {
  double t = 0;
  for (auto& [k, v] : memory_bytes)
    if (k != "activations") t += v;
  return t;
}

double schedule_peak_activation_bytes(const std::vector<parallel::Action>& actions,
                                      const std::vector<double>& bytes_per_chunk, int* inflight) {
  double cur = 0, peak = 0;
  int n = 0, n_at_peak = 0;
  for (const auto& a : actions) {
    TRIDENT_CHECK(a.chunk >= 0 && static_cast<size_t>(a.chunk) < bytes_per_chunk.size(), InvalidArgument,
                  "schedule_peak_activation_bytes: action {} names chunk {} but bytes are given for {} chunk(s)",
                  parallel::to_string(a), a.chunk, bytes_per_chunk.size());
    const double b = bytes_per_chunk[static_cast<size_t>(a.chunk)];
    if (a.type == parallel::Action::kForward) {
      cur += b;
      ++n;
      if (cur > peak) peak = cur, n_at_peak = n;
    } else {
      cur -= b;
      --n;
    }
  }
  if (inflight != nullptr) *inflight = n_at_peak;
  return peak;
}

parallel::ReplayResult replay_shared_cores(const parallel::Schedule& s, int P, int v, const parallel::DurationFn& duration,
                                           double latency, double cores, double wake_latency, double background) {
  using parallel::Action;
  TRIDENT_CHECK(cores > 0 && static_cast<int>(s.size()) == P, InvalidArgument,
                "replay_shared_cores: need cores > 0 (got {}) and one action list per rank ({} lists for P = {})",
                cores, s.size(), P);
  TRIDENT_CHECK(wake_latency >= 0 && background >= 0, InvalidArgument,
                "replay_shared_cores: wake latency ({}) and background tasks ({}) must be >= 0", wake_latency,
                background);
  const int S = P * v;
  int m = 0;
  for (const auto& acts : s)
    for (const auto& a : acts) m = std::max(m, a.mb + 1);
  const double kInf = std::numeric_limits<double>::infinity();
  const size_t Pz = static_cast<size_t>(P);
  const int slots = std::max(1, static_cast<int>(std::ceil(cores - 1e-9)));
  // done[type][stage][mb] = finish time (inf: not yet).
  std::vector<std::vector<double>> fdone(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(m), kInf)),
      bdone = fdone;
  parallel::ReplayResult r;
  r.start.assign(Pz, {});
  r.finish.assign(Pz, {});
  for (size_t p = 0; p < Pz; ++p) {
    r.start[p].assign(s[p].size(), 0.0);
    r.finish[p].assign(s[p].size(), 0.0);
  }
  std::vector<size_t> next(Pz, 0);
  std::vector<double> remaining(Pz, 0.0), free_at(Pz, 0.0), wake_at(Pz, kInf), queued_at(Pz, kInf);
  std::vector<bool> running(Pz, false);
  // When rank p's next action may start (inf: a dependency has not finished); *blocked: the rank was free
  // before its last cross-rank dependency arrived (it sleeps on a receive and must be woken).
  auto ready_time = [&](int p, bool* blocked) {
    const Action& a = s[static_cast<size_t>(p)][next[static_cast<size_t>(p)]];
    const int st = a.chunk * P + p;
    const double free = free_at[static_cast<size_t>(p)];
    double t = free;
    bool waited = false;
    auto dep = [&](double fin, int other_stage) {
      const bool remote = other_stage % P != p;
      const double arrive = fin + (remote ? latency : 0.0);
      if (remote && arrive > free + 1e-12) waited = true;
      t = std::max(t, arrive);
    };
    if (a.type == Action::kForward) {
      if (st > 0) dep(fdone[static_cast<size_t>(st - 1)][static_cast<size_t>(a.mb)], st - 1);
    } else {
      dep(fdone[static_cast<size_t>(st)][static_cast<size_t>(a.mb)], st);
      if (st < S - 1) dep(bdone[static_cast<size_t>(st + 1)][static_cast<size_t>(a.mb)], st + 1);
    }
    if (blocked != nullptr) *blocked = waited && std::isfinite(t);
    return t;
  };
  auto count = [](const std::vector<bool>& b) {
    int n = 0;
    for (bool x : b) n += x ? 1 : 0;
    return n;
  };
  double now = 0;
  size_t left = 0;
  for (const auto& acts : s) left += acts.size();
  while (left > 0) {
    // Ranks whose next action became ready join the run queue: first those that did not sleep (their data
    // was there, or the dependency is local: they keep their core), then those woken by a receive, which
    // join at once if a core is free (running + queued + background < cores) or wake_latency later.
    std::vector<bool> queued(Pz);
    for (size_t pi = 0; pi < Pz; ++pi) queued[pi] = std::isfinite(queued_at[pi]);
    std::vector<int> woken;
    for (int p = 0; p < P; ++p) {
      const size_t pi = static_cast<size_t>(p);
      if (running[pi] || queued[pi] || next[pi] >= s[pi].size()) continue;
      if (std::isfinite(wake_at[pi])) {
        if (wake_at[pi] <= now + 1e-15) queued_at[pi] = wake_at[pi], queued[pi] = true, wake_at[pi] = kInf;
        continue;
      }
      bool blocked = false;
      const double rt = ready_time(p, &blocked);
      if (rt > now + 1e-15) continue;
      if (blocked && wake_latency > 0) woken.push_back(p);
      else queued_at[pi] = rt, queued[pi] = true;
    }
    for (int p : woken) {
      const size_t pi = static_cast<size_t>(p);
      if (count(running) + count(queued) + background < cores - 1e-12) queued_at[pi] = now, queued[pi] = true;
      else wake_at[pi] = now + wake_latency;
    }
    // Free cores take the longest-waiting ranks (FIFO; ties by rank). A started action runs to its end.
    while (count(running) < slots) {
      int best = -1;
      for (int p = 0; p < P; ++p) {
        const size_t pi = static_cast<size_t>(p);
        if (queued[pi] && (best < 0 || queued_at[pi] < queued_at[static_cast<size_t>(best)] - 1e-15)) best = p;
      }
      if (best < 0) break;
      const size_t bi = static_cast<size_t>(best);
      queued[bi] = false;
      queued_at[bi] = kInf;
      running[bi] = true;
      remaining[bi] = duration(best, s[bi][next[bi]]);
      TRIDENT_CHECK(remaining[bi] >= 0, InvalidArgument, "replay_shared_cores: negative duration for {} on rank {}",
                    parallel::to_string(s[bi][next[bi]]), best);
      r.start[bi][next[bi]] = now;
    }
    // The run's k ready ranks get cores x k / (k + background) of the machine, shared by the running ones.
    const int n_run = count(running), k = n_run + count(queued);
    const double rate = n_run > 0 ? std::min(1.0, cores * k / (k + background) / n_run) : 1.0;
    double t_next = kInf;
    for (int p = 0; p < P; ++p) {
      const size_t pi = static_cast<size_t>(p);
      if (running[pi]) t_next = std::min(t_next, now + remaining[pi] / rate);
      else if (std::isfinite(wake_at[pi])) t_next = std::min(t_next, wake_at[pi]);
      else if (!queued[pi] && next[pi] < s[pi].size()) {
        const double rt = ready_time(p, nullptr);
        if (rt > now) t_next = std::min(t_next, rt);
      }
    }
    if (!std::isfinite(t_next)) {
      std::string stuck;
      for (int p = 0; p < P; ++p)
        if (next[static_cast<size_t>(p)] < s[static_cast<size_t>(p)].size())
          stuck += fmt::format(" rank {} at {}", p, parallel::to_string(s[static_cast<size_t>(p)][next[static_cast<size_t>(p)]]));
      TRIDENT_THROW(InvalidArgument, "replay_shared_cores: the schedule cannot complete; stuck:{}", stuck);
    }
    const double dt = t_next - now;
    now = t_next;
    for (int p = 0; p < P; ++p) {
      const size_t pi = static_cast<size_t>(p);
      if (!running[pi]) continue;
      remaining[pi] -= dt * rate;
      if (remaining[pi] <= 1e-12 * std::max(1.0, now)) {
        const Action& a = s[pi][next[pi]];
        const int st = a.chunk * P + p;
        (a.type == Action::kForward ? fdone : bdone)[static_cast<size_t>(st)][static_cast<size_t>(a.mb)] = now;
        r.finish[pi][next[pi]] = now;
        free_at[pi] = now;
        running[pi] = false;
        ++next[pi];
        --left;
      }
    }
  }
  r.makespan = now;
  r.busy.assign(static_cast<size_t>(P), 0.0);
  r.idle.assign(static_cast<size_t>(P), 0.0);
  double ideal = 0;
  for (int p = 0; p < P; ++p) {
    const size_t pi = static_cast<size_t>(p);
    for (size_t i = 0; i < s[pi].size(); ++i) r.busy[pi] += r.finish[pi][i] - r.start[pi][i];
    r.idle[pi] = r.makespan - r.busy[pi];
    ideal = std::max(ideal, r.busy[pi]);
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - ideal / r.makespan : 0;
  r.bubble_ratio = ideal > 0 ? (r.makespan - ideal) / ideal : 0;
  return r;
}

double background_tasks(double received, int world, double cores) {
  if (received <= 0 || world <= 0 || cores <= 0) return 0.0;
  const double alone = std::min(static_cast<double>(world), cores);
  if (received >= 0.95 * alone) return 0.0;
  // received = world x cores / (world + b)  =>  b = world x cores / received - world.
  return std::max(0.0, world * cores / received - world);
}


MpPrediction predict_model_parallel(const MpPredictionInput& in) {
  const int P = std::max(1, in.pp), v = std::max(1, in.virtual_stages);
  const int m = P > 1 ? std::max(1, in.microbatches) : 1;  // pp = 1: the whole batch is one microbatch
  const auto& cal = in.cal;
  const size_t S = static_cast<size_t>(P) * v;
  TRIDENT_CHECK(cal.forward_s.size() == S && cal.backward_s.size() == S && cal.activation_bytes.size() == S,
                InvalidArgument,
                "predict_model_parallel: the calibration has {} / {} / {} stage entries, the layout pp {} x "
                "virtual stages {} needs {}; calibrate with the same layout",
                cal.forward_s.size(), cal.backward_s.size(), cal.activation_bytes.size(), P, v, S);
  TRIDENT_CHECK(in.pp_rank >= 0 && in.pp_rank < P, InvalidArgument, "predict_model_parallel: pp_rank {} not in [0, {})",
                in.pp_rank, P);
  TRIDENT_CHECK(in.zero_stage == 0 || in.zero_stage == 1, InvalidArgument,
                "predict_model_parallel: zero_stage {} over the DP group; model parallelism runs ddp (0) or zero1 (1)",
                in.zero_stage);
  MpPrediction p;
  p.cores = in.cores;
  const auto kind = P > 1 ? in.schedule : parallel::ScheduleKind::k1F1B;
  const parallel::Schedule sched = parallel::make_schedule(kind, P, m, kind == parallel::ScheduleKind::kInterleaved ? v : 1);
  const double rows = static_cast<double>(in.batch) / m;
  const double act_bytes = rows * in.block * in.hidden * 4;  // one hand-off: B/m x T x C floats
  p.p2p_s = P > 1 ? cal.p2p_latency_s + (cal.p2p_Bps > 0 ? act_bytes / cal.p2p_Bps : 0.0) : 0.0;
  const double p2p = p.p2p_s;
  auto duration = [&](int rank, const parallel::Action& a) {
    const size_t s = static_cast<size_t>(a.chunk) * P + rank;
    return a.type == parallel::Action::kForward ? cal.forward_s[s] : cal.backward_s[s];
  };
  const int replicas = std::max(1, in.tp) * std::max(1, in.dp);
  const double pipeline_cores = in.cores > 0 ? in.cores / replicas : 0.0;
  // Other runnable tasks the calibration saw (reported, and replayed as step_loaded_s; not in step_s: a
  // rank that spins for the probe gets a smaller share of a busy machine than a pipeline rank that sleeps
  // between actions, so the probe overstates the background, 2-3x under heavy load here).
  p.background = in.cores > 0 ? background_tasks(cal.cores_received, in.world, in.cores) : 0.0;
  p.shared_cores = pipeline_cores > 0 && in.world > in.cores + 1e-9;
  // Shared cores: the replay runs each action's processor time (the work itself) x its rank's rehearsal
  // factor (what a real step costs beyond its actions). Without them (older calibrations), the wall times.
  const bool have_cpu = cal.forward_cpu_s.size() == S && cal.backward_cpu_s.size() == S;
  const bool have_factor = cal.rehearsal_factor.size() == static_cast<size_t>(P);
  auto work = [&](int rank, const parallel::Action& a) {
    const double k = have_factor ? cal.rehearsal_factor[static_cast<size_t>(rank)] : 1.0;
    if (!have_cpu) return duration(rank, a) * k;
    const size_t s = static_cast<size_t>(a.chunk) * P + rank;
    return (a.type == parallel::Action::kForward ? cal.forward_cpu_s[s] : cal.backward_cpu_s[s]) * k;
  };
  // Waking a rank that sleeps on a receive when every core is taken costs the loaded hand-off's excess over
  // the idle one.
  p.wake_s = p.shared_cores ? std::max(0.0, cal.handoff_loaded_s - cal.p2p_latency_s) : 0.0;
  parallel::ReplayResult r = p.shared_cores
                                 ? replay_shared_cores(sched, P, v, work, p2p, pipeline_cores, p.wake_s, 0.0)
                                 : parallel::replay(sched, P, v, duration, [&](int, int) { return p2p; });
  double loaded_makespan = r.makespan;
  if (p.background > 0 && pipeline_cores > 0)
    loaded_makespan = replay_shared_cores(sched, P, v, work, p2p, pipeline_cores, p.wake_s, p.background / replicas).makespan;
  p.pipeline_s = r.makespan * in.accum;
  // As the training printout measures it: each rank's idle share of the window, averaged over ranks.
  double idle = 0;
  for (int q = 0; q < P; ++q) idle += r.makespan > 0 ? r.idle[static_cast<size_t>(q)] / r.makespan / P : 0.0;
  p.bubble_fraction = idle;
  p.bubble_theory = bubble_fraction(P, m, v);

  // Memory per rank.
  const double n = static_cast<double>(in.num_params);
  const int D = std::max(1, in.dp);
  const double padded = std::ceil(n / D) * D;
  p.memory_bytes["parameters"] = n * 4;
  p.memory_bytes["gradients"] = n * 4;
  // The trainer's AdamW (m, v of the shard), plus DataParallel's copy over the DP group (ddp: all of it,
  // zero1: this rank's padded/D slice).
  double optimizer = 8 * n;
  if (D > 1) optimizer += in.zero_stage == 0 ? 8 * n : 8 * padded / D;
  p.memory_bytes["optimizer_state"] = optimizer;
  p.memory_bytes["comm_buffers"] = 0;
  std::vector<double> local_bytes(static_cast<size_t>(v));
  for (int c = 0; c < v; ++c) local_bytes[static_cast<size_t>(c)] = cal.activation_bytes[static_cast<size_t>(c) * P + in.pp_rank];
  p.memory_bytes["activations"] =
      schedule_peak_activation_bytes(sched[static_cast<size_t>(in.pp_rank)], local_bytes, &p.inflight);

  // Communication bytes this rank sends per step (bus convention for the collectives).
  const int T = std::max(1, in.tp);
  if (T > 1) {
    // 4 all-reduces per block per microbatch (2 forward, 2 backward) of B/m x T x C floats.
    p.comm_bytes["tp_all_reduce"] = 4.0 * in.local_layers * m * in.accum * bus_bytes(OpKind::kAllReduce, act_bytes, T);
  }
  if (P > 1) {
    int sends = 0;
    for (const auto& a : sched[static_cast<size_t>(in.pp_rank)]) {
      const int s = a.chunk * P + in.pp_rank;
      if (a.type == parallel::Action::kForward ? s < static_cast<int>(S) - 1 : s > 0) ++sends;
    }
    p.comm_bytes["pp_send_recv"] = sends * act_bytes * in.accum;
  }
  if (D > 1) {
    p.comm_bytes["all_reduce"] = bus_bytes(OpKind::kAllReduce, n * 4, D);
    if (in.zero_stage > 0) p.comm_bytes["all_gather"] = bus_bytes(OpKind::kAllGather, padded * 4, D);
  }

  // Time after the pipeline: tied-embedding sum (an all-reduce of 2 ranks at the p2p rate), the DP
  // collectives at the calibrated bus rate (exposed: gradients are final only after the flush), AdamW.
  if (in.tied_params > 0 && P > 1)
    p.tied_sync_s = cal.p2p_latency_s + (cal.p2p_Bps > 0 ? static_cast<double>(in.tied_params) * 4 / cal.p2p_Bps : 0);
  if (D > 1 && cal.dp_allreduce_bus_Bps > 0) {
    for (auto& [k, b] : p.comm_bytes)
      if (k == "all_reduce" || k == "all_gather") p.dp_comm_s += b / cal.dp_allreduce_bus_Bps;
  }
  const double shard = D > 1 && in.zero_stage > 0 ? padded / D : n;
  p.optimizer_s = cal.optimizer_s_per_param * shard;
  p.step_s = p.pipeline_s + p.tied_sync_s + p.dp_comm_s + p.optimizer_s;
  p.step_loaded_s = p.step_s + (loaded_makespan - r.makespan) * in.accum;
  return p;
}

double step_at_cores_used(const MpPredictionInput& in, double cores_used) {
  const MpPrediction base = predict_model_parallel(in);
  if (in.cores <= 0 || cores_used <= 0) return base.step_s;
  // With a core per rank the prediction replays wall times; this check replays processor times on shared
  // cores in every case (equal to the plain replay when nothing is shared).
  const double rest = base.step_s - base.pipeline_s;
  const int P = std::max(1, in.pp), v = std::max(1, in.virtual_stages);
  const int m = P > 1 ? std::max(1, in.microbatches) : 1;
  const auto kind = P > 1 ? in.schedule : parallel::ScheduleKind::k1F1B;
  const parallel::Schedule sched = parallel::make_schedule(kind, P, m, kind == parallel::ScheduleKind::kInterleaved ? v : 1);
  const auto& cal = in.cal;
  const size_t S = static_cast<size_t>(P) * v;
  const bool have_cpu = cal.forward_cpu_s.size() == S && cal.backward_cpu_s.size() == S;
  const bool have_factor = cal.rehearsal_factor.size() == static_cast<size_t>(P);
  auto work = [&](int rank, const parallel::Action& a) {
    const size_t s = static_cast<size_t>(a.chunk) * P + rank;
    const bool f = a.type == parallel::Action::kForward;
    const double k = have_factor ? cal.rehearsal_factor[static_cast<size_t>(rank)] : 1.0;
    return k * (have_cpu ? (f ? cal.forward_cpu_s[s] : cal.backward_cpu_s[s]) : (f ? cal.forward_s[s] : cal.backward_s[s]));
  };
  const int replicas = std::max(1, in.tp) * std::max(1, in.dp);
  const double pipeline_cores = in.cores / replicas;
  double total = 0;
  for (int q = 0; q < P; ++q)
    for (const auto& a : sched[static_cast<size_t>(q)]) total += work(q, a);
  auto makespan = [&](double bg) {
    return replay_shared_cores(sched, P, v, work, base.p2p_s, pipeline_cores, base.wake_s, bg).makespan;
  };
  const double m0 = makespan(0.0), target = cores_used / replicas;
  if (total / m0 <= target) return rest + m0 * in.accum;  // the run got at least what the replay uses alone
  double lo = 0, hi = 1;
  while (total / makespan(hi) > target && hi < 1e4) lo = hi, hi *= 2;
  for (int i = 0; i < 50; ++i) {
    const double mid = 0.5 * (lo + hi);
    (total / makespan(mid) > target ? lo : hi) = mid;
  }
  return rest + makespan(hi) * in.accum;
}

nlohmann::json MpPrediction::to_json() const {
  nlohmann::json j = {{"type", "prediction"},
                      {"model_parallel", true},
                      {"step_s", step_s},
                      {"pipeline_s", pipeline_s},
                      {"bubble_fraction", bubble_fraction},
                      {"bubble_theory", bubble_theory},
                      {"p2p_s", p2p_s},
                      {"tied_sync_s", tied_sync_s},
                      {"dp_comm_s", dp_comm_s},
                      {"optimizer_s", optimizer_s},
                      {"inflight_microbatches", inflight},
                      {"shared_cores", shared_cores},
                      {"background_tasks", background},
                      {"step_loaded_s", step_loaded_s},
                      {"wake_s", wake_s},
                      {"memory_bytes_total", memory_total()},
                      {"persistent_bytes", persistent_bytes()},
                      {"peak_rss_bytes", peak_rss}};
  for (auto& [k, val] : memory_bytes) j["memory_bytes"][k] = val;
  j["comm_bytes"] = nlohmann::json::object();
  for (auto& [k, val] : comm_bytes) j["comm_bytes"][k] = val;
  return j;
}

std::string MpPrediction::summary() const {
  double comm = 0;
  for (auto& [k, val] : comm_bytes) comm += val;
  return fmt::format(
      "step {:.1f} ms (pipeline {:.1f}{} with bubble {:.1f}% [uniform theory {:.1f}%], hand-off {:.2f}, tied sum "
      "{:.2f}, DP comm {:.1f}, optimizer {:.1f}), memory {:.2f} MB (parameters {:.2f}, gradients {:.2f}, "
      "optimizer {:.2f}, activations {:.2f} = {} microbatch(es) in flight), comm per step {:.2f} MB, peak RSS "
      "{:.2f} MB",
      step_s * 1e3, pipeline_s * 1e3,
      shared_cores ? fmt::format(" on {:g} shared cores [wake-up {:.2f} ms; calibration saw {:.1f} other task(s): "
                                 "{:.1f} ms with them]",
                                 cores, wake_s * 1e3, background, step_loaded_s * 1e3)
                   : std::string(), 100 * bubble_fraction, 100 * bubble_theory, p2p_s * 1e3, tied_sync_s * 1e3,
      dp_comm_s * 1e3, optimizer_s * 1e3, memory_total() / 1e6, memory_bytes.at("parameters") / 1e6,
      memory_bytes.at("gradients") / 1e6, memory_bytes.at("optimizer_state") / 1e6,
      memory_bytes.at("activations") / 1e6, inflight, comm / 1e6, peak_rss / 1e6);
}

double rss_growth(const PredictionInput& in, const Prediction& p) {
  const auto& mb = p.memory_bytes;
  const int N = std::max(1, in.world);
  double grow = mb.at("activations") + (N > 1 ? mb.at("optimizer_state") + mb.at("comm_buffers") : 0.0);
  const double padded = std::ceil(static_cast<double>(in.num_params) / N) * N;
  const bool zero1_in_place = in.zero_stage == 1 && padded == static_cast<double>(in.num_params);
  if (N > 1 && in.zero_stage > 0 && !zero1_in_place) {
    // ZeRO's step stages its shard and the gathered flat buffer (padded x (1 + 1/N) floats) each step
    // (zero1 gathers in place when the flat buffer is a multiple of N long).
    grow += (padded + padded / N) * 4;
  }
  return grow;
}

double rss_growth(const MpPredictionInput& in, const MpPrediction& p) {
  // DataParallel's moments over the DP group: the optimizer state beyond the trainer's own AdamW (8 bytes a
  // parameter), not yet built when the resident size is read.
  const double dp_optimizer =
      in.dp > 1 ? p.memory_bytes.at("optimizer_state") - 8.0 * static_cast<double>(in.num_params) : 0.0;
  return p.memory_bytes.at("activations") + dp_optimizer;
}

}  // namespace trident::plan
