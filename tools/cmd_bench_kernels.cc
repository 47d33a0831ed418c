// `trident bench kernels`: argument parsing; the benchmark itself is bench/kernel_bench.h.
#include <memory>

#include "command.h"
#include "trident/bench/kernel_bench.h"
#include "trident/plan/model.h"

namespace trident::cli {
namespace cmd_bench_kernels {
namespace {

void setup(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto f = std::make_shared<bench::KernelBenchOptions>();
  CLI::App* k = bench->add_subcommand(
      "kernels",
      "CPU kernel speed (GFLOP/s or GB/s) at each ISA level of this machine beside the core's peak, on one "
      "thread or (--threads N) on N against 1, on a GPT step's shapes (default nanoGPT's CPU config)");
  k->add_option("--isa", f->isa,
                "all (every level this CPU has) or a comma list of portable, avx2, avx512, "
                "avx512bf16, amx")
      ->capture_default_str();
  k->add_option("--batch", f->batch, "batch size B")->capture_default_str();
  k->add_option("--block", f->block, "sequence length T")->capture_default_str();
  CLI::Option* model = k->add_option("--model", f->model,
                                     "a named model's widths (C, MLP width, heads, vocabulary) from the catalog of "
                                     "`trident plan`: e.g. gpt2, gpt2-xl, llama3.2-1b");
  k->add_option("--embd", f->embd, "model width C")->capture_default_str()->excludes(model);
  k->add_option("--heads", f->heads, "attention heads")->capture_default_str()->excludes(model);
  k->add_option("--vocab", f->vocab, "vocabulary size (cross-entropy width)")->capture_default_str()->excludes(model);
  k->add_option("--ffn", f->ffn, "the MLP's hidden width (0: 4 x embd)")->capture_default_str()->excludes(model);
  k->add_option("--seconds", f->seconds, "time per measurement (best of 3 rounds)")->capture_default_str();
  k->add_option("--threads", f->threads,
                "threads of the kernels' pool: above 1, each kernel also runs on 1 thread and the speedup is shown")
      ->capture_default_str();
  k->callback([f] {
    if (!f->model.empty()) {
      const plan::ModelSpec m = plan::model_preset(f->model);  // unknown names: an error listing the catalog
      f->embd = m.hidden;
      f->heads = m.heads;
      f->vocab = m.vocab;
      f->ffn = m.ffn();
    }
    set_exit_code(bench::run_kernel_bench(*f));
  });
}

// After `bench` (cmd_bench.cc, order 40) exists.
CommandRegistration reg(41, setup);

}  // namespace
}  // namespace cmd_bench_kernels
}  // namespace trident::cli
