// `trident export --checkpoint CKPT --hf DIR`: a trident llama or gpt checkpoint -> a Hugging Face model
// folder that transformers' from_pretrained loads (train/hf.h).
#include <memory>

#include "command.h"
#include "hf_cli.h"

namespace trident::cli {
namespace cmd_export {
namespace {

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "export", "a trident checkpoint (llama, gpt) -> a Hugging Face model folder (config.json, model.safetensors)");
  auto a = std::make_shared<HfExportArgs>();
  add_hf_export_options(sub, *a);
  sub->callback([a] { run_hf_export(*a); });
}

CommandRegistration reg(25, setup);

}  // namespace
}  // namespace cmd_export
}  // namespace trident::cli
