// The figure pages that `trident bench comm --html`, `trident plan --html` and `trident simulate --html`
// write (dashboard/page_file.h, bench/bench_page.h, plan/plan_page.h), run as a user runs them: the file
// exists, fetches nothing (no script or style from the network or a server path), and holds every row of
// the benchmark's JSON (and of a peer's table) and every layout the planner printed; a path whose file
// cannot be written is an error naming it, given before any work.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "harness/temp_dir.h"
#include "unit/launch/process_runner.h"

namespace trident::dashboard {
namespace {

namespace fs = std::filesystem;
using trident::testing::ProcessRunner;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the trident binary; returns its exit status (-1: did not exit) with its output in `out`.
int run_trident(const std::vector<std::string>& args, std::string* out, double guard_s = 60) {
  std::vector<std::string> argv = {TRIDENT_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessRunner p(argv, trident::testing::make_env({}, {}));
  const auto st = p.wait(guard_s);
  *out = p.out() + p.err();
  return st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
}

// The page opens offline: no element loads anything (no src= or href= at all, no <link>), and no URL of
// the network appears in a script or style reference.
void expect_self_contained(const std::string& html) {
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_FALSE(std::regex_search(html, std::regex(R"(<script[^>]*\ssrc\s*=)"))) << "a script is fetched";
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_NE(html.find("uPlot"), std::string::npos) << "the chart library is not inlined";
}

// The figures spec the page carries (window.TRIDENT_FIGURES = {...};).
nlohmann::json figures_of(const std::string& html) {
  const std::string key = "window.TRIDENT_FIGURES = ";
  const size_t at = html.find(key);
  if (at == std::string::npos) return nullptr;
  const size_t from = at + key.size(), to = html.find(";</script>", from);
  return nlohmann::json::parse(html.substr(from, to - from), nullptr, false);
}

const nlohmann::json* figure(const nlohmann::json& spec, const std::string& id) {
  for (const auto& f : spec["figures"])
    if (f["id"] == id) return &f;
  return nullptr;
}

// busbw at `size` on the line `label` of figure `id`, or -1.
double point(const nlohmann::json& spec, const std::string& id, const std::string& label, double size) {
  const nlohmann::json* f = figure(spec, id);
  if (!f) return -1;
  for (const auto& s : (*f)["series"])
    if (s["label"] == label)
      for (size_t i = 0; i < s["x"].size(); ++i)
        if (s["x"][i].get<double>() == size) return s["y"][i].get<double>();
  return -1;
}

TEST(FigurePages, BenchCommHtmlHoldsEveryRowAndAPeersTable) {
  trident::testing::TempDir d("fig-bench");
  // A peer's own table as ../shared/peers' mpi_bench prints it (a header, then one row per size).
  const fs::path peer = d.path / "mpi.txt";
  std::ofstream(peer) << "# name size count iters us_avg us_max algbw busbw check\n"
                         "allreduce 8 2 10 5.0 6.0 0.001 0.0016 ok\n"
                         "allreduce 4096 1024 10 9.0 9.5 0.45 0.91 ok\n";
  const fs::path json = d.path / "bench.json", html = d.path / "busbw.html";
  std::string out;
  ASSERT_EQ(run_trident({"bench", "comm", "--nproc", "2", "--op", "all_reduce,all_gather", "--algo", "ring,auto", "-b",
                         "8", "-e", "4K", "-f", "8", "--iters", "2", "--warmup", "1", "--json", json.string(), "--html",
                         html.string(), "--peer", "openmpi=" + peer.string()},
                        &out),
            0)
      << out;
  ASSERT_TRUE(fs::exists(html)) << out;
  const std::string page = slurp(html);
  expect_self_contained(page);
  const nlohmann::json spec = figures_of(page);
  ASSERT_TRUE(spec.is_object()) << "no figures in the page";
  // Every (op, algorithm, size) row of the JSON is a point of its line, at the faster placement's busbw.
  std::map<std::tuple<std::string, std::string, double>, double> best;
  const nlohmann::json rows = nlohmann::json::parse(slurp(json));
  ASSERT_GE(rows.size(), 16u);  // 2 ops x 2 algorithms x 4 sizes x 2 placements
  for (const auto& r : rows) {
    const std::string line = "trident " + (r["algo_forced"].get<bool>() ? r["algo"].get<std::string>() : "auto");
    double& b = best[{r["op"].get<std::string>(), line, r["size"].get<double>()}];
    b = std::max(b, r["busbw"].get<double>());
  }
  for (const auto& [k, busbw] : best) {
    const auto& [op, line, size] = k;
    EXPECT_DOUBLE_EQ(point(spec, "busbw-" + op, line, size), busbw) << op << " " << line << " size " << size;
  }
  // The peer's rows, on its own line of the all_reduce chart.
  EXPECT_DOUBLE_EQ(point(spec, "busbw-all_reduce", "openmpi", 8), 0.0016);
  EXPECT_DOUBLE_EQ(point(spec, "busbw-all_reduce", "openmpi", 4096), 0.91);
  EXPECT_EQ(spec["figures"].size(), 2u);
}

TEST(FigurePages, PlanHtmlShowsEachLayoutsMemoryStepAndTraffic) {
  trident::testing::TempDir d("fig-plan");
  const fs::path html = d.path / "plan.html";
  std::string out;
  ASSERT_EQ(run_trident({"plan", "--model", "gpt2", "--gpus", "8", "--global-batch", "64", "--top", "6", "--json",
                         "--html", html.string()},
                        &out),
            0)
      << out;
  const std::string page = slurp(html);
  expect_self_contained(page);
  const nlohmann::json spec = figures_of(page);
  ASSERT_TRUE(spec.is_object());
  const nlohmann::json plan = nlohmann::json::parse(out.substr(0, out.rfind('}') + 1));
  const auto& cands = plan["candidates"];
  const nlohmann::json* mem = figure(spec, "memory");
  const nlohmann::json* step = figure(spec, "step");
  const nlohmann::json* comm = figure(spec, "comm");
  ASSERT_TRUE(mem && step && comm);
  ASSERT_EQ((*mem)["labels"].size(), 6u);
  ASSERT_EQ(spec["tables"][0]["rows"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    // Each bar stacks the layout's memory components (GB) as the planner printed them.
    for (const auto& part : (*mem)["parts"]) {
      const std::string c = part["label"];
      EXPECT_NEAR(part["values"][i].get<double>(), cands[i]["memory"][c].get<double>() / 1e9, 1e-9) << c << " #" << i;
    }
    // The step: compute, exposed communication and bubble, beside the predicted step.
    EXPECT_NEAR((*step)["parts"][0]["values"][i].get<double>(), cands[i]["compute_s"].get<double>(), 1e-12);
    EXPECT_NEAR((*step)["parts"][2]["values"][i].get<double>(), cands[i]["bubble_s"].get<double>(), 1e-12);
    EXPECT_NEAR((*step)["lines"][0]["values"][i].get<double>(), cands[i]["step_time_s"].get<double>(), 1e-12);
    double bytes = 0, drawn = 0;
    for (const auto& c : cands[i]["comm"]) bytes += c["bytes_per_gpu"].get<double>();
    for (const auto& part : (*comm)["parts"]) drawn += part["values"][i].get<double>();
    EXPECT_NEAR(drawn, bytes / 1e9, 1e-9) << "#" << i;
  }
}

TEST(FigurePages, UnwritablePathIsAnErrorNamingTheFileBeforeAnyWork) {
  trident::testing::TempDir d("fig-badpath");
  std::ofstream(d.path / "a-file") << "x";
  const std::string missing = (d.path / "no-such-folder" / "p.html").string();
  const std::string under_file = (d.path / "a-file" / "p.html").string();
  const std::string folder = d.path.string();
  struct Case {
    std::vector<std::string> args;
    std::string path, why;
  };
  const std::vector<Case> cases = {
      {{"bench", "comm", "--nproc", "2", "-b", "8", "-e", "8", "--html", missing}, missing, "does not exist"},
      {{"plan", "--model", "gpt2", "--gpus", "8", "--html", under_file}, under_file, "is a file, not a folder"},
      {{"simulate", "--model", "gpt2", "--gpus", "8", "--sweep", "strong", "--html", folder}, folder, "is a folder"},
      {{"report", folder, "--out", missing}, missing, "does not exist"},
  };
  for (const Case& c : cases) {
    std::string out;
    EXPECT_EQ(run_trident(c.args, &out), 2) << c.args[0] << ": " << out;
    EXPECT_NE(out.find("'" + c.path + "'"), std::string::npos) << c.args[0] << " does not name the file: " << out;
    EXPECT_NE(out.find(c.why), std::string::npos) << c.args[0] << ": " << out;
    EXPECT_EQ(out.find("busbw page written"), std::string::npos) << "the benchmark ran first: " << out;
  }
  std::string out;
  EXPECT_EQ(run_trident({"bench", "comm", "--nproc", "2", "--peer", "x=" + missing}, &out), 2) << out;
  EXPECT_NE(out.find("--peer overlays results on the --html page"), std::string::npos) << out;
  EXPECT_EQ(run_trident({"bench", "comm", "--nproc", "2", "--html", (d.path / "b.html").string(), "--peer",
                         "x=" + missing},
                        &out),
            2)
      << out;
  EXPECT_NE(out.find("cannot read '" + missing + "'"), std::string::npos) << out;
}

}  // namespace
}  // namespace trident::dashboard
