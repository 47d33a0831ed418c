// `trident import --hf DIR --out OUT`: a Hugging Face model folder (llama, mistral, gpt2) -> a trident
// checkpoint (train/hf.h).
#include <memory>

#include "command.h"
#include "hf_cli.h"

namespace trident::cli {
namespace cmd_import {
namespace {

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "import", "a Hugging Face model folder (llama, mistral, gpt2) -> a trident checkpoint (use with --init_from)");
  auto a = std::make_shared<HfImportArgs>();
  add_hf_import_options(sub, *a);
  sub->callback([a] { run_hf_import(*a); });
}

CommandRegistration reg(24, setup);

}  // namespace
}  // namespace cmd_import
}  // namespace trident::cli
