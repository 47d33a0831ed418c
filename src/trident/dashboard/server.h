// `trident dashboard`: an HTTP server (cpp-httplib) of one page that shows training runs while they train,
// and `trident report`: the same page as one self-contained HTML file.
//
// What it serves, and nothing else (every other path is a 404; only GET and HEAD):
//   /                               the page (page/index.html), its scripts as files below
//   /assets/<name>                  a fixed table: the page's script and style, uPlot's (npm, scripts/deps.sh)
//   /api/runs                       {"runs": [RunFolder::summary()...]}
//   /api/runs/<id>/records?generation=G&from=N&max_points=M
//                                   RunFolder::records_since(G, N, M); the page polls it with the `next`
//                                   and `generation` of the previous answer (a rewritten file starts over)
//                                   when it cannot open the event stream
//   /api/runs/<id>/health?generation=G&from=N&max_points=M
//                                   RunFolder::health_since(G, N, M): the health monitor's rounds, likewise
//   /api/events                     text/event-stream of every run's new records, new health rounds and
//                                   changed summaries
//                                   (dashboard/event_stream.h), resumed from a Last-Event-ID header; a
//                                   malformed one is a 400, and past `max_streams` open streams a 503
// No part of a request names a file: the run folders are the ones given at start, addressed by index, and
// the server reads only their metrics.jsonl, health.jsonl, latest checkpoint's checkpoint.json and
// flight-recorder dumps.
// A bad query value or an unknown run id is a 400 or 404 with a JSON {"error": ...} naming the fix; the
// library answers an oversized request line or header (8 KiB) with a 4xx itself.
//
// Ownership: the server owns its RunFolders. Thread-safety: the library's worker threads call handlers
// concurrently (RunFolder locks); stop() may be called from any thread. Blocking: serve() blocks until
// stop(), which ends the open event streams within a tick. Threads: a worker per connection, so the pool
// holds max_streams streams and 16 more workers for the other requests. Timeouts: 5 s to read a request or
// write a response (a stream's client that stops reading is dropped after 5 s). Errors: the constructor
// throws InvalidArgument naming a run folder that does not exist or holds no metrics (and the fix); bind()
// throws IoError naming host:port.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/dashboard/event_stream.h"

namespace httplib {
class Server;
}

namespace trident::dashboard {

class RunFolder;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless the user says otherwise
  int port = 8080;                 // 0: any free port (bind() returns it)
  size_t default_max_points = 2000;  // step records sent on a first load before thinning
  int max_streams = 64;              // open event streams (each holds a worker thread)
  StreamOptions stream;              // its first_max_points is set from default_max_points
};

class DashboardServer {
 public:
  DashboardServer(const std::vector<std::string>& run_dirs, ServerOptions options);
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;
  // Binds host:port; returns the port bound.
  int bind();
  void serve();  // answers requests until stop()
  // Ends serve(); a stop() before serve() has started is lost, so callers on other threads wait for running().
  void stop();
  bool running() const;
  int active_streams() const;  // event streams open now (a departed client's stream ends within a keep-alive)

 private:
  void routes();
  ServerOptions o_;
  uint64_t server_id_;  // this process's instance number in event ids (another process's ids start over)
  StreamHub hub_;
  std::vector<std::unique_ptr<RunFolder>> runs_;
  std::unique_ptr<httplib::Server> http_;
};

// The page with its scripts, styles and the runs' data inlined: opens offline, from a file.
// `max_points`: step records kept per run (downsample_indices).
std::string render_report(const std::vector<std::string>& run_dirs, size_t max_points = 5000);

// The page as the server sends it (scripts as /assets/ files). For tests.
std::string served_page();

// True when this build embedded uPlot (found by CMake under `npm root -g` at configure time).
bool have_chart_library();

}  // namespace trident::dashboard
