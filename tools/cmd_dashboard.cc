// `trident dashboard RUN_DIR...`: a live page of the runs' loss, speed, step time, memory and health
// (dashboard/server.h); `trident report RUN_DIR... --out FILE`: the same page as one self-contained file.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "trident/core/error.h"
#include "trident/dashboard/page_file.h"
#include "trident/dashboard/server.h"

namespace trident::cli {
namespace cmd_dashboard {
namespace {

struct DashboardCli {
  std::vector<std::string> dirs;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string out;
  size_t max_points = 5000;
  int max_streams = 64;
};

void setup_dashboard(CLI::App& app) {
  auto o = std::make_shared<DashboardCli>();
  auto* sub = app.add_subcommand(
      "dashboard", "serve a live page of training runs (loss, speed, step time, memory, health) over HTTP");
  sub->add_option("run_dirs", o->dirs, "run folders (a trident train --out_dir each; several are overlaid)")
      ->required();
  sub->add_option("--host", o->host, "address to listen on (the default serves this machine only)")
      ->default_val("127.0.0.1");
  sub->add_option("--port", o->port, "port to listen on (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->default_val(8080);
  sub->add_option("--max-streams", o->max_streams,
                  "event streams served at once (one per open page; past it, and with 0, pages poll instead)")
      ->check(CLI::Range(0, 1024))
      ->default_val(64);
  sub->callback([o] {
    dashboard::ServerOptions so;
    so.host = o->host;
    so.port = o->port;
    so.max_streams = o->max_streams;
    dashboard::DashboardServer server(o->dirs, so);
    const int port = server.bind();
    const std::string shown = o->host.find(':') != std::string::npos ? "[" + o->host + "]" : o->host;
    std::printf("dashboard: http://%s:%d/ (%zu run%s; Ctrl-C stops it)\n", shown.c_str(), port, o->dirs.size(),
                o->dirs.size() == 1 ? "" : "s");
    std::fflush(stdout);
    server.serve();
    set_exit_code(0);
  });
}

void setup_report(CLI::App& app) {
  auto o = std::make_shared<DashboardCli>();
  auto* sub = app.add_subcommand(
      "report", "write the dashboard's page of training runs as one self-contained HTML file (opens offline)");
  sub->add_option("run_dirs", o->dirs, "run folders (a trident train --out_dir each)")->required();
  sub->add_option("--out", o->out, "the HTML file to write")->required();
  sub->add_option("--max-points", o->max_points, "step records kept per run (longer runs are thinned evenly)")
      ->check(CLI::Range(2, 1000000))
      ->default_val(5000);
  sub->callback([o] {
    dashboard::check_html_path(o->out, "--out");
    const std::string html = dashboard::render_report(o->dirs, o->max_points);
    dashboard::write_html_file(o->out, html, "report");
    std::printf("report: %s (%zu run%s, %.1f KB)\n", o->out.c_str(), o->dirs.size(), o->dirs.size() == 1 ? "" : "s",
                static_cast<double>(html.size()) / 1e3);
    set_exit_code(0);
  });
}

void setup(CLI::App& app) {
  setup_dashboard(app);
  setup_report(app);
}

CommandRegistration reg(87, setup);

}  // namespace
}  // namespace cmd_dashboard
}  // namespace trident::cli
