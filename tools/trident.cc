// trident: one binary, thin: parses the command line, then calls the library.
#include <algorithm>
#include <csignal>
#include <exception>
#include <new>
#include <cstdio>
#include <utility>
#include <vector>

#include "command.h"
#include "trident/core/error.h"

namespace trident::cli {
namespace {
std::vector<std::pair<int, CommandSetup>>& registry() {
  static std::vector<std::pair<int, CommandSetup>> r;
  return r;
}
int g_exit_code = 0;
}  // namespace

CommandRegistration::CommandRegistration(int order, CommandSetup setup) { registry().emplace_back(order, setup); }
void set_exit_code(int code) { g_exit_code = code; }

}  // namespace trident::cli

int main(int argc, char** argv) {
  using namespace trident::cli;
  // A file size limit (RLIMIT_FSIZE) reached by a checkpoint or cache write is an error naming the file
  // (EFBIG), not a silent death by SIGXFSZ. Ranks started by the launcher run this main too.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"trident: distributed training with data, tensor and pipeline parallelism", "trident"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trident 0.1.0");
  auto& reg = registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [order, setup] : reg) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trident::Error& e) {
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "trident: error: out of memory (an allocation failed); use a smaller model or batch, or "
                         "shard it over more ranks: `trident plan` predicts each layout's memory\n");
    return 2;
  } catch (const std::exception& e) {
    // Anything else that escaped the library's typed errors: its message, not an abort.
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return 2;
  }
  return g_exit_code;
}
