#include "trident/dashboard/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string_view>

#include "trident/core/error.h"
#include "trident/dashboard/assets.h"
#include "trident/dashboard/page_file.h"
#include "trident/dashboard/run_data.h"

namespace trident::dashboard {

namespace {

constexpr const char* kJson = "application/json";

struct Asset {
  const char* name;
  const char* content_type;
  const char* text;
};

// The only files the server sends: everything else is a 404.
const Asset kAssets[] = {
    {"dashboard.js", "text/javascript; charset=utf-8", assets::kDashboardJs},
    {"dashboard.css", "text/css; charset=utf-8", assets::kDashboardCss},
    {"charts.js", "text/javascript; charset=utf-8", assets::kChartsJs},
    {"uPlot.iife.min.js", "text/javascript; charset=utf-8", assets::kUplotJs},
    {"uPlot.min.css", "text/css; charset=utf-8", assets::kUplotCss},
};

// A non-negative integer query parameter: absent gives `fallback`; anything else than decimal digits within
// [0, max] is an error message naming the parameter.
std::optional<uint64_t> query_uint(const httplib::Request& req, const char* name, uint64_t fallback, uint64_t max,
                                   std::string& error) {
  if (!req.has_param(name)) return fallback;
  const std::string v = req.get_param_value(name);
  uint64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || x > max) {
    error = "query parameter '" + std::string(name) + "' must be an integer from 0 to " + std::to_string(max) +
            ", not '" + v.substr(0, 40) + "'";
    return std::nullopt;
  }
  return x;
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json{{"error", message}}.dump(), kJson);
}

}  // namespace

bool have_chart_library() { return assets::kHaveUplot; }

std::string served_page() {
  return fill_page(assets::kIndexHtml,
                   "<link rel=\"stylesheet\" href=\"/assets/uPlot.min.css\">\n"
                   "<link rel=\"stylesheet\" href=\"/assets/dashboard.css\">",
                   "<script src=\"/assets/uPlot.iife.min.js\"></script>\n"
                   "<script src=\"/assets/charts.js\"></script>\n"
                   "<script src=\"/assets/dashboard.js\"></script>");
}

std::string render_report(const std::vector<std::string>& run_dirs, size_t max_points) {
  nlohmann::json data = {{"runs", nlohmann::json::array()}};
  int id = 0;
  for (const auto& d : run_dirs) {
    RunFolder run(d, id++);
    nlohmann::json r = run.summary();
    r["data"] = run.records_since(0, 0, max_points);
    r["health"] = run.health_since(0, 0, max_points);
    data["runs"].push_back(std::move(r));
  }
  return inline_page(assets::kIndexHtml, "TRIDENT_REPORT", data, assets::kDashboardJs);
}

DashboardServer::DashboardServer(const std::vector<std::string>& run_dirs, ServerOptions options)
    : o_(std::move(options)),
      server_id_(std::random_device{}() & 0x7fffffffu),
      hub_(o_.max_streams),
      http_(std::make_unique<httplib::Server>()) {
  o_.stream.first_max_points = o_.default_max_points;
  if (run_dirs.empty()) TRIDENT_THROW(InvalidArgument, "dashboard: name at least one run folder (a train --out_dir)");
  if (!have_chart_library())
    TRIDENT_THROW(InvalidArgument, "this trident was built without uPlot, which the page draws its charts with: run "
                                   "scripts/deps.sh build (npm's uplot), re-run cmake and rebuild");
  int id = 0;
  for (const auto& d : run_dirs) runs_.push_back(std::make_unique<RunFolder>(d, id++));
  // A write to a client that hung up (an event stream's, most often) must fail, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  routes();
}

DashboardServer::~DashboardServer() { stop(); }

void DashboardServer::routes() {
  auto& s = *http_;
  // The library's default also sets SO_REUSEPORT, under which a second dashboard on a port in use would
  // bind too and share its connections; SO_REUSEADDR alone lets a restarted one bind at once and still
  // refuses a port another server listens on.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Each connection holds a worker: event streams for as long as the page is open, other requests for a
  // keep-alive second at most.
  const size_t workers = static_cast<size_t>(std::max(o_.max_streams, 0)) + 16;
  s.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  s.set_keep_alive_timeout(1);
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.set_payload_max_length(64 << 10);  // GET requests carry no body worth reading
  s.set_default_headers({{"X-Content-Type-Options", "nosniff"},
                         {"Cache-Control", "no-store"},
                         {"Content-Security-Policy",
                          "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"}});
  // A handler's exception is a 500 naming it, never a dead server.
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, "dashboard: " + what);
  });
  // Unmatched paths (traversal attempts included: no route takes a path) and other methods.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty())
      send_error(res, res.status,
                 res.status == 404 ? "not found: the dashboard serves /, /assets/<its files>, /api/runs, "
                                     "/api/runs/<id>/records, /api/runs/<id>/health and /api/events"
                                   : "bad request");
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(served_page(), "text/html; charset=utf-8");
  });
  s.Get("/index.html", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(served_page(), "text/html; charset=utf-8");
  });
  s.Get(R"(/assets/([A-Za-z0-9._-]+))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    for (const Asset& a : kAssets)
      if (name == a.name) {
        res.set_content(a.text, a.content_type);
        return;
      }
    send_error(res, 404, "no asset '" + name + "'");
  });
  s.Get("/api/runs", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json j = {{"runs", nlohmann::json::array()}};
    for (auto& r : runs_) j["runs"].push_back(r->summary());
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), kJson);
  });
  s.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) {
    std::vector<StreamCursor> from(runs_.size());
    if (req.has_header("Last-Event-ID")) {
      std::string err;
      auto parsed = parse_last_event_id(req.get_header_value("Last-Event-ID"), server_id_, runs_.size(), err);
      if (!parsed) return send_error(res, 400, err);
      from = std::move(*parsed);
    }
    if (!hub_.try_enter()) {
      res.set_header("Retry-After", "5");
      return send_error(res, 503,
                        "dashboard: " + std::to_string(o_.max_streams) +
                            " event streams are open (one per page): close a page, or poll /api/runs/<id>/records");
    }
    std::vector<RunFolder*> runs;
    for (auto& r : runs_) runs.push_back(r.get());
    auto stream = std::make_shared<EventStream>(std::move(runs), std::move(from), server_id_, o_.stream, hub_);
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t, httplib::DataSink& sink) {
          try {
            return stream->pump([&sink](const std::string& text) { return sink.write(text.data(), text.size()); });
          } catch (const std::exception&) {
            return false;  // the library would not catch it here: end this stream, keep the server
          }
        },
        [this](bool) { hub_.leave(); });
  });
  // A run's records of metrics.jsonl or of health.jsonl, from a cursor (the page's polling fallback).
  for (const bool health : {false, true}) {
    const std::string path = health ? R"(/api/runs/([0-9]{1,9})/health)" : R"(/api/runs/([0-9]{1,9})/records)";
    s.Get(path, [this, health](const httplib::Request& req, httplib::Response& res) {
      const long id = std::stol(req.matches[1]);
      if (id < 0 || id >= static_cast<long>(runs_.size()))
        return send_error(res, 404,
                          "no run " + std::to_string(id) + ": this dashboard serves runs 0.." +
                              std::to_string(runs_.size() - 1) + " (/api/runs lists them)");
      std::string err;
      const auto gen = query_uint(req, "generation", 0, std::numeric_limits<uint32_t>::max(), err);
      const auto from = query_uint(req, "from", 0, std::numeric_limits<uint32_t>::max(), err);
      const auto maxp = query_uint(req, "max_points", o_.default_max_points, 1'000'000, err);
      if (!gen || !from || !maxp) return send_error(res, 400, err);
      RunFolder& run = *runs_[static_cast<size_t>(id)];
      const auto j = health ? run.health_since(*gen, *from, *maxp) : run.records_since(*gen, *from, *maxp);
      res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), kJson);
    });
  }
}

int DashboardServer::bind() {
  if (o_.port < 0 || o_.port > 65535)
    TRIDENT_THROW(InvalidArgument, "dashboard: --port {} is not a port (1-65535, or 0 for any free one)", o_.port);
  if (o_.port == 0) {
    const int port = http_->bind_to_any_port(o_.host);
    if (port <= 0)
      TRIDENT_THROW(IoError, "dashboard: cannot listen on {}: not an address of this machine? (--host)", o_.host);
    return port;
  }
  if (!http_->bind_to_port(o_.host, o_.port))
    TRIDENT_THROW(IoError,
                  "dashboard: cannot listen on {}:{}: the port is in use or the address is not this machine's; "
                  "pick another with --port (0: any free port) or --host",
                  o_.host, o_.port);
  return o_.port;
}

void DashboardServer::serve() { http_->listen_after_bind(); }

bool DashboardServer::running() const { return http_->is_running(); }

int DashboardServer::active_streams() const { return hub_.active(); }

void DashboardServer::stop() {
  hub_.stop();
  if (http_) http_->stop();
}

}  // namespace trident::dashboard
