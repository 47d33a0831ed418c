// Registry of `trident` subcommands. Each tools/cmd_*.cc registers itself with a static
// CommandRegistration, so adding a subcommand is one new file (trident.cc stays thin).
#pragma once

#include <CLI/CLI.hpp>

namespace trident::cli {

// setup() adds a subcommand to `app` and sets its callback; the callback stores the process exit code
// with set_exit_code(). `order` sorts the help listing.
using CommandSetup = void (*)(CLI::App& app);
struct CommandRegistration {
  CommandRegistration(int order, CommandSetup setup);
};
void set_exit_code(int code);

}  // namespace trident::cli
