// The dashboard page in a real browser: headless Chromium (Debian's chromium, scripts/deps.sh) loads the page
// from `trident dashboard` against a live 2-rank training run beside a finished one, and `trident report`'s
// file offline, and the test reads the DOM it leaves (--dump-dom): the loss chart's points per run (the page
// records them in data-points), the runs in uPlot's legend, the link the health records name marked slow,
// the records pushed by the event stream and the per-rank bars of where a step's time goes. The finished
// run's health monitor logs its rounds (health.jsonl, over TCP links so that bandwidth is measured on one
// host): the file's values are checked, and the page's link matrix and lateness chart drawn from them; the
// mesh table shows the coordinates the run recorded. A figure page (`trident bench comm --html`'s) draws
// one line per source and algorithm with every point. A run over two hosts shows the host x host matrix. A
// page whose event stream is refused polls, and still shows the steps a run appends while it is open.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "harness/chromium.h"
#include "harness/skip.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/bench/bench_page.h"
#include "trident/dashboard/page_file.h"
#include "trident/dashboard/server.h"
#include "unit/dashboard/synthetic_run.h"
#include "unit/launch/process_runner.h"

namespace trident::dashboard {
namespace {

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

using trident::testing::dump_dom;
using trident::testing::find_chromium;

// The value of attribute `attr` on the element with id `id` (plain string search: the DOM holds uPlot's
// minified source in the report, too long for std::regex's recursive matcher).
std::string attr_of(const std::string& dom, const std::string& id, const std::string& attr) {
  const size_t at = dom.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "<no element #" + id + ">";
  const size_t open = dom.rfind('<', at), close = dom.find('>', at);
  const std::string tag = dom.substr(open, close - open);
  const size_t v = tag.find(" " + attr + "=\"");
  if (v == std::string::npos) return "<no " + attr + ">";
  const size_t from = v + attr.size() + 3;
  return tag.substr(from, tag.find('"', from) - from);
}

size_t steps_in(const fs::path& metrics) {
  std::ifstream in(metrics);
  size_t n = 0;
  for (std::string l; std::getline(in, l);) n += l.find("\"type\":\"step\"") != std::string::npos;
  return n;
}

class DashboardBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = find_chromium();
    if (chromium_.empty()) TRIDENT_SKIP_MISSING("chromium (headless browser) not on PATH; apt-get install chromium");
  }
  // Starts `trident dashboard` on a free port; returns its URL.
  std::string start_dashboard(const std::vector<std::string>& dirs, const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {TRIDENT_BIN, "dashboard", "--port", "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), dirs.begin(), dirs.end());
    server_ = std::make_unique<ProcessRunner>(argv, trident::testing::make_env({}, {}));
    std::smatch m;
    const std::regex url("http://127\\.0\\.0\\.1:[0-9]+/");
    EXPECT_TRUE(server_->read_until([&] { return std::regex_search(server_->out(), m, url); }, 20))
        << server_->out() << server_->err();
    std::regex_search(server_->out(), m, url);
    return m.str(0);
  }
  std::string chromium_;
  trident::testing::TempDir dir_{"dash-browser"};
  std::unique_ptr<ProcessRunner> server_;
};

std::vector<std::string> train_argv(const std::string& corpus, const fs::path& out, int iters, int n_embd) {
  return {TRIDENT_BIN, "train", "--data", corpus, "--out_dir", out.string(), "--n-layer", "4", "--n-head", "4",
          "--n-embd", std::to_string(n_embd), "--block-size", "64", "--batch-size", "8", "--max-iters",
          std::to_string(iters), "--eval-interval", "50", "--eval-iters", "1", "--sample-tokens", "0", "--threads",
          "1", "--nproc", "2", "--parallel", "ddp"};
}

// The status cell of run `name` in the runs table.
std::string status_of(const std::string& dom, const std::string& name) {
  const size_t row = dom.find("<tr data-run=\"" + name + "\">");
  if (row == std::string::npos) return "<no row for " + name + ">";
  const std::string key = "<td class=\"status-";
  const size_t at = dom.find(key, row);
  if (at == std::string::npos) return "<no status>";
  return dom.substr(at + key.size(), dom.find('"', at + key.size()) - at - key.size());
}

// health.jsonl of a 2-rank run of `steps` steps: one round per step, both ranks' lateness in every round,
// every measured link's bandwidth > 0, and each link's and rank's baseline null for its first
// `baseline_after` measurements (warm-up + baseline - 1: the one that completes the baseline carries it) and
// > 0 (lateness: >= 0) from then on.
void check_health_log(const fs::path& file, int steps, int baseline_after) {
  std::ifstream in(file);
  int round = 0;
  std::map<std::string, int> seen;  // measurements per link ("0-1") and rank ("r0")
  size_t with_baseline = 0;
  const auto check_baseline = [&](const std::string& key, const nlohmann::json& b, bool positive,
                                  const std::string& line) {
    if (seen[key]++ < baseline_after) {
      EXPECT_TRUE(b.is_null()) << key << ": " << line;
      return;
    }
    ASSERT_TRUE(b.is_number()) << key << ": " << line;
    if (positive) EXPECT_GT(b.get<double>(), 0.0) << key << ": " << line;
    else EXPECT_GE(b.get<double>(), 0.0) << key << ": " << line;
  };
  for (std::string line; std::getline(in, line); ++round) {
    const auto r = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(r.is_object()) << line;
    if (!r.is_object()) continue;
    EXPECT_EQ(r.value("step", -1), round) << line;
    EXPECT_GT(r.value("time", 0.0), 1.7e9) << line;
    EXPECT_FALSE(r.contains("events")) << "a warning in a run whose thresholds allow none: " << line;
    EXPECT_EQ(r["ranks"].size(), 2u) << line;
    for (size_t k = 0; k < r["ranks"].size(); ++k) {
      EXPECT_EQ(r["ranks"][k]["rank"], k) << line;
      EXPECT_GE(r["ranks"][k]["late_ms"].get<double>(), 0.0) << line;
      check_baseline("r" + std::to_string(k), r["ranks"][k]["baseline_ms"], false, line);
    }
    for (const auto& l : r["links"]) {
      const int src = l["src"], dst = l["dst"];
      EXPECT_TRUE(src != dst && src >= 0 && src < 2 && dst >= 0 && dst < 2) << line;
      EXPECT_GT(l["gbps"].get<double>(), 0.0) << line;
      const std::string key = std::to_string(src) + "-" + std::to_string(dst);
      with_baseline += seen[key] >= baseline_after;
      check_baseline(key, l["baseline_gbps"], true, line);
    }
  }
  EXPECT_EQ(round, steps);
  EXPECT_GT(with_baseline, 0u) << "no link measured after its baseline in " << steps << " rounds";
}

TEST_F(DashboardBrowser, LiveTwoRankRunBesideAFinishedOne) {
  const std::string corpus = trident::testing::write_word_corpus(dir_.path);
  const fs::path live = dir_.path / "live", done = dir_.path / "done", other = dir_.path / "other";
  test::write_synthetic_run(other, 25, false);
  {  // A short 2-rank run, finished before the dashboard starts.
    // Its ranks talk over TCP, whose links the health monitor measures by default (by the kernel's busy
    // time, a few ms a tick: a short step's link often reads nothing, so each link's first measurement is
    // its baseline); no warning (a loaded machine must not add a series to the charts).
    ProcessRunner train(train_argv(corpus, done, 60, 32),
                        trident::testing::make_env({}, {"TRIDENT_TRANSPORT=tcp", "TRIDENT_HEALTH_WARMUP=0",
                                                         "TRIDENT_HEALTH_BASELINE=1", "TRIDENT_HEALTH_MIN_BYTES=1K",
                                                         "TRIDENT_HEALTH_BANDWIDTH=0.001", "TRIDENT_HEALTH_LATE=600s"}));
    const auto st = train.wait(60);
    ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << train.out() << train.err();
  }
  check_health_log(done / "health.jsonl", 60, 0);
  // A 2-rank run that trains while the page loads (tens of steps a second; stopped at the end).
  ProcessRunner train(train_argv(corpus, live, 1000000, 128), trident::testing::make_env({}, {}));
  ASSERT_TRUE(train.read_until([&] { return fs::exists(live / "metrics.jsonl") && steps_in(live / "metrics.jsonl") >= 3; }, 60))
      << train.out() << train.err();
  const std::string url = start_dashboard({live.string(), done.string(), other.string()});
  const size_t before = steps_in(live / "metrics.jsonl");
  const std::string dom = dump_dom(chromium_, url, dir_.path / "profile", 3500, /*live=*/true);
  const size_t after = steps_in(live / "metrics.jsonl");
  ::kill(train.pid(), SIGTERM);
  train.wait(30);
  EXPECT_GT(after, before) << "the run did not train while the page loaded";
  // (A loaded 2-core machine may also make the live run's health monitor name a late rank: a third series.)
  const std::string series = attr_of(dom, "chart-loss", "data-series");
  EXPECT_EQ(series.find("live train|live val|"), 0u) << series << "\n" << dom.substr(0, 3000);
  EXPECT_NE(series.find("|done train|done val|other train|other val"), std::string::npos) << series;
  // Loss points: the live run's between what its file held before and after the page loaded (the stream
  // pushed it more than once: more records events than the first load's one per run); every step of the
  // finished runs.
  EXPECT_NE(dom.find("id=\"mode\">live<"), std::string::npos) << "the page fell back to polling";
  const size_t ev = dom.find("data-events=\"");
  ASSERT_NE(ev, std::string::npos) << "no records event reached the page";
  EXPECT_GT(std::stoul(dom.substr(ev + 13)), 3u) << "nothing was pushed after the first load";
  const std::string points = attr_of(dom, "chart-loss", "data-points");
  const size_t live_points = std::stoul(points.substr(0, points.find(',')));
  EXPECT_GE(live_points, before) << points;
  EXPECT_LE(live_points, after) << points;
  EXPECT_EQ(points.substr(points.find(',') + 1), std::to_string(steps_in(done / "metrics.jsonl")) + ",25");
  EXPECT_EQ(steps_in(done / "metrics.jsonl"), 60u);
  EXPECT_NE(dom.find("class=\"u-label\">done train<"), std::string::npos) << "second run not in the legend";
  EXPECT_NE(dom.find("class=\"u-label\">other train<"), std::string::npos) << "third run not in the legend";
  EXPECT_EQ(status_of(dom, "live"), "running");
  EXPECT_EQ(status_of(dom, "done"), "finished");
  // Where a step goes: one stacked bar per rank of the two real runs (the synthetic run has no split), each
  // "compute:comm:bubble:data:optimizer" in ms, with compute and (two ranks) communication in it.
  EXPECT_EQ(attr_of(dom, "chart-split", "data-bars"), "4");
  std::istringstream bars(attr_of(dom, "chart-split", "data-split"));
  int n = 0;
  for (std::string bar; std::getline(bars, bar, '|'); ++n) {
    double compute = 0, comm = 0;
    ASSERT_EQ(std::sscanf(bar.c_str(), "%lf:%lf:", &compute, &comm), 2) << bar;
    EXPECT_GT(compute, 0.0) << bar;
    EXPECT_GT(comm, 0.0) << bar;
  }
  EXPECT_EQ(n, 4);
  // The finished run's health: its link matrix at its last round, each link's ratio to its baseline drawn
  // from health.jsonl (both links were measured after their baselines: the file check above), and both
  // ranks' lateness charted; its mesh as the run recorded it (2 ranks of dp).
  const size_t matrix = dom.find("<table class=\"matrix\" data-run=\"done\" data-step=\"59\"");
  ASSERT_NE(matrix, std::string::npos) << dom.substr(dom.find("id=\"health\""), 3000);
  const std::string cells = dom.substr(matrix, dom.find("</table>", matrix) - matrix);
  for (const char* link : {"0-1", "1-0"}) {
    const size_t at = cells.find(std::string("data-link=\"") + link + "\" data-ratio=\"");
    EXPECT_NE(at, std::string::npos) << link << " has no ratio: " << cells;
  }
  const std::string late = attr_of(dom, "chart-late", "data-series");
  EXPECT_NE(late.find("done rank 0|done rank 1"), std::string::npos) << late;
  EXPECT_NE(dom.find("<tr data-rank=\"1\"><td>1</td><td>0</td><td>0</td><td>1</td><td class=\"text\">"),
            std::string::npos)
      << "the done run's rank 1 is not shown at dp 1 with its host";
  EXPECT_EQ(dom.find("<td class=\"text\"></td></tr>"), std::string::npos) << "a rank without its host";
}

TEST_F(DashboardBrowser, ReportOpensOfflineWithTheSlowLinkAndTheHungRun) {
  const fs::path a = dir_.path / "a", b = dir_.path / "b";
  test::write_synthetic_run(a, 40, /*slow_link=*/true);
  test::write_synthetic_run(b, 25, false);
  test::write_hang_dumps(b / "flight_recorder");
  const fs::path html = dir_.path / "report.html";
  ProcessRunner rep({TRIDENT_BIN, "report", a.string(), b.string(), "--out", html.string()},
                    trident::testing::make_env({}, {}));
  const auto st = rep.wait(30);
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0 && fs::exists(html)) << rep.out() << rep.err();
  const std::string dom = dump_dom(chromium_, "file://" + html.string(), dir_.path / "profile", 1000);
  EXPECT_EQ(attr_of(dom, "chart-loss", "data-points"), "40,25") << dom.substr(0, 2000);
  EXPECT_EQ(attr_of(dom, "chart-loss", "data-series"), "a train|a val|a health warnings|b train|b val");
  EXPECT_NE(dom.find("class=\"u-label\">b train<"), std::string::npos);
  // The link 0 -> 1 is the one marked slow; its reverse is not.
  EXPECT_NE(dom.find("<td class=\"slow\" data-link=\"0-1\""), std::string::npos);
  EXPECT_NE(dom.find("<td class=\"ok\" data-link=\"1-0\""), std::string::npos);
  EXPECT_NE(dom.find("arrives 180 ms late"), std::string::npos);
  // Run a's health rounds: the matrix at its last round (39) from health.jsonl, link 0 -> 1 at 0.30x its
  // baseline and marked slow, 1 -> 0 at 1.00x; both ranks' lateness for every round; the warnings marked
  // on the speed chart too.
  EXPECT_NE(dom.find("<table class=\"matrix\" data-run=\"a\" data-step=\"39\""), std::string::npos);
  EXPECT_NE(dom.find("<td class=\"slow\" data-link=\"0-1\" data-ratio=\"0.30\""), std::string::npos);
  EXPECT_NE(dom.find("<td class=\"ok\" data-link=\"1-0\" data-ratio=\"1.00\""), std::string::npos);
  EXPECT_EQ(attr_of(dom, "chart-late", "data-series"), "a rank 0|a rank 1");
  EXPECT_EQ(attr_of(dom, "chart-late", "data-points"), "40,40");
  EXPECT_EQ(attr_of(dom, "chart-speed", "data-series"), "a|a health warnings|b");
  EXPECT_NE(dom.find("data-ready=\"1\""), std::string::npos);
  // The view in the link's fragment: loss against tokens (the checkpoint's 24 x 64 per step), log scale,
  // smoothed; every point still drawn.
  const std::string tokens = dump_dom(chromium_, "file://" + html.string() + "#x=tokens&log=1&smooth=0.6",
                                      dir_.path / "profile", 1000);
  EXPECT_EQ(attr_of(tokens, "chart-loss", "data-points"), "40,25");
  EXPECT_NE(tokens.find("class=\"u-label\">tokens<"), std::string::npos) << "x axis not in tokens";
  // The hung run: its status, and `trident inspect`'s explanation of its dumps.
  EXPECT_EQ(status_of(dom, "b"), "hung");
  EXPECT_NE(dom.find("rank 2 never entered all_reduce #3"), std::string::npos);
}

// The busbw page `trident bench comm --html` writes, opened from a file: each (source, algorithm) line of a
// collective's chart is drawn (uPlot's legend) with every size's point, the peer's beside trident's.
TEST_F(DashboardBrowser, BusbwPageDrawsEveryLineAndPointOffline) {
  bench::BusbwSource trident{"trident", nlohmann::json::array()};
  for (double size : {8.0, 64.0, 512.0, 4096.0})
    for (const char* algo : {"ring", "direct"})
      for (bool inplace : {false, true})
        trident.records.push_back({{"op", "all_reduce"}, {"algo", algo}, {"algo_forced", true}, {"inplace", inplace},
                                   {"size", size}, {"busbw", size / 1e3 + (inplace ? 0.1 : 0)}});
  trident.records.push_back({{"op", "all_reduce"}, {"algo", "ring"}, {"algo_forced", false}, {"inplace", false},
                             {"size", 4096}, {"busbw", 4.0}});
  bench::BusbwSource peer{"openmpi", nlohmann::json::array()};
  for (double size : {8.0, 4096.0}) peer.records.push_back({{"op", "all_reduce"}, {"size", size}, {"busbw", 1.0}});
  const fs::path html = dir_.path / "busbw.html";
  write_html_file(html.string(), render_figures(bench::busbw_figures({trident, peer}, "2 ranks")), "test");
  const std::string dom = dump_dom(chromium_, "file://" + html.string(), dir_.path / "profile", 1000);
  EXPECT_EQ(attr_of(dom, "fig-busbw-all_reduce", "data-series"), "openmpi|trident auto|trident direct|trident ring")
      << dom.substr(0, 2000);
  EXPECT_EQ(attr_of(dom, "fig-busbw-all_reduce", "data-points"), "2,1,4,4");
  for (const char* label : {"openmpi", "trident auto", "trident direct", "trident ring"})
    EXPECT_NE(dom.find(std::string("class=\"u-label\">") + label + "<"), std::string::npos) << label;
  EXPECT_NE(dom.find("data-ready=\"1\""), std::string::npos);
}

// A 4-rank run over two hosts (ranks 0, 1 on host-a; 2, 3 on host-b, as its mesh record says): beside the
// rank x rank matrix, the host x host one gathers the links between the hosts and shows each pair by its
// worst link: a -> b holds 0->2, 0->3, 1->2, 1->3, with 1->3 at 0.40x its baseline and warned about (slow);
// b -> a holds the reverse four, the worst at 0.90x; links inside a host are left out.
TEST_F(DashboardBrowser, HostMatrixGroupsLinksByHostAndShowsTheWorst) {
  const fs::path run = dir_.path / "hosts";
  fs::create_directories(run);
  const char* host[4] = {"host-a", "host-a", "host-b", "host-b"};
  nlohmann::json mesh = {{"type", "mesh"}, {"tp", 1}, {"pp", 1}, {"dp", 4}, {"order", "tp-dp-pp"},
                         {"ranks", nlohmann::json::array()}};
  for (int r = 0; r < 4; ++r) mesh["ranks"].push_back({{"rank", r}, {"tp", 0}, {"pp", 0}, {"dp", r}, {"host", host[r]}});
  std::ofstream m(run / "metrics.jsonl");
  m << mesh.dump() << "\n";
  std::ofstream h(run / "health.jsonl");
  for (int s = 0; s < 4; ++s) {
    auto step = nlohmann::json::parse(test::synthetic_step(s, 3.0));
    if (s == 3)  // the monitor's warning, in the step record of the round the matrix shows
      step["health"] = {{{"kind", "slow_link"}, {"src", 1}, {"dst", 3}, {"ratio", 0.4}, {"since_step", 2},
                         {"message", "link host-a/rank 1 -> host-b/rank 3 at 0.40x its bandwidth since step 2"}}};
    m << step.dump() << "\n";
    nlohmann::json round = {{"step", s}, {"time", 1.8e9 + s}, {"links", nlohmann::json::array()}, {"ranks", nlohmann::json::array()}};
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) {
        if (a == b) continue;
        // 1 -> 3 slows to 0.4x at step 2; 3 -> 1 reads 0.9x; 0 -> 1 (inside host-a) 0.2x, which no host cell shows.
        const double ratio = a == 1 && b == 3 && s >= 2 ? 0.4 : a == 3 && b == 1 ? 0.9 : a == 0 && b == 1 ? 0.2 : 1.0;
        round["links"].push_back({{"src", a}, {"dst", b}, {"gbps", ratio}, {"baseline_gbps", 1.0}});
      }
    h << round.dump() << "\n";
  }
  m.close();
  h.close();
  const fs::path html = dir_.path / "hosts.html";
  write_html_file(html.string(), render_report({run.string()}), "test");
  const std::string dom = dump_dom(chromium_, "file://" + html.string(), dir_.path / "profile", 1000);
  EXPECT_NE(dom.find("<table class=\"matrix hosts\" data-run=\"hosts\">"), std::string::npos) << dom.substr(0, 3000);
  EXPECT_NE(dom.find("<td class=\"slow\" data-hosts=\"host-a|host-b\" data-links=\"4\" data-ratio=\"0.40\""),
            std::string::npos);
  EXPECT_NE(dom.find("<td class=\"ok\" data-hosts=\"host-b|host-a\" data-links=\"4\" data-ratio=\"0.90\""),
            std::string::npos);
  // The rank x rank matrix still shows every link, the one inside host-a too.
  EXPECT_NE(dom.find("data-link=\"0-1\" data-ratio=\"0.20\""), std::string::npos);
  EXPECT_NE(dom.find("<td class=\"slow\" data-link=\"1-3\" data-ratio=\"0.40\""), std::string::npos);
}

// The polling fallback: a dashboard that serves no event streams (--max-streams 0, as one at its limit
// answers 503) leaves the page polling, and the steps the run appends while the page is open still arrive:
// more than one poll brings records (data-polled), none came as pushes (no data-events), and the loss
// chart holds more points than the file had when the page opened.
TEST_F(DashboardBrowser, PollsWhenTheStreamIsRefusedAndStillUpdates) {
  const fs::path run = dir_.path / "polled";
  test::write_synthetic_run(run, 5, false);
  const std::string url = start_dashboard({run.string()}, {"--max-streams", "0"});
  std::atomic<bool> done{false};
  int appended = 0;
  std::thread writer([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::ofstream(run / "metrics.jsonl", std::ios::app) << test::synthetic_step(5 + appended, 3.0);
      ++appended;
    }
  });
  // Virtual time: the page's 1 s poll timer runs at once, the polls' fetches in real time (a few ms each),
  // while a step is appended every 10 ms.
  const std::string dom = dump_dom(chromium_, url, dir_.path / "profile", 4000);
  done = true;
  writer.join();
  EXPECT_NE(dom.find("live (polling)"), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(dom.find("data-events="), std::string::npos) << "records were pushed, not polled";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("<body[^>]* data-polled=\"([0-9]+)\""))) << dom.substr(0, 2000);
  EXPECT_GE(std::stoi(m[1]), 2) << "one poll brought records, no later one did";
  const int points = std::stoi(attr_of(dom, "chart-loss", "data-points"));
  EXPECT_GT(points, 5);
  EXPECT_LE(points, 5 + appended);
}

}  // namespace
}  // namespace trident::dashboard
