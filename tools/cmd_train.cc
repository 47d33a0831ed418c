// `trident train`, `trident eval` and `trident sample`: thin wrappers over trident/train.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"
#include "trident/train/checkpoint.h"
#include "trident/train/config.h"
#include "trident/train/generate.h"
#include "trident/train/trainer.h"
#include "trident/train/distributed.h"
#include "trident/launch/launcher.h"

#include <unistd.h>

namespace trident::cli {
namespace cmd_train {
namespace {

// Runs `body`; bad arguments propagate (exit 2 from main), other errors print and exit 1.
template <typename F>
void guarded(F&& body) {
  try {
    body();
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error& e) {
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    set_exit_code(1);
  }
}

struct ParallelFlags {
  int nproc = 1;
  int max_restarts = 0;  // --max-restarts for the launcher --nproc starts
  train::DistributedOptions dist;
  std::string bind;  // --bind none|core|auto for the ranks --nproc starts ("": TRIDENT_BIND)
};

std::string self_exe() {
  char buf[4096];
  ssize_t len = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) TRIDENT_THROW(IoError, "train --nproc: cannot find this program (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(len));
}

// Parallelism flags are CLI11 options; everything else on the line is a config key (train::parse_train_args
// reads the extras, since the keys and their checks live in train/config.cc).
void setup_train(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "train a GPT or MLP on a text corpus (nanoGPT's train.py)");
  sub->allow_extras();
  auto pf = std::make_shared<ParallelFlags>();
  sub->add_option("--nproc,--nproc-per-node,--nproc_per_node", pf->nproc,
                  "start N local ranks of this command through the launcher")
      ->check(CLI::PositiveNumber);
  sub->add_option("--max-restarts,--max_restarts", pf->max_restarts,
                  "restart every rank up to N times after one fails (as trident launch --max-restarts); the "
                  "ranks then default to --resume auto")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--parallel", pf->dist.parallel, "data-parallel strategy (default ddp)")
      ->check(CLI::IsMember({"ddp", "zero1", "zero2", "zero3"}));
  sub->add_option("--backend", pf->dist.backend,
                  "the ranks' process-group backend: native (default; GPU buffers of ranks on one host through CUDA "
                  "IPC), nccl (--device cuda, one GPU per rank) or mpi (under mpirun)")
      ->check(CLI::IsMember({"native", "nccl", "mpi"}));
  sub->add_option("--bucket-mb,--bucket_mb", pf->dist.bucket_mb, "gradient bucket size in MiB (default 25)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--first-bucket-mb,--first_bucket_mb", pf->dist.first_bucket_mb,
                  "ddp/zero1: size of the first gradient bucket in MiB, so its all-reduce starts early in backward "
                  "(default 1, as PyTorch DDP; 0: the same as --bucket-mb)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("!--no-overlap,!--no_overlap", pf->dist.overlap, "all-reduce after backward, not during it");
  sub->add_flag("!--no-shared-grads,!--no_shared_grads", pf->dist.shared_gradients,
                "gradients in private memory, not the group's zero-copy shared memory");
  sub->add_option("--bind", pf->bind, "CPU binding of the ranks --nproc starts (as trident launch --bind)")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              launch::parse_bind(v);  // the launcher's own check and message
              return std::string();
            } catch (const InvalidArgument& e) {
              return std::string(e.what());
            }
          },
          "none|core|auto"));
  sub->footer(train::config_help() +
              "\nModel parallelism: --tp T --pp P [--dp D] (T x P x D = N; --dp 0 infers it), --schedule\n"
              "  gpipe|1f1b|interleaved, --microbatches m, --virtual-stages v, --mesh-order tp-dp-pp,\n"
              "  --trace FILE (Chrome trace of every rank). Example: trident train --nproc 8 --tp 2 --pp 2 --dp 2\n"
              "  Under trident launch / torchrun / mpirun / Slurm the rank comes from the environment.");
  sub->callback([sub, pf] {
    guarded([&] {
      const bool launched = launch::in_launched_job();
      if (launched && pf->max_restarts > 0) {
        TRIDENT_THROW(InvalidArgument,
                      "--max-restarts {}: this process is already one rank of a launched job; give --max-restarts "
                      "to the launcher (trident launch --max-restarts N, torchrun --max-restarts N)",
                      pf->max_restarts);
      }
      // Under restarts every round continues from out_dir's newest checkpoint unless told otherwise (a
      // resume key on the line or in a --config file wins).
      train::TrainConfig defaults;
      if (pf->max_restarts > 0 || (launched && env::max_restarts() > 0)) defaults.resume = train::Resume::kAuto;
      train::TrainConfig cfg = train::parse_train_args(sub->remaining(), defaults);  // checked before any rank starts
      // --device cuda on a build or machine without one fails here, before any data is read or rank started.
      kernels::device_ops(kernels::parse_device(cfg.model.device));
      train::check_backend(cfg, pf->dist);
      if (pf->dist.backend == "mpi" && pf->nproc > 1)
        TRIDENT_THROW(InvalidArgument, "--backend mpi takes its ranks from mpirun: run `mpirun -np N trident train "
                      "--backend mpi ...` without --nproc");
      if (!launched && (pf->nproc > 1 || cfg.tp * cfg.pp > 1)) {
        // The model-parallel layout against the world and the model, before any rank starts. The vocabulary
        // matters only when it is padded to an explicit multiple (by default it is padded to one of tp).
        int vocab = std::max(1, cfg.tp);
        if (cfg.tp > 1 && cfg.vocab_multiple > 0) {
          data::DatasetOptions o;
          o.source = cfg.data;
          o.tokenizer = data::parse_tokenizer_kind(cfg.tokenizer);
          o.tokenizer_path = cfg.tokenizer_path();
          o.cache_dir = cfg.cache_dir.empty() ? (std::filesystem::path(cfg.out_dir) / "cache").string() : cfg.cache_dir;
          vocab = data::TokenDataset::open(o).tokenizer().vocab_size();
        }
        if (pf->nproc == 1 && cfg.tp * cfg.pp > 1) {
          TRIDENT_THROW(InvalidArgument, "tp={} x pp={} needs {} processes at least: add --nproc {} (or launch it)",
                        cfg.tp, cfg.pp, cfg.tp * cfg.pp, cfg.tp * cfg.pp * std::max(1, cfg.dp));
        }
        train::check_parallel_layout(cfg, pf->dist, pf->nproc, vocab);
      }
      if ((pf->nproc > 1 || pf->max_restarts > 0) && !launched) {
        // --nproc N: this same command, N times, under the launcher (which sets each rank's environment).
        launch::LaunchOptions lo;
        lo.nproc_per_node = pf->nproc;
        lo.max_restarts = pf->max_restarts;
        lo.master_port = 0;
        // Every rank's flight-recorder dump in one folder (an explicit TRIDENT_FLIGHT_RECORDER_DIR wins).
        lo.flight_recorder_dir = env::param_string("TRIDENT_FLIGHT_RECORDER_DIR");
        if (lo.flight_recorder_dir.empty())
          lo.flight_recorder_dir = (std::filesystem::path(cfg.out_dir) / "flight_recorder").string();
        if (!pf->bind.empty()) lo.bind = launch::parse_bind(pf->bind);
        lo.command = {self_exe(), "train"};
        for (auto& a : sub->remaining()) lo.command.push_back(a);
        lo.command.push_back("--parallel=" + pf->dist.parallel);
        lo.command.push_back("--backend=" + pf->dist.backend);
        lo.command.push_back(fmt::format("--bucket-mb={}", pf->dist.bucket_mb));
        lo.command.push_back(fmt::format("--first-bucket-mb={}", pf->dist.first_bucket_mb));
        if (!pf->dist.overlap) lo.command.push_back("--no-overlap");
        if (!pf->dist.shared_gradients) lo.command.push_back("--no-shared-grads");
        set_exit_code(launch::launch(lo));
        return;
      }
      train::train_distributed(cfg, pf->dist);
    });
  });
}

// eval and sample: sets the thread count, finds the checkpoint (folder, checkpoint.json or out_dir), loads it
// without optimizer state and rebuilds its model.
struct OpenedCheckpoint {
  std::string dir;
  train::LoadedCheckpoint ckpt;
  std::unique_ptr<nn::Model> model;
};
OpenedCheckpoint open_checkpoint(const std::string& path, int threads, const std::string& device) {
  if (threads > 0) kernels::cpu::set_num_threads(threads);
  kernels::device_ops(kernels::parse_device(device));  // DeviceUnavailable at once, before reading the checkpoint
  std::string dir = train::find_checkpoint(path);
  if (dir.empty()) TRIDENT_THROW(InvalidArgument, "--checkpoint '{}': no checkpoint found there", path);
  auto ckpt = train::load_checkpoint(dir, false);
  nlohmann::json mcfg = ckpt.meta.model_config;
  mcfg["device"] = device;  // a checkpoint is device-independent: it runs where this command is told
  auto model = train::model_from_checkpoint(ckpt, [&](const nlohmann::json&) { return nn::make_model(mcfg); });
  return {dir, std::move(ckpt), std::move(model)};
}

struct EvalArgs {
  std::string checkpoint, data, split = "val";
  int64_t windows = 0;
  bool json = false;
  int threads = 0;
  std::string device = "cpu";
};

void setup_eval(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "mean loss of a checkpoint over the first K non-overlapping windows");
  auto a = std::make_shared<EvalArgs>();
  sub->add_option("--checkpoint", a->checkpoint, "checkpoint folder, its checkpoint.json, or an out_dir")->required();
  sub->add_option("--data", a->data, "text file or folder (default: the data the checkpoint was trained on)");
  sub->add_option("--split", a->split, "train | val")->check(CLI::IsMember({"train", "val"}));
  sub->add_option("--windows", a->windows, "number K of windows of block_size tokens")->required()
      ->check(CLI::PositiveNumber);
  sub->add_flag("--json", a->json, "print one JSON record");
  sub->add_option("--threads", a->threads, "compute threads (0: default)");
  sub->add_option("--device", a->device, "cpu | cuda (one GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->callback([a] {
    guarded([&] {
      auto [dir, ckpt, model] = open_checkpoint(a->checkpoint, a->threads, a->device);
      std::string source = a->data;
      if (source.empty()) source = ckpt.meta.train_config.value("data", std::string());
      if (source.empty()) TRIDENT_THROW(InvalidArgument, "--data is required: the checkpoint does not name its data");
      data::DatasetOptions o;
      o.source = source;
      o.tokenizer_override = data::Tokenizer::from_json(ckpt.meta.tokenizer);
      auto ds = data::TokenDataset::open(o);
      int T = ckpt.meta.model_config.at("block_size").get<int>();
      auto split = data::parse_split(a->split);
      double loss = train::evaluate_windows(*model, ds.span(split), T, a->windows);
      if (a->json) {
        nlohmann::json j{{"checkpoint", dir}, {"step", ckpt.meta.step}, {"data", source}, {"split", a->split},
                         {"windows", a->windows}, {"block_size", T}, {"loss", loss}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%s loss %.6f over %lld windows of %d tokens (%s, step %lld)\n", a->split.c_str(), loss,
                    static_cast<long long>(a->windows), T, dir.c_str(), static_cast<long long>(ckpt.meta.step));
      }
    });
  });
}

struct SampleArgs {
  std::string checkpoint, prompt = "\n";
  int tokens = 200, top_k = 200, threads = 0;
  std::string device = "cpu";
  double temperature = 0.8;
  uint64_t seed = 1337;
};

void setup_sample(CLI::App& app) {
  auto* sub = app.add_subcommand("sample", "generate text from a checkpoint (nanoGPT's sample.py)");
  auto a = std::make_shared<SampleArgs>();
  sub->add_option("--checkpoint", a->checkpoint, "checkpoint folder, its checkpoint.json, or an out_dir")->required();
  sub->add_option("--prompt", a->prompt, "text to continue (default: a newline)");
  sub->add_option("--tokens", a->tokens, "new tokens to generate")->check(CLI::NonNegativeNumber);
  sub->add_option("--temperature", a->temperature, "softmax temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k,--top_k", a->top_k, "sample among the k likeliest tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a->seed, "sampling seed");
  sub->add_option("--threads", a->threads, "compute threads (0: default)");
  sub->add_option("--device", a->device, "cpu | cuda (one GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->callback([a] {
    guarded([&] {
      auto [dir, ckpt, model] = open_checkpoint(a->checkpoint, a->threads, a->device);
      auto tok = data::Tokenizer::from_json(ckpt.meta.tokenizer);
      if (a->prompt.empty()) TRIDENT_THROW(InvalidArgument, "--prompt must not be empty");
      auto ctx = tok.encode(a->prompt);
      train::GenerateOptions g;
      g.max_new_tokens = a->tokens;
      g.temperature = a->temperature;
      g.top_k = a->top_k;
      g.seed = a->seed;
      int T = ckpt.meta.model_config.at("block_size").get<int>();
      auto out = train::generate_tokens(*model, T, tok.vocab_size(), ctx, g);
      std::string text = tok.decode(out);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::printf("\n");
    });
  });
}

CommandRegistration reg_train(20, setup_train);
CommandRegistration reg_eval(21, setup_eval);
CommandRegistration reg_sample(22, setup_sample);

}  // namespace
}  // namespace cmd_train
}  // namespace trident::cli
