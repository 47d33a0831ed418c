// `trident env`: every TRIDENT_* environment variable, its default, its current value and its meaning,
// then the CPU kernels chosen for this machine.
#include <cstdio>

#include "command.h"
#include "trident/core/env.h"
#include "trident/kernels/cpu/isa.h"

namespace trident::cli {
namespace cmd_env {
namespace {

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("env", "list the TRIDENT_* environment variables, their defaults and current values");
  sub->callback([] {
    for (const auto& p : env::all_params()) {
      auto cur = env::get(p.name);
      std::printf("%-24s default %-8s %s%s\n    %s\n", p.name, *p.default_value ? p.default_value : "\"\"",
                  cur ? "now " : "", cur ? cur->c_str() : "", p.help);
    }
    // The CPU kernels TRIDENT_ISA selects on this machine (an invalid or too high level fails here).
    std::printf("\ncpu kernels: %s\ncpu features: %s\n", kernels::cpu::kernel_summary().c_str(),
                kernels::cpu::cpu_features().c_str());
    set_exit_code(0);
  });
}

CommandRegistration reg(90, setup);

}  // namespace
}  // namespace cmd_env
}  // namespace trident::cli
