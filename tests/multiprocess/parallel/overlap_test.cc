// Overlap accounting of DataParallel: per step, the backward window, each gradient bucket's collective as
// it ran on the group's worker, and the wait in finish_gradient_sync(). Checked with logical invariants
// only (no timed thresholds): every interval is ordered (launch <= start <= end <= end of the sync), the
// worker runs one collective at a time, the hidden time recomputed here from the intervals matches the
// reported one, the time not hidden fits inside the exposed wait, overlap=false hides exactly nothing, and
// a backward slowed by sleeps between gradients (overlap=true) hides some. The gradients are still the
// exact average (small integers).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/timeline.h"
#include "trident/nn/model.h"
#include "trident/parallel/data_parallel.h"

namespace trident::overlap_test {
namespace {

constexpr int kParams = 6;     // one bucket per parameter
constexpr size_t kNumel = 1024;

// A model whose backward writes known gradients, parameter by parameter in descending order (as nn::Model
// promises), firing the grad-ready hook after each and optionally sleeping before each (simulated compute).
// Rank r's gradient of element j of parameter k is 2 (r + 1) (k + 1 + j % 3): the average over N ranks is
// (N + 1) (k + 1 + j % 3), exact in float32 in any summation order. inputs[0] carries the rank.
class ToyModel : public nn::Model {
 public:
  explicit ToyModel(int sleep_ms) : sleep_ms_(sleep_ms), params_(kParams) {
    for (int k = 0; k < kParams; ++k) {
      params_[k].name = "p" + std::to_string(k);
      params_[k].shape = {static_cast<int64_t>(kNumel)};
      params_[k].offset = k * kNumel;
      params_[k].numel = kNumel;
    }
    values_.assign(kParams * kNumel, 0.5f);
    grads_.assign(kParams * kNumel, 0.0f);
  }
  const std::vector<nn::Parameter>& parameters() const override { return params_; }
  float* param_data() override { return values_.data(); }
  float* grad_data() override { return grads_.data(); }
  size_t num_params() const override { return values_.size(); }
  float forward_backward(const int32_t* inputs, const int32_t*, int, int, bool backward, float scale) override {
    if (!backward) return 0;
    const float r = static_cast<float>(inputs[0]);
    for (int k = kParams - 1; k >= 0; --k) {
      if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
      for (size_t j = 0; j < kNumel; ++j)
        grads_[k * kNumel + j] += scale * 2 * (r + 1) * static_cast<float>(k + 1 + j % 3);
      if (hook_) hook_(static_cast<size_t>(k));
    }
    return 0;
  }
  void forward_logits(const int32_t*, int, int, float*) override {}
  void zero_grad() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }
  void set_grad_ready_hook(GradReadyHook hook) override { hook_ = std::move(hook); }
  nlohmann::json config() const override { return {{"kind", "toy"}}; }
  std::string kind() const override { return "toy"; }

 private:
  int sleep_ms_;
  std::vector<nn::Parameter> params_;
  std::vector<float> values_, grads_;
  GradReadyHook hook_;
};

struct Case {
  std::string strategy;
  bool overlap;
  int sleep_ms;  // per parameter in backward
  int accum;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.strategy << (c.overlap ? " overlap" : " no-overlap") << " sleep " << c.sleep_ms << " ms accum " << c.accum;
}

constexpr int kSteps = 3;
constexpr double kGranularity = 1e-6;  // seconds: slack for clock reads on different threads

void run_rank(const Case& c, int rank, int size, std::shared_ptr<Store> store) {
  GroupOptions go;
  go.timeout = Seconds(60);
  auto pg = new_process_group(store, rank, size, go);
  ToyModel model(c.sleep_ms);
  parallel::DataParallelOptions o;
  o.strategy = parallel::parse_strategy(c.strategy);
  o.overlap = c.overlap;
  o.bucket_bytes = kNumel * sizeof(float);
  parallel::DataParallel dp(model, pg, o);
  TRIDENT_RANK_CHECK(dp.num_buckets() == static_cast<size_t>(kParams), "{} buckets, want {}", dp.num_buckets(),
                     kParams);
  TRIDENT_RANK_CHECK(dp.overlap_totals().steps == 0 && dp.last_step_overlap().comm_s == 0, "stats before any step");
  const bool communicates = size > 1 || c.strategy != "ddp";
  const int32_t input = rank;
  double sum_comm = 0, sum_hidden = 0, sum_exposed = 0;
  for (int s = 0; s < kSteps; ++s) {
    model.zero_grad();
    int64_t last_micro_begin = 0;
    for (int m = 0; m < c.accum; ++m) {
      dp.set_require_sync(m == c.accum - 1);
      if (m == c.accum - 1) last_micro_begin = Timeline::now_ns();
      model.forward_backward(&input, &input, 1, 1, true, 1.0f / c.accum);
    }
    const int64_t before_sync = Timeline::now_ns();
    dp.finish_gradient_sync();
    const int64_t after_sync = Timeline::now_ns();
    const auto& ov = dp.last_step_overlap();
    const auto& tm = dp.last_step_bucket_timings();

    // The window: the syncing micro-step's backward, up to the call of finish_gradient_sync.
    TRIDENT_RANK_CHECK(ov.steps == 1, "steps {}", ov.steps);
    TRIDENT_RANK_CHECK(last_micro_begin <= ov.window_begin_ns && ov.window_begin_ns <= ov.window_end_ns &&
                           before_sync <= ov.window_end_ns && ov.window_end_ns <= ov.sync_end_ns &&
                           ov.sync_end_ns <= after_sync,
                       "window [{}, {}] sync end {}, micro-step began {}, sync called {} returned {}",
                       ov.window_begin_ns, ov.window_end_ns, ov.sync_end_ns, last_micro_begin, before_sync, after_sync);

    // Every bucket's interval is ordered and inside the step; recompute comm and hidden from them.
    TRIDENT_RANK_CHECK(tm.size() == dp.num_buckets(), "{} timings for {} buckets", tm.size(), dp.num_buckets());
    int64_t comm = 0, hidden = 0;
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (size_t i = 0; i < tm.size(); ++i) {
      const auto& t = tm[i];
      if (!communicates) {
        TRIDENT_RANK_CHECK(t.launched_ns == 0 && t.started_ns == 0 && t.finished_ns == 0,
                           "1-rank ddp bucket {} has a collective", i);
        continue;
      }
      TRIDENT_RANK_CHECK(ov.window_begin_ns <= t.launched_ns && t.launched_ns <= t.started_ns &&
                             t.started_ns <= t.finished_ns && t.finished_ns <= ov.sync_end_ns,
                         "bucket {}: launched {} started {} finished {}, window [{}, {}], sync end {}", i,
                         t.launched_ns, t.started_ns, t.finished_ns, ov.window_begin_ns, ov.window_end_ns,
                         ov.sync_end_ns);
      if (!c.overlap)
        TRIDENT_RANK_CHECK(t.launched_ns >= ov.window_end_ns, "overlap=false launched bucket {} during backward", i);
      comm += t.finished_ns - t.started_ns;
      hidden += std::max<int64_t>(0, std::min(t.finished_ns, ov.window_end_ns) - t.started_ns);
      runs.emplace_back(t.started_ns, t.finished_ns);
    }
    // One collective at a time on the group's worker: the intervals do not overlap one another.
    std::sort(runs.begin(), runs.end());
    for (size_t i = 1; i < runs.size(); ++i)
      TRIDENT_RANK_CHECK(runs[i].first >= runs[i - 1].second, "collectives overlap: [{}, {}] and [{}, {}]",
                         runs[i - 1].first, runs[i - 1].second, runs[i].first, runs[i].second);
    TRIDENT_RANK_CHECK(std::abs(ov.comm_s - comm * 1e-9) <= 1e-9 && std::abs(ov.hidden_s - hidden * 1e-9) <= 1e-9,
                       "reported comm {} hidden {}, recomputed {} {}", ov.comm_s, ov.hidden_s, comm * 1e-9,
                       hidden * 1e-9);
    TRIDENT_RANK_CHECK(std::abs(ov.exposed_s - (ov.sync_end_ns - ov.window_end_ns) * 1e-9) <= 1e-9, "exposed {}",
                       ov.exposed_s);
    // hidden + (the rest, all after the window and before the sync returned) = total.
    TRIDENT_RANK_CHECK(ov.hidden_s >= 0 && ov.hidden_s <= ov.comm_s, "hidden {} of {}", ov.hidden_s, ov.comm_s);
    TRIDENT_RANK_CHECK(ov.comm_s - ov.hidden_s <= ov.exposed_s + kGranularity,
                       "comm not hidden {} exceeds the exposed wait {}", ov.comm_s - ov.hidden_s, ov.exposed_s);
    const double f = ov.hidden_fraction();
    TRIDENT_RANK_CHECK(f >= 0 && f <= 1, "hidden fraction {}", f);
    if (!c.overlap) TRIDENT_RANK_CHECK(ov.hidden_s == 0 && f == 0, "overlap=false hid {} s ({})", ov.hidden_s, f);
    if (communicates) TRIDENT_RANK_CHECK(ov.comm_s > 0, "no communication time measured");
    else TRIDENT_RANK_CHECK(ov.comm_s == 0 && f == 0, "1-rank ddp comm {}", ov.comm_s);
    sum_comm += ov.comm_s;
    sum_hidden += ov.hidden_s;
    sum_exposed += ov.exposed_s;

    // The accounting changed nothing: the gradients are the exact average (ddp: all of them).
    if (c.strategy == "ddp") {
      const float* g = model.grad_data();
      for (int k = 0; k < kParams; ++k)
        for (size_t j = 0; j < kNumel; ++j) {
          const float want = static_cast<float>((size + 1) * (k + 1 + static_cast<int>(j % 3)));
          TRIDENT_RANK_CHECK(g[k * kNumel + j] == want, "grad[{}][{}] = {} want {}", k, j, g[k * kNumel + j], want);
        }
    }
  }
  // Sums and means over the steps.
  const auto& tot = dp.overlap_totals();
  TRIDENT_RANK_CHECK(tot.steps == kSteps, "{} steps summed", tot.steps);
  TRIDENT_RANK_CHECK(std::abs(tot.comm_s - sum_comm) <= 1e-9 && std::abs(tot.hidden_s - sum_hidden) <= 1e-9 &&
                         std::abs(tot.exposed_s - sum_exposed) <= 1e-9,
                     "totals {} {} {} want {} {} {}", tot.comm_s, tot.hidden_s, tot.exposed_s, sum_comm, sum_hidden,
                     sum_exposed);
  auto rep = dp.report()["overlap"];
  TRIDENT_RANK_CHECK(rep["steps"].get<int>() == kSteps, "report steps {}", rep.dump());
  TRIDENT_RANK_CHECK(std::abs(rep["comm_exposed_s"].get<double>() - sum_exposed / kSteps) <= 1e-12 &&
                         std::abs(rep["comm_hidden_fraction"].get<double>() - tot.hidden_fraction()) <= 1e-12,
                     "report {}", rep.dump());
  if (!c.overlap) TRIDENT_RANK_CHECK(tot.hidden_s == 0, "overlap=false hid {} s over the run", tot.hidden_s);
  // Slow backward, overlap on: the first buckets' collectives run while later gradients are computed.
  if (c.overlap && c.sleep_ms > 0 && communicates)
    TRIDENT_RANK_CHECK(tot.hidden_s > 0 && tot.hidden_fraction() > 0, "nothing hidden behind a {} ms x {} backward: {}",
                       c.sleep_ms, kParams, rep.dump());
  dp.reset_overlap_stats();
  TRIDENT_RANK_CHECK(dp.overlap_totals().steps == 0 && dp.overlap_totals().comm_s == 0, "reset");
}

class Overlap : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(Overlap, IntervalsAreConsistent) {
  const auto& [c, world] = GetParam();
  auto res = testing::run_processes(world, [&](int r, int n, std::shared_ptr<Store> st) { run_rank(c, r, n, st); });
  EXPECT_EQ(testing::failures(res), "");
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, int>>& info) {
  const auto& [c, world] = info.param;
  return c.strategy + (c.overlap ? "_overlap" : "_no_overlap") + (c.sleep_ms ? "_slow" : "") +
         (c.accum > 1 ? "_accum" + std::to_string(c.accum) : "") + "_" + std::to_string(world) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(
    DataParallel, Overlap,
    ::testing::Combine(::testing::Values(Case{"ddp", true, 0, 1}, Case{"ddp", false, 0, 1}, Case{"ddp", false, 5, 1},
                                         Case{"ddp", true, 20, 1}, Case{"ddp", true, 5, 2}, Case{"zero2", true, 20, 1}),
                       ::testing::Values(2, 3)),
    case_name);

// One rank: DDP sends nothing, and the accounting says so (no intervals, fraction 0).
TEST(OverlapOneRank, NoCommunicationNothingHidden) {
  auto res = testing::run_processes(1, [&](int r, int n, std::shared_ptr<Store> st) {
    run_rank(Case{"ddp", true, 0, 1}, r, n, st);
  });
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident::overlap_test
