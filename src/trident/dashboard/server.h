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
// No part of a request names a file: the run folders are the ones given at start, addressed by index, and
// the server reads only their metrics.jsonl, latest checkpoint's checkpoint.json and flight-recorder dumps.
// A bad query value or an unknown run id is a 400 or 404 with a JSON {"error": ...} naming the fix; the
// library answers an oversized request line or header (8 KiB) with a 4xx itself.
//
// Ownership: the server owns its RunFolders. Thread-safety: the library's worker threads call handlers
// concurrently (RunFolder locks); stop() may be called from any thread. Blocking: serve() blocks until
// stop(). Timeouts: 5 s to read a request. Errors: the constructor throws InvalidArgument naming a run folder
// that does not exist or holds no metrics (and the fix); bind() throws IoError naming host:port.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace httplib {
class Server;
}

namespace trident::dashboard {

class RunFolder;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless the user says otherwise
  int port = 8080;                 // 0: any free port (bind() returns it)
  size_t default_max_points = 2000;  // step records sent on a first load before thinning
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

 private:
  void routes();
  ServerOptions o_;
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
