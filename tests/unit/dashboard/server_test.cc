// `trident dashboard`'s HTTP server, in process on an ephemeral port: its endpoints against the metrics
// file, incremental answers while the file grows and after it is rewritten, and hostile requests (path
// traversal, oversized headers, bad query values, unknown runs, other methods), each a 4xx that leaves the
// server answering. A second server on a port in use is refused. The event stream: each appended record
// arrives once, a reconnect with Last-Event-ID gets only later records, a rewritten file starts its run
// over, a malformed id is a 400, departed clients free their streams, and 50 clients at once are served.
// The health monitor's rounds (health.jsonl) likewise: served as the file holds them, pushed as "health"
// events once each, resumed from the same id.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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
    o.stream.tick_ms = 20;  // streams look for records every 20 ms and find a departed client in 100 ms
    o.stream.keepalive_ms = 50;
    o.stream.summary_ms = 100;
    o.stream.batch_records = 2;  // a resume of three records comes in two events
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

// One /api/events connection on its own thread, parsed into events as they arrive; closed by stop() or
// the destructor.
class EventClient {
 public:
  struct Event {
    std::string id, type;
    nlohmann::json data;
  };
  EventClient(int port, std::string last_event_id = "") {
    thread_ = std::thread([this, port, last_event_id] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(10, 0);
      httplib::Headers h;
      if (!last_event_id.empty()) h.emplace("Last-Event-ID", last_event_id);
      auto res = c.Get(
          "/api/events", h,
          [&](const httplib::Response& r) {
            std::lock_guard<std::mutex> lock(mu_);
            status_ = r.status;
            content_type_ = r.get_header_value("Content-Type");
            cv_.notify_all();
            return true;
          },
          [&](const char* d, size_t n) {
            std::lock_guard<std::mutex> lock(mu_);
            if (status_ != 200) {  // an error's JSON body
              error_body_.append(d, n);
              return true;
            }
            buf_.append(d, n);
            for (size_t end; (end = buf_.find("\n\n")) != std::string::npos; buf_.erase(0, end + 2)) parse(buf_.substr(0, end));
            cv_.notify_all();
            return !stop_;
          });
      std::lock_guard<std::mutex> lock(mu_);
      if (res && status_ == 0) status_ = res->status;
      done_ = true;
      cv_.notify_all();
    });
  }
  ~EventClient() { stop(); }
  // Hangs up at the next data (a keep-alive comes within the stream's keep-alive interval).
  void request_stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  void stop() {
    request_stop();
    if (thread_.joinable()) thread_.join();
  }
  // Waits (up to 10 s) until `pred(events)` holds; false on timeout.
  bool wait_until(const std::function<bool(const std::vector<Event>&)>& pred) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return pred(events_) || done_; }) && pred(events_);
  }
  std::vector<Event> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int status() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return status_ != 0 || done_; });
    return status_;
  }
  std::string content_type() {
    std::lock_guard<std::mutex> lock(mu_);
    return content_type_;
  }
  std::string error_body() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; });
    return error_body_;
  }

 private:
  void parse(const std::string& block) {
    Event e;
    std::istringstream in(block);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("id: ", 0) == 0) e.id = line.substr(4);
      if (line.rfind("event: ", 0) == 0) e.type = line.substr(7);
      if (line.rfind("data: ", 0) == 0) e.data = nlohmann::json::parse(line.substr(6), nullptr, false);
    }
    if (!e.type.empty()) events_.push_back(std::move(e));
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buf_, content_type_, error_body_;
  std::vector<Event> events_;
  int status_ = 0;
  bool stop_ = false, done_ = false;
  std::thread thread_;
};

// The step numbers of run `run`'s records events, in arrival order (a reset event clears them first).
std::vector<int> steps_of(const std::vector<EventClient::Event>& events, int run) {
  std::vector<int> steps;
  for (const auto& e : events) {
    if (e.type != "records" || e.data["run"] != run) continue;
    if (e.data["reset"].get<bool>()) steps.clear();
    for (const auto& r : e.data["records"])
      if (r.value("type", "") == "step") steps.push_back(r["step"]);
  }
  return steps;
}

// How many records events `run` got.
size_t records_events(const std::vector<EventClient::Event>& events, int run) {
  size_t n = 0;
  for (const auto& e : events) n += e.type == "records" && e.data["run"] == run;
  return n;
}

std::vector<int> range(int from, int to) {
  std::vector<int> v;
  for (int s = from; s < to; ++s) v.push_back(s);
  return v;
}

TEST_F(DashboardServerTest, EventStreamPushesEachAppendedRecordOnce) {
  EventClient es(port_);
  ASSERT_EQ(es.status(), 200);
  EXPECT_EQ(es.content_type(), "text/event-stream");
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return records_events(ev, 0) == 1 && records_events(ev, 1) == 1; }));
  {
    const auto ev = es.events();
    ASSERT_EQ(ev[0].type, "runs");  // the summaries come before any records
    EXPECT_EQ(ev[0].data["runs"].size(), 2u);
    EXPECT_EQ(steps_of(ev, 0), range(0, 40));
    EXPECT_EQ(steps_of(ev, 1), range(0, 25));
  }
  const fs::path f = dir_.path / "b" / "metrics.jsonl";
  std::ofstream(f, std::ios::app) << test::synthetic_step(25, 3.0) << test::synthetic_step(26, 2.9) << R"({"type":"st)";
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return steps_of(ev, 1).size() >= 27; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // several ticks: nothing more may come
  EXPECT_EQ(steps_of(es.events(), 1), range(0, 27));  // the half-written line is not sent
  std::ofstream(f, std::ios::app) << R"(ep","step":27,"loss":2.8})" "\n";
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return steps_of(ev, 1).size() >= 28; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const auto ev = es.events();
  EXPECT_EQ(steps_of(ev, 1), range(0, 28));
  EXPECT_EQ(steps_of(ev, 0), range(0, 40));  // run 0 did not grow: nothing sent for it
  EXPECT_EQ(records_events(ev, 0), 1u);
  // The summaries followed the growth (status and steps are pushed too).
  size_t last_runs = 0;
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].type == "runs") last_runs = i;
  EXPECT_EQ(ev[last_runs].data["runs"][1]["steps"], 28);
  // The stream stays open at the end of the test: stop() must end it (TearDown would hang otherwise).
}

TEST_F(DashboardServerTest, EventStreamResumesFromLastEventIdAndAfterARewrite) {
  std::string last_id;
  {
    EventClient es(port_);
    ASSERT_TRUE(es.wait_until([](const auto& ev) { return records_events(ev, 0) == 1 && records_events(ev, 1) == 1; }));
    for (const auto& e : es.events())
      if (!e.id.empty()) last_id = e.id;
  }
  ASSERT_FALSE(last_id.empty());
  const fs::path f = dir_.path / "b" / "metrics.jsonl";
  std::ofstream(f, std::ios::app) << test::synthetic_step(25, 3.0) << test::synthetic_step(26, 2.9)
                                  << test::synthetic_step(27, 2.8);
  {  // The browser reconnects with the last id it saw: only the three later records, each once.
    EventClient es(port_, last_id);
    ASSERT_EQ(es.status(), 200);
    ASSERT_TRUE(es.wait_until([](const auto& ev) { return steps_of(ev, 1).size() >= 3; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const auto ev = es.events();
    EXPECT_EQ(steps_of(ev, 1), range(25, 28));
    EXPECT_EQ(records_events(ev, 1), 2u);  // at most batch_records (2) records an event
    EXPECT_EQ(records_events(ev, 0), 0u);  // run 0 has nothing after the id
    for (const auto& e : ev)
      if (e.type == "records") {
        EXPECT_FALSE(e.data["reset"].get<bool>());
        last_id = e.id;
      }
  }
  // The run restarts from a checkpoint and rewrites its file shorter while no page listens: the run starts
  // over (reset), with the new file's records.
  test::write_synthetic_run(dir_.path / "b", 12, false);
  EventClient es(port_, last_id);
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return records_events(ev, 1) >= 1; }));
  auto ev = es.events();
  EXPECT_TRUE(ev.back().data["reset"].get<bool>());
  EXPECT_EQ(ev.back().data["records"].size(), lines_of(f));
  EXPECT_EQ(steps_of(ev, 1), range(0, 12));
  // And while it listens: another rewrite arrives as a reset event with the new file.
  // (The stream may see the file mid-rewrite: a reset with the records written so far, then the rest.)
  test::write_synthetic_run(dir_.path / "b", 5, false);
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return records_events(ev, 1) >= 2 && steps_of(ev, 1) == range(0, 5); }))
      << ::testing::PrintToString(steps_of(es.events(), 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(steps_of(es.events(), 1), range(0, 5));  // and nothing more (no record twice)
  // An id of another dashboard process (a restarted one): every run starts over.
  EventClient fresh(port_, "1" + last_id);  // another server number, the same cursors
  ASSERT_TRUE(fresh.wait_until([](const auto& ev) { return records_events(ev, 0) == 1 && records_events(ev, 1) == 1; }));
  EXPECT_EQ(steps_of(fresh.events(), 0), range(0, 40));
}

// The rounds of run `run`'s health events, as steps in arrival order (a reset event clears them first).
std::vector<int> rounds_of(const std::vector<EventClient::Event>& events, int run) {
  std::vector<int> steps;
  for (const auto& e : events) {
    if (e.type != "health" || e.data["run"] != run) continue;
    if (e.data["reset"].get<bool>()) steps.clear();
    for (const auto& r : e.data["records"]) steps.push_back(r["step"]);
  }
  return steps;
}

TEST_F(DashboardServerTest, HealthRoundsAreServedPushedOnceAndResumed) {
  // The endpoint: the file's rounds, record by record; a run without health.jsonl has none.
  auto h = get_json("/api/runs/0/health");
  const fs::path f = dir_.path / "a" / "health.jsonl";
  ASSERT_EQ(h["records"].size(), lines_of(f));
  std::ifstream in(f);
  size_t i = 0;
  for (std::string line; std::getline(in, line); ++i) EXPECT_EQ(h["records"][i], nlohmann::json::parse(line)) << i;
  EXPECT_EQ(h["records"][20]["links"][0]["gbps"], 0.3);
  EXPECT_TRUE(get_json("/api/runs/1/health")["records"].empty());
  get_json("/api/runs/9/health", 404);
  get_json("/api/runs/0/health?from=x", 400);
  // The stream: the rounds once, then an appended one (a torn line waits for its newline).
  std::string last_id;
  {
    EventClient es(port_);
    ASSERT_TRUE(es.wait_until([](const auto& ev) { return rounds_of(ev, 0).size() >= 40; }));
    const std::string torn = test::synthetic_round(40);
    std::ofstream(f, std::ios::app) << torn.substr(0, 30);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(rounds_of(es.events(), 0), range(0, 40));
    std::ofstream(f, std::ios::app) << torn.substr(30);
    ASSERT_TRUE(es.wait_until([](const auto& ev) { return rounds_of(ev, 0).size() >= 41; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const auto ev = es.events();
    EXPECT_EQ(rounds_of(ev, 0), range(0, 41));
    EXPECT_TRUE(rounds_of(ev, 1).empty());
    for (const auto& e : ev)
      if (!e.id.empty()) last_id = e.id;
  }
  // A reconnect with the last id gets only the rounds after it, and no metrics record again.
  std::ofstream(f, std::ios::app) << test::synthetic_round(41) << test::synthetic_round(42);
  EventClient es(port_, last_id);
  ASSERT_TRUE(es.wait_until([](const auto& ev) { return rounds_of(ev, 0).size() >= 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(rounds_of(es.events(), 0), range(41, 43));
  EXPECT_EQ(records_events(es.events(), 0), 0u);
}

TEST_F(DashboardServerTest, MalformedLastEventIdIsA400) {
  for (const std::string& id : std::vector<std::string>{"", "x", "1", "1:", "1:1", "1:1.2", "1:1.2,3.4,5.6", "1:1.2,x.4", "1:-1.2,1.2",
                               "1:1.2,1.99999999999", "99999999999999999999999:1.2,1.2", "1:1.2;1.2", "1:1.2,,1.2",
                               "1:1.2.3,1.2", "1:1.2.3.4.5,1.2.3.4", "1:1.2.3.,1.2",
                               std::string(4000, '9')}) {
    EventClient es(port_, id);
    if (id.empty()) {  // no header: a fresh stream
      EXPECT_EQ(es.status(), 200);
      continue;
    }
    EXPECT_EQ(es.status(), 400) << id;
    EXPECT_NE(es.error_body().find("Last-Event-ID"), std::string::npos) << id;
  }
  EXPECT_EQ(get_json("/api/runs")["runs"].size(), 2u);
}

TEST_F(DashboardServerTest, DepartedClientsFreeTheirStreamsAndFiftyAreServed) {
  std::vector<std::unique_ptr<EventClient>> clients;
  for (int i = 0; i < 50; ++i) clients.push_back(std::make_unique<EventClient>(port_));
  for (auto& c : clients)
    ASSERT_TRUE(c->wait_until([](const auto& ev) { return records_events(ev, 0) == 1 && records_events(ev, 1) == 1; }));
  EXPECT_EQ(server_->active_streams(), 50);
  EXPECT_EQ(get_json("/api/runs")["runs"].size(), 2u);  // other requests are still answered
  std::ofstream(dir_.path / "a" / "metrics.jsonl", std::ios::app) << test::synthetic_step(40, 3.0);
  for (auto& c : clients) ASSERT_TRUE(c->wait_until([](const auto& ev) { return steps_of(ev, 0).size() == 41; }));
  for (auto& c : clients) c->request_stop();
  clients.clear();  // every client hangs up
  for (int i = 0; i < 200 && server_->active_streams() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server_->active_streams(), 0);
}

TEST(DashboardEvents, StreamsPastTheLimitGetA503) {
  trident::testing::TempDir d("dash-limit");
  test::write_synthetic_run(d.path / "a", 5, false);
  ServerOptions o;
  o.port = 0;
  o.max_streams = 1;
  o.stream.keepalive_ms = 50;
  DashboardServer server({(d.path / "a").string()}, o);
  const int port = server.bind();
  std::thread t([&] { server.serve(); });
  for (int i = 0; i < 500 && !server.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  {
    EventClient first(port);
    ASSERT_EQ(first.status(), 200);
    EventClient second(port);
    EXPECT_EQ(second.status(), 503);
    EXPECT_NE(second.error_body().find("event streams are open"), std::string::npos);
  }
  server.stop();
  t.join();
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
