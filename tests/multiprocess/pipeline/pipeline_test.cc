// The pipeline engine against one process: a toy model (toy_stage.h) split into P x v virtual stages and
// run by PipelineEngine at P = 1, 2, 3, 4 under every schedule and m in {1, 2, 4, 8} (interleaved with v = 2
// where m % P == 0; m in {3, 6} too at P = 3) gives the loss and every parameter gradient of the unsplit
// model run on the whole batch in one process (1e-5 relative); forward-only returns the same loss; the
// point-to-point transfers are exactly one per microbatch per boundary and direction, of B/m x T x width
// floats; activation memory follows the schedule (1F1B min(m, P) microbatches on the first stage, GPipe m);
// a Chrome trace gathers both ranks; a failing or dying rank makes every other rank fail instead of hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "harness/multiproc.h"
#include "harness/temp_dir.h"
#include "toy_stage.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/parallel/pipeline.h"
#include "trident/parallel/profile.h"

namespace trident::parallel {
namespace {

using testing::ToyConfig;
using testing::ToyStage;

constexpr int kB = 24, kT = 3;
const ToyConfig kCfg{};

void make_batch(std::vector<int32_t>* x, std::vector<int32_t>* y) {
  x->resize(kB * kT);
  y->resize(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    (*x)[i] = static_cast<int32_t>(testing::toy_mix(i * 2 + 1) % kCfg.vocab);
    (*y)[i] = static_cast<int32_t>(testing::toy_mix(i * 2 + 2) % kCfg.vocab);
  }
}

struct Reference {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

// The unsplit model, whole batch, one process.
Reference reference() {
  std::vector<int32_t> x, y;
  make_batch(&x, &y);
  ToyStage full(kCfg, 0, kCfg.layers, true, true);
  Reference r;
  r.loss = full.forward(0, x.data(), y.data(), nullptr, nullptr, kB, kT, 1.0f, true);
  full.backward(0, nullptr, nullptr);
  r.grads = full.grads();
  return r;
}

struct Case {
  ScheduleKind kind;
  int m, v;
};

std::vector<Case> cases_for(int P) {
  std::vector<Case> out;
  for (int m : {1, 2, 4, 8}) {
    out.push_back({ScheduleKind::kGPipe, m, 1});
    out.push_back({ScheduleKind::k1F1B, m, 1});
  }
  for (int m : {1, 2, 3, 4, 6, 8}) {
    bool usual = m == 1 || m == 2 || m == 4 || m == 8;
    if (m % P == 0 && (usual || P == 3)) out.push_back({ScheduleKind::kInterleaved, m, 2});
  }
  return out;
}

std::string describe(const Case& c, int P) {
  return fmt::format("{} P={} m={} v={}", schedule_name(c.kind), P, c.m, c.v);
}

// Chunk c of rank p: virtual stage c*P + p, layers [s*L/S, (s+1)*L/S).
std::vector<std::unique_ptr<ToyStage>> make_chunks(int rank, int P, int v) {
  std::vector<std::unique_ptr<ToyStage>> out;
  const int S = P * v, L = kCfg.layers;
  for (int c = 0; c < v; ++c) {
    int s = c * P + rank;
    out.push_back(std::make_unique<ToyStage>(kCfg, s * L / S, (s + 1) * L / S, s == 0, s == S - 1));
  }
  return out;
}

// |got - factor*ref| <= 1e-5 * factor * max|ref| per tensor, for every gradient this rank holds.
void check_grads(const std::vector<std::unique_ptr<ToyStage>>& chunks, const Reference& ref, double factor,
                 const std::string& what) {
  for (const auto& ch : chunks)
    for (const auto& [name, g] : ch->grads()) {
      const auto& r = ref.grads.at(name);
      TRIDENT_RANK_CHECK(g.size() == r.size(), "{}: {} has {} elements, reference {}", what, name, g.size(), r.size());
      double mx = 0, err = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        mx = std::max(mx, std::abs(factor * r[i]));
        err = std::max(err, std::abs(g[i] - factor * r[i]));
      }
      TRIDENT_RANK_CHECK(mx > 0, "{}: reference gradient of {} is zero", what, name);
      TRIDENT_RANK_CHECK(err <= 1e-5 * mx, "{}: gradient {} differs by {:.3g} (max |ref| {:.3g})", what, name, err, mx);
    }
}

// The transfers this rank must record: one per action that crosses ranks, of rows*T*width floats.
using Transfer = std::tuple<std::string, int, int, double>;  // name, chunk, mb, bytes
std::multiset<Transfer> expected_transfers(const std::vector<Action>& actions, int rank, int P, int v, int m) {
  std::multiset<Transfer> out;
  if (P == 1) return out;
  const int S = P * v;
  const double bytes = static_cast<double>(kB / m) * kT * kCfg.width * sizeof(float);
  for (const Action& a : actions) {
    int s = a.chunk * P + rank;
    if (a.type == Action::kForward) {
      if (s > 0) out.insert({"recv_act", a.chunk, a.mb, bytes});
      if (s < S - 1) out.insert({"send_act", a.chunk, a.mb, bytes});
    } else {
      if (s < S - 1) out.insert({"recv_grad", a.chunk, a.mb, bytes});
      if (s > 0) out.insert({"send_grad", a.chunk, a.mb, bytes});
    }
  }
  return out;
}

std::multiset<Transfer> recorded_transfers(const std::vector<Span>& spans) {
  std::multiset<Transfer> out;
  for (const Span& s : spans)
    if (s.kind == SpanKind::kComm) out.insert({s.name, s.chunk, s.microbatch, s.bytes});
  return out;
}

void check_case(const std::shared_ptr<ProcessGroup>& pg, int rank, int P, const Case& c, const Reference& ref) {
  const std::string what = describe(c, P) + fmt::format(" rank {}", rank);
  std::vector<int32_t> x, y;
  make_batch(&x, &y);
  auto chunks = make_chunks(rank, P, c.v);
  std::vector<Stage*> ptrs;
  for (auto& ch : chunks) ptrs.push_back(ch.get());
  PipelineEngine engine(ptrs, pg, {c.kind, c.m, c.v});
  const int S = P * c.v;

  // Step 1: loss and gradients of the whole batch.
  timeline().clear();
  timeline().enable(true);
  double loss = engine.run(x.data(), y.data(), kB, kT, true, 1.0f);
  timeline().enable(false);
  TRIDENT_RANK_CHECK(std::abs(loss - ref.loss) <= 1e-5 * ref.loss, "{}: loss {} vs reference {}", what, loss, ref.loss);
  check_grads(chunks, ref, 1.0, what);
  for (auto& ch : chunks)
    TRIDENT_RANK_CHECK(ch->saved_microbatches() == 0, "{}: {} microbatches still saved", what,
                       ch->saved_microbatches());

  // Transfers: exactly the expected set, each of B/m x T x width floats.
  const auto spans = timeline().spans();
  auto want = expected_transfers(engine.schedule()[rank], rank, P, c.v, c.m);
  auto got = recorded_transfers(spans);
  TRIDENT_RANK_CHECK(got == want, "{}: recorded {} transfers, expected {}", what, got.size(), want.size());
  TRIDENT_RANK_CHECK(engine.last_stats().sends + engine.last_stats().recvs == static_cast<int>(want.size()),
                     "{}: stats count {} + {} transfers, expected {}", what, engine.last_stats().sends,
                     engine.last_stats().recvs, want.size());
  int computes = 0;
  for (const Span& s : spans)
    if (s.kind == SpanKind::kCompute) ++computes;
  TRIDENT_RANK_CHECK(computes == 2 * c.m * c.v, "{}: {} compute spans, expected {}", what, computes, 2 * c.m * c.v);

  // Activation memory of each chunk follows the schedule; on the first stage 1F1B holds min(m, P), GPipe m.
  for (int ci = 0; ci < c.v; ++ci) {
    size_t per = chunks[ci]->saved_bytes_per_microbatch(kB / c.m, kT);
    int in_flight = max_in_flight(engine.schedule()[rank], ci);
    TRIDENT_RANK_CHECK(chunks[ci]->peak_activation_bytes() == in_flight * per,
                       "{}: chunk {} peak activations {} bytes, schedule predicts {} x {}", what, ci,
                       chunks[ci]->peak_activation_bytes(), in_flight, per);
    if (rank == 0 && ci == 0 && c.kind != ScheduleKind::kInterleaved) {
      int expect = c.kind == ScheduleKind::k1F1B ? std::min(c.m, P) : c.m;
      TRIDENT_RANK_CHECK(chunks[0]->peak_activation_bytes() == expect * per,
                         "{}: first stage held {} bytes of activations, expected {} microbatches of {}", what,
                         chunks[0]->peak_activation_bytes(), expect, per);
    }
  }

  // Step 2 without zeroing, loss_scale 2: gradients accumulate to 3x the reference.
  double loss2 = engine.run(x.data(), y.data(), kB, kT, true, 2.0f);
  TRIDENT_RANK_CHECK(loss2 == loss, "{}: second step loss {} vs first {}", what, loss2, loss);
  check_grads(chunks, ref, 3.0, what + " (accumulated, scale 2)");

  // Forward only: same loss, no gradients, nothing saved.
  for (auto& ch : chunks) ch->zero_grad();
  double eval = engine.run(x.data(), y.data(), kB, kT, false);
  TRIDENT_RANK_CHECK(eval == loss, "{}: forward-only loss {} vs training loss {}", what, eval, loss);
  for (auto& ch : chunks) {
    TRIDENT_RANK_CHECK(ch->saved_microbatches() == 0, "{}: forward-only saved activations", what);
    for (const auto& [name, g] : ch->grads())
      for (double v : g) TRIDENT_RANK_CHECK(v == 0, "{}: forward-only changed gradient {}", what, name);
  }
  (void)S;
}

std::shared_ptr<ProcessGroup> make_pg(std::shared_ptr<Store> store, int rank, int size, double timeout_s = 30) {
  GroupOptions o;
  o.timeout = Seconds(timeout_s);
  o.name = "pp";
  return new_process_group(std::move(store), rank, size, o);
}

class PipelineMatchesReference : public ::testing::TestWithParam<int> {};

TEST_P(PipelineMatchesReference, AllSchedules) {
  const int P = GetParam();
  auto res = testing::run_processes(P, [P](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size);
    const Reference ref = reference();
    for (const Case& c : cases_for(P)) check_case(pg, rank, P, c, ref);
  }, testing::RunOptions{.deadline_s = 120, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(P, PipelineMatchesReference, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "P" + std::to_string(info.param); });

TEST(Pipeline, SingleRankWithoutGroupAndArgumentErrors) {
  std::vector<int32_t> x, y;
  make_batch(&x, &y);
  const Reference ref = reference();
  auto chunks = make_chunks(0, 1, 1);
  PipelineEngine e({chunks[0].get()}, nullptr, {ScheduleKind::k1F1B, 4, 1});
  double loss = e.run(x.data(), y.data(), kB, kT, true);
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
  try {
    PipelineEngine bad({chunks[0].get()}, nullptr, {ScheduleKind::k1F1B, 5, 1});
    bad.run(x.data(), y.data(), kB, kT, true);
    FAIL() << "B % m != 0 accepted";
  } catch (const InvalidArgument& err) {
    EXPECT_CONTAINS(err.what(), "24 rows");
    EXPECT_CONTAINS(err.what(), "5 microbatches");
  }
  // Wrong number of chunks; a middle stage that claims to be first.
  EXPECT_THROW(PipelineEngine({chunks[0].get()}, nullptr, {ScheduleKind::kInterleaved, 4, 2}), InvalidArgument);
  ToyStage middle(kCfg, 0, 4, false, true);
  EXPECT_THROW(PipelineEngine({&middle}, nullptr, {ScheduleKind::kGPipe, 2, 1}), InvalidArgument);
  EXPECT_THROW(PipelineEngine({chunks[0].get()}, nullptr, {ScheduleKind::kGPipe, 2, 2}), InvalidArgument);
}

// P = 2: the trace of one step holds both ranks' compute and comm events, and parses as JSON; the summary
// accounts for every rank.
TEST(Pipeline, ChromeTraceOfBothRanks) {
  testing::TempDir dir("pptrace");
  const std::string path = (dir.path / "trace.json").string();
  auto res = testing::run_processes(2, [path](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size);
    std::vector<int32_t> x, y;
    make_batch(&x, &y);
    auto chunks = make_chunks(rank, 2, 1);
    PipelineEngine e({chunks[0].get()}, pg, {ScheduleKind::k1F1B, 4, 1});
    timeline().clear();
    timeline().enable(true);
    int64_t t0 = Timeline::now_ns();
    e.run(x.data(), y.data(), kB, kT, true);
    int64_t t1 = Timeline::now_ns();
    timeline().enable(false);
    write_chrome_trace(*pg, path, t0);
    auto summary = summarize(*pg, timeline().spans(), t0, t1);
    if (rank != 0) {
      TRIDENT_RANK_CHECK(summary.is_null(), "rank {} got a summary", rank);
      return;
    }
    TRIDENT_RANK_CHECK(summary["ranks"].size() == 2, "summary has {} ranks", summary["ranks"].size());
    for (const auto& r : summary["ranks"]) {
      double b = r["bubble_fraction"].get<double>();
      TRIDENT_RANK_CHECK(b >= 0 && b < 1, "bubble fraction {} out of range", b);
      TRIDENT_RANK_CHECK(r["compute_s"].get<double>() > 0, "no compute time on rank {}", r["rank"].get<int>());
      TRIDENT_RANK_CHECK(r["comm_bytes"].get<double>() == 8 * (kB / 4) * kT * kCfg.width * 4.0,
                         "rank {} moved {} bytes", r["rank"].get<int>(), r["comm_bytes"].get<double>());
    }
    TRIDENT_RANK_CHECK(!format_summary(summary).empty(), "empty summary text");
    std::ifstream f(path);
    nlohmann::json j = nlohmann::json::parse(f);
    std::map<int, std::map<std::string, int>> names;  // pid -> base name -> X events
    for (const auto& ev : j.at("traceEvents")) {
      if (ev.at("ph") != "X") continue;
      std::string n = ev.at("name").get<std::string>();
      n = n.substr(0, n.find(' '));
      names[ev.at("pid").get<int>()][n]++;
      TRIDENT_RANK_CHECK(ev.at("dur").get<double>() >= 0 && ev.contains("ts"), "bad event {}", ev.dump());
      TRIDENT_RANK_CHECK(ev.at("args").contains("mb"), "event without microbatch: {}", ev.dump());
    }
    TRIDENT_RANK_CHECK(names.size() == 2, "trace has {} ranks", names.size());
    for (int r = 0; r < 2; ++r) {
      TRIDENT_RANK_CHECK(names[r]["forward"] == 4 && names[r]["backward"] == 4, "rank {}: {} fwd, {} bwd", r,
                         names[r]["forward"], names[r]["backward"]);
      TRIDENT_RANK_CHECK(names[r][r == 0 ? "send_act" : "recv_act"] == 4, "rank {} activation transfers", r);
      TRIDENT_RANK_CHECK(names[r][r == 0 ? "recv_grad" : "send_grad"] == 4, "rank {} gradient transfers", r);
    }
  }, testing::RunOptions{.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

// A rank whose stage throws mid-schedule: it reports its own error, every other rank fails with an error
// (none hangs, none returns normally) and well before the group's 20 s timeout.
TEST(Pipeline, FailingRankFailsEveryRank) {
  for (bool die : {false, true}) {
    SCOPED_TRACE(die ? "rank exits" : "rank throws");
    auto res = testing::run_processes(3, [die](int rank, int size, std::shared_ptr<Store> store) {
      auto pg = make_pg(store, rank, size, 20);
      std::vector<int32_t> x, y;
      make_batch(&x, &y);
      auto chunks = make_chunks(rank, 3, 1);
      if (rank == 1) (die ? chunks[0]->exit_at_mb : chunks[0]->throw_at_mb) = 2;
      PipelineEngine e({chunks[0].get()}, pg, {ScheduleKind::k1F1B, 4, 1});
      auto start = std::chrono::steady_clock::now();
      try {
        e.run(x.data(), y.data(), kB, kT, true);
        testing::rank_fail("the step succeeded although rank 1 failed");
      } catch (const std::exception& err) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::string w = err.what();
        if (rank == 1) TRIDENT_RANK_CHECK(w.find("injected failure") != std::string::npos, "rank 1: {}", w);
        else TRIDENT_RANK_CHECK(dynamic_cast<const NetworkError*>(&err) != nullptr, "rank {}: not a NetworkError: {}",
                                rank, w);
        TRIDENT_RANK_CHECK(dynamic_cast<const TimeoutError*>(&err) == nullptr, "rank {} timed out instead: {}", rank, w);
        (void)s;
      }
      // The engine refuses further steps.
      try {
        e.run(x.data(), y.data(), kB, kT, true);
        testing::rank_fail("a failed engine ran another step");
      } catch (const InvalidArgument&) {
      }
    }, testing::RunOptions{.deadline_s = 60, .env = {}});
    ASSERT_EQ(res.size(), 3u);
    EXPECT_TRUE(res[0].ok) << testing::failures(res);
    EXPECT_TRUE(res[2].ok) << testing::failures(res);
    if (die) EXPECT_EQ(res[1].exit_code, 3) << testing::failures(res);
    else EXPECT_TRUE(res[1].ok) << testing::failures(res);
  }
}

// A rank that stalls past the group's 1 s timeout: its neighbour times out (TimeoutError naming the group),
// and the stalled rank fails too when it resumes (the groups are aborted) instead of waiting forever.
TEST(Pipeline, StalledRankTimesOutEveryRank) {
  auto res = testing::run_processes(2, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = make_pg(store, rank, size, 1.0);
    std::vector<int32_t> x, y;
    make_batch(&x, &y);
    auto chunks = make_chunks(rank, 2, 1);
    if (rank == 1) {
      chunks[0]->stall_at_mb = 1;
      chunks[0]->stall_s = 3.0;
    }
    PipelineEngine e({chunks[0].get()}, pg, {ScheduleKind::k1F1B, 4, 1});
    try {
      e.run(x.data(), y.data(), kB, kT, true);
      testing::rank_fail("the step succeeded although rank 1 stalled past the timeout");
    } catch (const NetworkError& err) {
      std::string w = err.what();
      if (rank == 0)
        TRIDENT_RANK_CHECK(dynamic_cast<const TimeoutError*>(&err) != nullptr && w.find("group 'pp'") != std::string::npos &&
                               w.find("recv(") != std::string::npos,
                           "rank 0: expected a receive's timeout in group 'pp': {}", w);
    }
  }, testing::RunOptions{.deadline_s = 60, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident::parallel

// Not a test (timings assert nothing): measures the wall-clock bubble at P = 2 and 4 with a toy model sized
// so that compute dominates, next to the replay of the measured per-action times (the meaningful figure when
// ranks outnumber cores) and the closed form (P-1)/(m+P-1). Run with --gtest_also_run_disabled_tests
// --gtest_filter='*MeasureBubble*'.
namespace trident::parallel {
namespace {
TEST(PipelineBubble, DISABLED_MeasureBubble) {
  struct M {
    int P;
    ScheduleKind kind;
    int m, v;
  };
  std::vector<M> cases;
  for (int P : {2, 4}) {
    for (int m : {1, 2, 4, 8}) cases.push_back({P, ScheduleKind::kGPipe, m, 1});
    for (int m : {1, 2, 4, 8}) cases.push_back({P, ScheduleKind::k1F1B, m, 1});
    for (int m : {2, 4, 8})
      if (m % P == 0) cases.push_back({P, ScheduleKind::kInterleaved, m, 2});
  }
  for (const M& c : cases) {
    auto res = testing::run_processes(c.P, [c](int rank, int size, std::shared_ptr<Store> store) {
      auto pg = make_pg(store, rank, size, 120);
      const ToyConfig cfg{11, 128, 8, 99};
      const int B = 32, T = 16, P = c.P, S = P * c.v;
      std::vector<int32_t> x(B * T), y(B * T);
      for (int i = 0; i < B * T; ++i) {
        x[i] = static_cast<int32_t>(testing::toy_mix(i) % cfg.vocab);
        y[i] = static_cast<int32_t>(testing::toy_mix(i + 7) % cfg.vocab);
      }
      std::vector<std::unique_ptr<ToyStage>> chunks;
      std::vector<Stage*> ptrs;
      for (int ci = 0; ci < c.v; ++ci) {
        int s = ci * P + rank;
        chunks.push_back(std::make_unique<ToyStage>(cfg, s * cfg.layers / S, (s + 1) * cfg.layers / S, s == 0,
                                                     s == S - 1));
        ptrs.push_back(chunks.back().get());
      }
      PipelineEngine e(ptrs, pg, {c.kind, c.m, c.v});
      e.run(x.data(), y.data(), B, T, true);  // warm-up
      std::vector<double> wall, rep;
      for (int step = 0; step < 3; ++step) {
        timeline().clear();
        timeline().enable(true);
        pg->barrier();
        int64_t t0 = Timeline::now_ns();
        e.run(x.data(), y.data(), B, T, true);
        int64_t t1 = Timeline::now_ns();
        timeline().enable(false);
        auto spans = timeline().spans();
        RankProfile prof = profile_spans(spans, t0, t1);
        // Mean measured duration per (type, chunk) on this rank, shared with the other rank for the replay.
        std::vector<double> mean(2 * c.v, 0.0), n(2 * c.v, 0.0);
        for (const Span& s : spans)
          if (s.kind == SpanKind::kCompute) {
            int k = (s.name == "backward") * c.v + s.chunk;
            mean[k] += (s.t1_ns - s.t0_ns) * 1e-9;
            n[k] += 1;
          }
        for (int k = 0; k < 2 * c.v; ++k) mean[k] /= n[k];
        std::vector<double> all(2 * c.v * P), bub(P);  // [rank][type][chunk]
        pg->all_gather(mean.data(), all.data(), mean.size(), DType::kFloat64);
        pg->all_gather(&prof.bubble_fraction, bub.data(), 1, DType::kFloat64);
        ReplayResult r = replay(e.schedule(), P, c.v, [&](int p, const Action& a) {
          return all[p * 2 * c.v + (a.type == Action::kBackward) * c.v + a.chunk];
        });
        double wb = 0, busy = 0;
        for (int p = 0; p < P; ++p) {
          wb += bub[p] / P;
          busy += r.busy[p] / P;
        }
        wall.push_back(wb);
        rep.push_back(1 - busy / r.makespan);
      }
      std::sort(wall.begin(), wall.end());
      std::sort(rep.begin(), rep.end());
      if (rank == 0)
        fmt::print("bubble P={} {:<11} m={} v={}: measured {:.3f} (median of 3 steps, mean of ranks), replay of "
                   "measured times {:.3f}, (P-1)/(m+P-1) = {:.3f}, (P-1)/(v m + P-1) = {:.3f}\n",
                   P, schedule_name(c.kind), c.m, c.v, wall[1], rep[1], double(P - 1) / (c.m + P - 1),
                   double(P - 1) / (c.v * c.m + P - 1));
    }, testing::RunOptions{.deadline_s = 300, .env = {}});
    EXPECT_EQ(testing::failures(res), "");
  }
}
}  // namespace
}  // namespace trident::parallel
