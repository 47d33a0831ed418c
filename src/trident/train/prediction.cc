#include "trident/train/prediction.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/types.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/plan/comm_cost.h"

namespace trident::train {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// AdamW + squared norm per parameter, timed on a slice of at most 128K elements of scratch memory (2 MB,
// small beside the model; not the model's own buffers: its state must not change). One warm-up, then the
// mean of two; `group` (optional): a barrier before timing, so every rank times it at the same moment.
double adamw_seconds_per_param(size_t num_params, ProcessGroup* group) {
  const size_t slice = std::min<size_t>(std::max<size_t>(num_params, 1), size_t{1} << 17);
  std::vector<float> p(slice, 0.01f), g(slice, 0.001f), m(slice, 0.0f), v(slice, 0.0f);
  kernels::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), slice, 1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 1);
  if (group != nullptr) group->barrier();
  const auto t0 = Clock::now();
  for (int k = 0; k < 2; ++k) {
    kernels::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), slice, 1e-3f, 0.9f, 0.99f, 1e-8f, 0.1f, 2 + k);
    volatile double sq = kernels::cpu::sum_squares(g.data(), slice);
    (void)sq;
  }
  return since(t0) / 2 / static_cast<double>(slice);
}
// Bus rate of an in-place all-reduce (avg) of `n` float32 gradients over `group` (collective): the faster of
// two, each after a barrier; every rank agrees on the slowest rank's view. Bytes per rank under nccl-tests'
// convention (plan/comm_cost.h) over the time. The gradients are averaged in place (callers zero them).
double allreduce_bus_Bps(ProcessGroup& group, float* grads, size_t n) {
  double best = 1e30;
  for (int k = 0; k < 2; ++k) {
    group.barrier();
    const auto t0 = Clock::now();
    group.all_reduce(grads, n, DType::kFloat32, ReduceOp::kAvg);
    best = std::min(best, since(t0));
  }
  group.all_reduce(&best, 1, DType::kFloat64, ReduceOp::kMax);
  return bus_bytes(OpKind::kAllReduce, static_cast<double>(n) * 4, group.size()) / best;
}
}  // namespace

plan::Calibration calibrate(nn::Model& model, int batch, int block, int vocab, ProcessGroup* pg) {
  plan::Calibration c;
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

  c.optimizer_s_per_param = adamw_seconds_per_param(model.num_params(), nullptr);

  if (pg != nullptr && pg->size() > 1) {
    c.allreduce_bus_Bps = allreduce_bus_Bps(*pg, model.grad_data(), model.num_params());
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


double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}


plan::StageCalibration calibrate_model_parallel(parallel::ParallelModel& pm, const parallel::DeviceMesh& mesh, int rows,
                                          int block, int vocab, int cores, const std::function<void()>& rehearse,
                                          int microbatches) {
  const auto cal_t0 = Clock::now();
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  plan::StageCalibration c;
  ProcessGroup& world = *mesh.world();
  const int P = mesh.pp_size(), v = pm.num_chunks(), p = mesh.pp_rank();
  const size_t S = static_cast<size_t>(P) * v;
  c.forward_s.assign(S, 0.0);
  c.backward_s.assign(S, 0.0);
  c.activation_bytes.assign(S, 0.0);
  c.forward_cpu_s.assign(S, 0.0);
  c.backward_cpu_s.assign(S, 0.0);
  const size_t tokens = static_cast<size_t>(rows) * block;
  std::vector<int32_t> x(tokens), y(tokens);
  std::mt19937 rng(12345);  // the same tokens on every rank (TP ranks must agree)
  for (size_t i = 0; i < tokens; ++i) {
    x[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    y[i] = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  for (int ch = 0; ch < v; ++ch) {
    parallel::Stage& st = pm.chunk(ch);
    const size_t numel = st.activation_numel(rows, block);
    std::vector<float> in(numel), out(numel), dout(numel), din(numel);
    for (size_t i = 0; i < numel; ++i) {
      in[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
      dout[i] = 1e-4f * static_cast<float>(static_cast<int>(i % 89) - 44);
    }
    const float* inp = st.is_first() ? nullptr : in.data();
    float* outp = st.is_last() ? nullptr : out.data();
    const float* doutp = st.is_last() ? nullptr : dout.data();
    float* dinp = st.is_first() ? nullptr : din.data();
    // Rounds of kInFlight forwards then their backwards (several microbatches' activations live at once, as
    // in the pipeline); round 0 warms up; the MEDIAN of the other rounds' actions is the calibrated time
    // (millisecond actions: the minimum is optimistic, the mean hostage to one preemption).
    constexpr int kInFlight = 2, kRounds = 9;
    std::vector<double> tf, tb, cf, cb;
    for (int k = 0; k < kRounds; ++k) {
      world.barrier();  // every rank computes at the same moment: timed under the run's contention
      const size_t before = st.activation_bytes();
      for (int mb = 0; mb < kInFlight; ++mb) {
        const double c0 = process_cpu_seconds();
        auto t0 = Clock::now();
        st.forward(mb, x.data(), y.data(), inp, outp, rows, block, 1.0f, true);
        if (k > 0) tf.push_back(since(t0)), cf.push_back(process_cpu_seconds() - c0);
      }
      c.activation_bytes[static_cast<size_t>(ch) * P + p] =
          static_cast<double>(st.activation_bytes() - before) / kInFlight;
      for (int mb = 0; mb < kInFlight; ++mb) {
        const double c0 = process_cpu_seconds();
        auto t0 = Clock::now();
        st.backward(mb, doutp, dinp);
        if (k > 0) tb.push_back(since(t0)), cb.push_back(process_cpu_seconds() - c0);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    c.forward_s[static_cast<size_t>(ch) * P + p] = median(tf);
    c.backward_s[static_cast<size_t>(ch) * P + p] = median(tb);
    c.forward_cpu_s[static_cast<size_t>(ch) * P + p] = median(cf);
    c.backward_cpu_s[static_cast<size_t>(ch) * P + p] = median(cb);
  }
  // The cores this run gets: every rank computes over the same kWindow of wall time (3 windows; rank 0 names
  // the start on the host's monotonic clock, which every process reads alike); the world's sum of CPU /
  // kWindow is the cores its ranks received (one host). Median of 3.
  if (world.size() > 1) {
    constexpr double kWindow = 0.010;
    std::vector<double> got;
    for (int k = 0; k < 3; ++k) {
      double start = std::chrono::duration<double>(Clock::now().time_since_epoch()).count() + 0.003;
      world.broadcast(&start, 1, DType::kFloat64, 0);
      const auto t_start = Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(start)));
      const auto t_end = t_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kWindow));
      std::this_thread::sleep_until(t_start);
      const double c0 = process_cpu_seconds();
      volatile double sink = 1.0;
      while (Clock::now() < t_end)
        for (int i = 0; i < 2000; ++i) sink = sink * 1.0000001 + 1e-9;
      double share = (process_cpu_seconds() - c0) / kWindow;
      world.all_reduce(&share, 1, DType::kFloat64, ReduceOp::kSum);
      got.push_back(share);
    }
    std::sort(got.begin(), got.end());
    c.cores_received = got[1];
  }
  c.optimizer_s_per_param = adamw_seconds_per_param(pm.num_params(), &world);

  // Pipeline hand-off: pipeline ranks pair up (2k, 2k+1; all pairs at once) and ping-pong one activation;
  // a hand-off is half the round trip. Latency from a 1-float ping-pong. One message is in flight at a
  // time, so this times one hand-off alone, as the replay charges one on each dependency between ranks.
  if (P > 1) {
    auto pg = mesh.pp_group();
    const size_t numel = pm.chunk(0).activation_numel(rows, block);
    std::vector<float> buf(numel, 1.0f);
    const bool even = p % 2 == 0;
    const int peer = even ? p + 1 : p - 1;
    const bool paired = peer >= 0 && peer < P;
    auto pingpong = [&](size_t count) {
      double best = 1e30;
      for (int k = 0; k < 4; ++k) {
        pg->barrier();
        auto t = Clock::now();
        if (paired && even) {
          pg->send(buf.data(), count, DType::kFloat32, peer, 7001);
          pg->recv(buf.data(), count, DType::kFloat32, peer, 7002);
        } else if (paired) {
          pg->recv(buf.data(), count, DType::kFloat32, peer, 7001);
          pg->send(buf.data(), count, DType::kFloat32, peer, 7002);
        }
        if (k > 0 && paired) best = std::min(best, since(t) / 2);
      }
      if (!paired) best = 0;
      pg->all_reduce(&best, 1, DType::kFloat64, ReduceOp::kMax);
      return best;
    };
    const double t_small = pingpong(1), t_big = pingpong(numel);
    c.p2p_latency_s = t_small;
    c.p2p_Bps = t_big > t_small ? static_cast<double>(numel) * 4 / (t_big - t_small) : 0.0;
  }
  // Ranks outnumber cores: a hand-off to a rank asleep on its receive while the other ranks compute (it must
  // get a core back). Pipeline ranks 0 and 1 of the first replica ping-pong 1 float for kPing of wall time
  // (then send a stop value); every other rank computes for kPing + kMargin. One-way = elapsed / (2 x round
  // trips). Mean, not a median: every hand-off of the run pays its share of the slow ones.
  if (P > 1 && world.size() > cores) {
    constexpr double kPing = 0.024, kMargin = 0.006;
    auto pg = mesh.pp_group();
    const bool pinger = mesh.tp_rank() == 0 && mesh.dp_rank() == 0 && p <= 1;
    double one_way = 0;
    world.barrier();
    const auto w0 = Clock::now();
    if (pinger) {
      float msg = 1.0f;
      int trips = 0;
      for (;;) {
        if (p == 0) {
          msg = since(w0) < kPing ? 1.0f : 0.0f;
          pg->send(&msg, 1, DType::kFloat32, 1, 7003);
          if (msg == 0.0f) break;
          pg->recv(&msg, 1, DType::kFloat32, 1, 7004);
          ++trips;
        } else {
          pg->recv(&msg, 1, DType::kFloat32, 0, 7003);
          if (msg == 0.0f) break;
          pg->send(&msg, 1, DType::kFloat32, 0, 7004);
        }
      }
      if (p == 0 && trips > 0) one_way = since(w0) / (2.0 * trips);
    } else {
      volatile double sink = 1.0;
      while (since(w0) < kPing + kMargin)
        for (int i = 0; i < 2000; ++i) sink = sink * 1.0000001 + 1e-9;
    }
    world.all_reduce(&one_way, 1, DType::kFloat64, ReduceOp::kMax);
    c.handoff_loaded_s = one_way;
  }
  // Rehearsal: real steps of the schedule, this rank's processor time per step over its actions' sum.
  if (rehearse) {
    world.barrier();
    rehearse();  // warm-up (buffers, first touch)
    constexpr int kSteps = 3;
    world.barrier();
    const double c0 = process_cpu_seconds();
    const auto w0 = Clock::now();
    for (int k = 0; k < kSteps; ++k) rehearse();
    const double cpu = (process_cpu_seconds() - c0) / kSteps;
    c.rehearsal_wall_s = since(w0) / kSteps;
    double actions = 0;  // this rank's actions in one step: every chunk's forward and backward of m microbatches
    for (int ch = 0; ch < v; ++ch) {
      const size_t st = static_cast<size_t>(ch) * P + p;
      actions += std::max(1, microbatches) * (c.forward_cpu_s[st] + c.backward_cpu_s[st]);
    }
    c.rehearsal_factor.assign(static_cast<size_t>(P), 0.0);
    c.rehearsal_factor[static_cast<size_t>(p)] = actions > 0 ? std::max(1.0, cpu / actions) : 1.0;
    world.all_reduce(&c.rehearsal_wall_s, 1, DType::kFloat64, ReduceOp::kMax);
    pm.zero_grad();
  }
  if (mesh.dp_size() > 1) {
    c.dp_allreduce_bus_Bps = allreduce_bus_Bps(*mesh.dp_group(), pm.grad_data(), pm.num_params());
  }
  pm.zero_grad();
  for (int ch = 0; ch < v; ++ch) pm.chunk(ch).reset_peak();

  // Every rank gets every stage's figures: the slowest replica of each (TP ranks and DP replicas).
  world.all_reduce(c.forward_s.data(), S, DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(c.backward_s.data(), S, DType::kFloat64, ReduceOp::kMax);
  if (!c.rehearsal_factor.empty())
    world.all_reduce(c.rehearsal_factor.data(), c.rehearsal_factor.size(), DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(c.forward_cpu_s.data(), S, DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(c.backward_cpu_s.data(), S, DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(c.activation_bytes.data(), S, DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(&c.optimizer_s_per_param, 1, DType::kFloat64, ReduceOp::kMax);
  world.all_reduce(&c.p2p_latency_s, 1, DType::kFloat64, ReduceOp::kMax);
  c.seconds = since(cal_t0);
  return c;
}

void mean_chunk_times(const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                      int chunks, std::vector<double>* forward_s, std::vector<double>* backward_s) {
  std::vector<double> sf(static_cast<size_t>(chunks), 0.0), sb(sf);
  std::vector<int> nf(static_cast<size_t>(chunks), 0), nb(nf);
  for (const auto& sp : spans) {
    if (sp.kind != SpanKind::kCompute || sp.chunk < 0 || sp.chunk >= chunks) continue;
    const bool f = sp.name == "forward", b = sp.name == "backward";
    if (!f && !b) continue;
    bool inside = false;
    for (auto [a, e] : windows)
      if (sp.t0_ns >= a && sp.t1_ns <= e) inside = true;
    if (!inside) continue;
    const double d = static_cast<double>(sp.t1_ns - sp.t0_ns) * 1e-9;
    const size_t c = static_cast<size_t>(sp.chunk);
    if (f) sf[c] += d, ++nf[c];
    else sb[c] += d, ++nb[c];
  }
  forward_s->assign(static_cast<size_t>(chunks), 0.0);
  backward_s->assign(static_cast<size_t>(chunks), 0.0);
  for (size_t c = 0; c < sf.size(); ++c) {
    if (nf[c] > 0) (*forward_s)[c] = sf[c] / nf[c];
    if (nb[c] > 0) (*backward_s)[c] = sb[c] / nb[c];
  }
}

}  // namespace trident::train
