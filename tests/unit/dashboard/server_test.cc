// `trident dashboard`'s HTTP server, in process on an ephemeral port: its endpoints against the metrics
// file, incremental answers while the file grows and after it is rewritten, and hostile requests (path
// traversal, oversized headers, bad query values, unknown runs, other methods), each a 4xx that leaves the
// server answering. A second server on a port in use is refused.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/dashboard/server.h"
#include "harness/temp_dir.h"
#include "unit/dashboard/synthetic_run.h"

namespace trident::dashboard {
namespace {

namespace fs = std::filesystem;

// A server over two synthetic runs, serving on its own thread for the test's lifetime.
class DashboardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synthetic_run(dir_.path / "a", 40, /*slow_link=*/true);
    test::write_synthetic_run(dir_.path / "b", 25, /*slow_link=*/false);
    ServerOptions o;
    o.port = 0;
    server_ = std::make_unique<DashboardServer>(std::vector<std::string>{(dir_.path / "a").string(), (dir_.path / "b").string()}, o);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->serve(); });
    for (int i = 0; i < 500 && !server_->running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(server_->running());
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    return c;
  }
  nlohmann::json get_json(const std::string& path, int want_status = 200) {
    auto c = client();
    auto res = c.Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return {};
    EXPECT_EQ(res->status, want_status) << path << ": " << res->body;
    return nlohmann::json::parse(res->body, nullptr, false);
  }
  trident::testing::TempDir dir_{"dash-server"};
  std::unique_ptr<DashboardServer> server_;
  std::thread thread_;
  int port_ = 0;
};

size_t lines_of(const fs::path& f) {
  std::ifstream in(f);
  size_t n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

TEST_F(DashboardServerTest, RunsAndRecordsMatchTheMetricsFile) {
  auto runs = get_json("/api/runs");
  ASSERT_EQ(runs["runs"].size(), 2u);
  EXPECT_EQ(runs["runs"][0]["name"], "a");
  EXPECT_EQ(runs["runs"][0]["steps"], 40);
  EXPECT_EQ(runs["runs"][0]["evals"], 4);
  EXPECT_EQ(runs["runs"][1]["steps"], 25);
  EXPECT_EQ(runs["runs"][0]["checkpoint"]["model"]["n_layer"], 4);
  auto recs = get_json("/api/runs/0/records");
  EXPECT_EQ(recs["next"].get<size_t>(), lines_of(dir_.path / "a" / "metrics.jsonl"));
  // Record by record the same JSON as the file's lines.
  std::ifstream in(dir_.path / "a" / "metrics.jsonl");
  size_t i = 0;
  for (std::string line; std::getline(in, line); ++i) {
    ASSERT_LT(i, recs["records"].size());
    EXPECT_EQ(recs["records"][i], nlohmann::json::parse(line)) << "line " << i;
  }
  EXPECT_EQ(i, recs["records"].size());
}

TEST_F(DashboardServerTest, PollsGetAppendedRecordsAndStartOverAfterARewrite) {
  const fs::path f = dir_.path / "b" / "metrics.jsonl";
  auto first = get_json("/api/runs/1/records");
  const size_t next = first["next"];
  const uint64_t gen = first["generation"];
  std::ofstream(f, std::ios::app) << test::synthetic_step(25, 3.0) << test::synthetic_step(26, 2.9) << R"({"type":"st)";
  auto second = get_json("/api/runs/1/records?generation=" + std::to_string(gen) + "&from=" + std::to_string(next));
  EXPECT_FALSE(second["reset"].get<bool>());
  ASSERT_EQ(second["records"].size(), 2u);  // the half-written third line is not served
  EXPECT_EQ(second["records"][1]["step"], 26);
  EXPECT_EQ(second["next"].get<size_t>(), next + 2);
  // Restarted from a checkpoint: the file is rewritten shorter.
  test::write_synthetic_run(dir_.path / "b", 12, false);
  auto third = get_json("/api/runs/1/records?generation=" + std::to_string(gen) + "&from=" + std::to_string(next + 2));
  EXPECT_TRUE(third["reset"].get<bool>());
  EXPECT_GT(third["generation"].get<uint64_t>(), gen);
  EXPECT_EQ(third["next"].get<size_t>(), lines_of(f));
  EXPECT_EQ(third["records"].size(), lines_of(f));
  EXPECT_GE(get_json("/api/runs")["runs"][1]["restarts"].get<int>(), 1);
}

TEST_F(DashboardServerTest, ServesThePageAndItsAssets) {
  auto c = client();
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("/assets/uPlot.iife.min.js"), std::string::npos);
  EXPECT_NE(page->body.find("/assets/dashboard.js"), std::string::npos);
  for (const char* a : {"/assets/uPlot.iife.min.js", "/assets/uPlot.min.css", "/assets/dashboard.js", "/assets/dashboard.css"}) {
    auto r = c.Get(a);
    ASSERT_TRUE(r) << a;
    EXPECT_EQ(r->status, 200) << a;
    EXPECT_GT(r->body.size(), 500u) << a;
  }
  EXPECT_NE(c.Get("/assets/uPlot.iife.min.js")->body.find("uPlot"), std::string::npos);
}

TEST_F(DashboardServerTest, HostileRequestsGetA4xxAndNeverAFileOutside) {
  auto c = client();
  // Traversal, plain and percent-encoded, through every route; absolute paths; a file of the run folder.
  for (const char* path : {"/../../etc/passwd", "/assets/../../../etc/passwd", "/assets/..%2f..%2f..%2fetc%2fpasswd",
                           "/assets/%2e%2e/%2e%2e/etc/passwd", "/api/runs/0/../../../../etc/passwd",
                           "/api/runs/0/records/../../../etc/passwd", "//etc/passwd", "/etc/passwd",
                           "/api/runs/0/metrics.jsonl", "/a/metrics.jsonl", "/assets/", "/assets/.htaccess",
                           "/api/runs/0/latest", "/index.html/../../etc/passwd"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_GE(r->status, 400) << path;
    EXPECT_LT(r->status, 500) << path;
    EXPECT_EQ(r->body.find("root:"), std::string::npos) << path;
    EXPECT_EQ(r->body.find("\"type\":\"step\""), std::string::npos) << path;
  }
  // Unknown runs and bad query values: 404 / 400 with a JSON error that says what to do.
  auto unknown = get_json("/api/runs/2/records", 404);
  EXPECT_NE(unknown["error"].get<std::string>().find("runs 0..1"), std::string::npos);
  get_json("/api/runs/999999999/records", 404);
  get_json("/api/runs/-1/records", 404);
  get_json("/api/runs/1x/records", 404);
  for (const char* q : {"from=-1", "from=abc", "from=", "from=1e3", "generation=99999999999999999999999",
                        "max_points=0x10", "from=12%00", "max_points=2000000"}) {
    auto e = get_json(std::string("/api/runs/0/records?") + q, 400);
    EXPECT_TRUE(e.contains("error")) << q;
  }
  // An oversized header and request line: refused by the library.
  httplib::Headers big = {{"X-Big", std::string(64 << 10, 'a')}};
  auto r = c.Get("/api/runs", big);
  EXPECT_TRUE(!r || (r->status >= 400 && r->status < 500)) << (r ? r->status : 0);
  auto c2 = client();
  auto longuri = c2.Get(("/api/runs?x=" + std::string(32 << 10, 'b')).c_str());
  EXPECT_TRUE(!longuri || (longuri->status >= 400 && longuri->status < 500));
  // Writes are not served.
  auto c3 = client();
  auto post = c3.Post("/api/runs", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_GE(post->status, 400);
  EXPECT_LT(post->status, 500);
  // And the server still answers.
  EXPECT_EQ(get_json("/api/runs")["runs"].size(), 2u);
}

TEST_F(DashboardServerTest, APortInUseIsAnErrorNamingIt) {
  ServerOptions o;
  o.port = port_;
  DashboardServer second({(dir_.path / "a").string()}, o);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << port_ << ", which the first one listens on";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port_)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--port"), std::string::npos) << e.what();
  }
}

TEST(DashboardServerStart, RefusesAFolderThatIsNotARun) {
  trident::testing::TempDir d("dash-start");
  ServerOptions o;
  o.port = 0;
  EXPECT_THROW(DashboardServer({(d.path / "nope").string()}, o), InvalidArgument);
  EXPECT_THROW(DashboardServer({d.path.string()}, o), InvalidArgument);
  EXPECT_THROW(DashboardServer(std::vector<std::string>{}, o), InvalidArgument);
}

TEST(DashboardReport, IsOneFileWithTheDataInlinedAndNoScriptBreakout) {
  trident::testing::TempDir d("dash-report");
  test::write_synthetic_run(d.path / "a", 30, true);
  // A record whose text would close the <script> element if inlined as is.
  std::ofstream(d.path / "a" / "metrics.jsonl", std::ios::app) << R"({"type":"note","text":"</script><script>alert(1)</script>"})" "\n";
  const std::string html = render_report({(d.path / "a").string()});
  EXPECT_EQ(html.find("src=\"/assets"), std::string::npos);   // nothing to fetch
  EXPECT_EQ(html.find("href=\"/assets"), std::string::npos);
  EXPECT_NE(html.find("window.TRIDENT_REPORT"), std::string::npos);
  EXPECT_NE(html.find("<\\/script><script>alert(1)<\\/script>"), std::string::npos);
  EXPECT_EQ(html.find("</script><script>alert(1)"), std::string::npos);
}

}  // namespace
}  // namespace trident::dashboard
