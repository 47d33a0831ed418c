// `trident inspect DIR`: merges the flight-recorder dumps of every rank (comm/flight_inspect.h) and says what
// happened: which rank never entered which collective, what mismatched, what failed, who arrived last.
#include <cstdio>
#include <memory>

#include "command.h"
#include "trident/comm/flight_inspect.h"
#include "trident/core/error.h"

namespace trident::cli {
namespace cmd_inspect {
namespace {

struct InspectCli {
  std::string dir;
  std::string trace;
  int last = 50;
};

void setup(CLI::App& app) {
  auto o = std::make_shared<InspectCli>();
  auto* sub = app.add_subcommand(
      "inspect", "explain a hung or failed job from its flight-recorder dumps (one rank_<R>.json per rank)");
  sub->add_option("dir", o->dir,
                  "folder of the dumps: TRIDENT_FLIGHT_RECORDER_DIR, or a trident train run's out_dir")
      ->required();
  sub->add_option("--trace", o->trace, "also write the merged records as a Chrome trace (ui.perfetto.dev)");
  sub->add_option("--last", o->last, "recent collectives per group that the lateness ranking uses")
      ->check(CLI::PositiveNumber)
      ->default_val(50);
  sub->callback([o] {
    const auto dumps = load_flight_dumps(o->dir);
    std::fputs(inspect_flight_dumps(dumps, o->last).text().c_str(), stdout);
    if (!o->trace.empty()) {
      write_flight_trace(dumps, o->trace);
      std::printf("trace: %s (chrome://tracing or ui.perfetto.dev)\n", o->trace.c_str());
    }
    set_exit_code(0);
  });
}

CommandRegistration reg(85, setup);

}  // namespace
}  // namespace cmd_inspect
}  // namespace trident::cli
