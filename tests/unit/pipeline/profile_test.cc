// Profiling from spans: compute / communication / idle seconds and the bubble of a window computed by hand
// for crafted spans; JSON round trip; the Chrome trace's structure; gathering spans of different lengths
// from every rank (ranks as threads) and writing one trace file. And the thread waits the trainer's step
// split reads (take_thread_waits): kComm spans counted whether or not the timeline records, nested ones
// once, pipeline transfers apart from collectives, and only the calling thread's.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "harness/multiproc.h"
#include "harness/temp_dir.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"
#include "trident/parallel/profile.h"

namespace trident::parallel {
namespace {

constexpr int64_t kS = 1000000000LL;

Span span(SpanKind k, const char* name, double t0, double t1, int mb = -1, int chunk = -1, double bytes = 0) {
  Span s;
  s.kind = k;
  s.name = name;
  s.t0_ns = static_cast<int64_t>(t0 * kS);
  s.t1_ns = static_cast<int64_t>(t1 * kS);
  s.microbatch = mb;
  s.chunk = chunk;
  s.bytes = bytes;
  return s;
}

std::vector<Span> crafted() {
  return {span(SpanKind::kCompute, "forward", 0, 2, 0, 0),
          span(SpanKind::kComm, "recv_act", 2, 2.5, 1, 0, 100),
          span(SpanKind::kCompute, "backward", 3, 5, 0, 0),
          span(SpanKind::kComm, "all_reduce(tp)", 4, 4.5, -1, -1, 50),  // nested in backward
          span(SpanKind::kComm, "send_grad", 5, 6, 0, 0, 100),
          span(SpanKind::kCompute, "forward", 9, 12, 2, 0)};  // clipped to the window at 10
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
int64_t ns_since(int64_t t0) { return Timeline::now_ns() - t0; }

TEST(Profile, ThreadWaitsCountCommSpansOnceAndOnlyTheCallersThread) {
  ASSERT_FALSE(timeline().enabled());
  take_thread_waits();
  int64_t t0 = Timeline::now_ns();
  {
    ScopedSpan outer(SpanKind::kComm, "dp_grad_sync");
    ScopedSpan inner(SpanKind::kComm, "all_reduce(tp)");  // nested: not counted again
    sleep_ms(20);
  }
  const int64_t collective_block = ns_since(t0);
  t0 = Timeline::now_ns();
  {
    ScopedSpan recv(SpanKind::kComm, "recv_act");
    sleep_ms(10);
  }
  const int64_t pipeline_block = ns_since(t0);
  {
    ScopedSpan compute(SpanKind::kCompute, "forward");  // not a wait
    sleep_ms(10);
  }
  std::thread other([] {
    ScopedSpan s(SpanKind::kComm, "all_reduce(dp)");  // another thread's wait
    sleep_ms(10);
  });
  other.join();
  const ThreadWaits w = take_thread_waits();
  // Each within its own block's time: counted once, and neither the compute span nor the other thread's.
  EXPECT_GE(w.collective_ns, 20'000'000);
  EXPECT_LE(w.collective_ns, collective_block);
  EXPECT_GE(w.pipeline_ns, 10'000'000);
  EXPECT_LE(w.pipeline_ns, pipeline_block);
  const ThreadWaits again = take_thread_waits();  // taking zeroes them
  EXPECT_EQ(again.collective_ns, 0);
  EXPECT_EQ(again.pipeline_ns, 0);
  EXPECT_TRUE(timeline().spans().empty());  // counted, not recorded
}

TEST(Profile, ByHand) {
  RankProfile p = profile_spans(crafted(), 0, 10 * kS);
  EXPECT_DOUBLE_EQ(p.window_s, 10);
  EXPECT_NEAR(p.compute_s, 2 + 2 + 1, 1e-9);
  EXPECT_NEAR(p.comm_total_s, 0.5 + 0.5 + 1, 1e-9);
  EXPECT_NEAR(p.comm_s.at("recv_act"), 0.5, 1e-9);
  EXPECT_NEAR(p.comm_s.at("all_reduce(tp)"), 0.5, 1e-9);
  EXPECT_NEAR(p.comm_s.at("send_grad"), 1, 1e-9);
  // Busy: [0, 2.5) + [3, 6) + [9, 10) = 6.5 s; idle 3.5 s.
  EXPECT_NEAR(p.idle_s, 3.5, 1e-9);
  EXPECT_NEAR(p.bubble_fraction, 1 - 5.0 / 10, 1e-12);
  EXPECT_NEAR(p.bubble_ratio, 5.0 / 5.0, 1e-12);
  EXPECT_DOUBLE_EQ(p.comm_bytes, 250);
  EXPECT_EQ(p.compute_spans, 3);
  EXPECT_EQ(p.comm_spans, 3);
  // Automatic window: [0, 12).
  RankProfile q = profile_spans(crafted());
  EXPECT_NEAR(q.window_s, 12, 1e-9);
  EXPECT_NEAR(q.compute_s, 7, 1e-9);
  EXPECT_NEAR(q.idle_s, 12 - (2.5 + 3 + 3), 1e-9);
  // A window after everything: nothing counted, all idle.
  RankProfile e = profile_spans(crafted(), 20 * kS, 30 * kS);
  EXPECT_EQ(e.compute_spans, 0);
  EXPECT_NEAR(e.idle_s, 10, 1e-9);
  EXPECT_NEAR(e.bubble_fraction, 1, 1e-12);
}

TEST(Profile, JsonRoundTripAndChromeTrace) {
  auto spans = crafted();
  auto back = spans_from_json(nlohmann::json::parse(spans_to_json(spans).dump()));
  ASSERT_EQ(back.size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(back[i].kind, spans[i].kind);
    EXPECT_EQ(back[i].name, spans[i].name);
    EXPECT_EQ(back[i].t0_ns, spans[i].t0_ns);
    EXPECT_EQ(back[i].t1_ns, spans[i].t1_ns);
    EXPECT_EQ(back[i].microbatch, spans[i].microbatch);
    EXPECT_EQ(back[i].chunk, spans[i].chunk);
    EXPECT_EQ(back[i].bytes, spans[i].bytes);
  }
  nlohmann::json t = chrome_trace({spans, {span(SpanKind::kCompute, "forward", 1, 1.5, 3, 1)}}, kS / 2);
  int x = 0;
  bool found = false;
  for (const auto& ev : t.at("traceEvents")) {
    if (ev.at("ph") != "X") continue;
    ++x;
    if (ev.at("pid") == 1) {
      EXPECT_EQ(ev.at("name"), "forward mb3 c1");
      EXPECT_DOUBLE_EQ(ev.at("ts").get<double>(), 0.5e6);  // microseconds from t0 = 0.5 s
      EXPECT_DOUBLE_EQ(ev.at("dur").get<double>(), 0.5e6);
      EXPECT_EQ(ev.at("tid"), 0);
      EXPECT_EQ(ev.at("args").at("mb"), 3);
      found = true;
    }
    if (ev.at("pid") == 0 && ev.at("name") == "send_grad mb0 c0") {
      EXPECT_EQ(ev.at("tid"), 1);
      EXPECT_EQ(ev.at("args").at("bytes"), 100);
    }
  }
  EXPECT_EQ(x, 7);
  EXPECT_TRUE(found);
  auto s = summarize({spans, {}}, 0, 10 * kS);
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_NEAR(s["ranks"][0]["bubble_fraction"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(s["ranks"][1]["bubble_fraction"].get<double>(), 1.0, 1e-12);
  EXPECT_NEAR(s["max_bubble_fraction"].get<double>(), 1.0, 1e-12);
  EXPECT_NE(format_summary(s).find("rank 0: compute 5.000 s (50%)"), std::string::npos) << format_summary(s);
}

// Rank r contributes r*7 spans (rank 0 none): the gather pads to the longest and trims each back.
TEST(Profile, GatherVariableSizes) {
  auto res = testing::run_threads(4, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = new_process_group(st, r, n, {});
    std::vector<Span> mine;
    for (int i = 0; i < r * 7; ++i) mine.push_back(span(SpanKind::kComm, "recv_act", r + i, r + i + 0.25, i, r, i));
    auto all = gather_spans(*pg, mine, 2);
    if (r != 2) {
      TRIDENT_RANK_CHECK(all.empty(), "rank {} got {} lists", r, all.size());
      return;
    }
    TRIDENT_RANK_CHECK(all.size() == 4, "root got {} lists", all.size());
    for (int q = 0; q < 4; ++q) {
      TRIDENT_RANK_CHECK(all[q].size() == static_cast<size_t>(q * 7), "rank {} sent {} spans", q, all[q].size());
      for (int i = 0; i < q * 7; ++i)
        TRIDENT_RANK_CHECK(all[q][i].microbatch == i && all[q][i].chunk == q && all[q][i].bytes == i, "span {} of {}",
                           i, q);
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

TEST(Profile, WriteChromeTraceSingleRank) {
  testing::TempDir dir("pptrace1");
  auto pg = new_process_group(std::make_shared<HashStore>(), 0, 1, {});
  timeline().clear();
  timeline().enable(true);
  int64_t t0 = Timeline::now_ns();
  { ScopedSpan s(SpanKind::kCompute, "forward", 0, 0); }
  { ScopedSpan s(SpanKind::kComm, "recv_act", 1, 0, 64); }
  timeline().enable(false);
  std::string path = (dir.path / "t.json").string();
  write_chrome_trace(*pg, path, t0);
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  int x = 0;
  for (const auto& ev : j.at("traceEvents")) x += ev.at("ph") == "X";
  EXPECT_EQ(x, 2);
  timeline().clear();
  EXPECT_THROW(write_chrome_trace(*pg, (dir.path / "no" / "such" / "t.json").string(), t0), IoError);
}

}  // namespace
}  // namespace trident::parallel
