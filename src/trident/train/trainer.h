// The single-rank training loop with nanoGPT's train.py semantics, ready to be wrapped for data parallelism.
//
// Per step `it` (0-based): evaluate when it % eval_interval == 0 (and after the last step), saving a
// checkpoint when val loss improved or always_save_checkpoint (not at step 0); lr = lr_at(it) (warmup +
// cosine) or learning_rate; gradient_accumulation_steps micro-steps of forward+backward with the loss scaled
// by 1/accumulation; the after_backward hook (data-parallel all-reduce goes here); global-norm clipping;
// AdamW step. The logged loss of a step is the mean of its micro-step losses. Checkpoints also every
// checkpoint_interval steps and at the end. Unlike nanoGPT, which runs max_iters + 1 steps, trident runs
// exactly max_iters steps and evaluates once more after the last (so "val loss at 2000" means the same).
//
// Determinism: batches are pure functions of (seed, step, micro) (data/sampler.h), so a run resumed from
// the checkpoint at step s replays steps s.. exactly as the uninterrupted run, provided the model's kernels
// are deterministic for a fixed thread count.
//
// Checkpoints (async_checkpoint, the default): the state is copied in memory at the step and written by a
// thread while the next steps run; the next checkpoint and the end of run() wait for the write. Resume
// (resume = true, or auto when out_dir has a checkpoint) continues from out_dir's newest complete
// checkpoint: the same batches, learning-rate step, optimizer moments and step count, so the continuation
// is bitwise the uninterrupted run at a fixed layout (CPU, float32, fixed thread count).
//
// Data parallelism: batch_size is per rank; rank r takes windows [r*B, r*B+B) of the global batch of
// world*B (so N ranks see exactly the windows of one process with batch N*B). Hooks average scalars.
//
// Outputs: out_dir/metrics.jsonl gets one JSON record per step {"type":"step", step, loss, lr,
// tokens_per_s, elapsed, grad_norm (the pre-clip global norm), time_ms: {step, compute, comm, bubble, data,
// optimizer} (where this rank's step went, trainer.cc StepSplit; time_ms_ranks: every rank's, with
// gather_ranks)} and per evaluation {"type":"eval", step, train_loss, val_loss}; with json=true the
// same records go to stdout instead of the progress line, which otherwise redraws in place on a terminal
// (isatty) and prints a plain line every log_interval steps elsewhere. Only rank 0 writes files and prints.
//
// Non-finite steps: a loss or global gradient norm that is not finite stops the run before the update
// with NonFiniteError (on_nonfinite = stop), or skips that step's update and counts it in the step record's
// "nonfinite_skips" (on_nonfinite = skip, as a loss scaler skips an overflowed step). Every rank sees the
// same loss and norm, so every rank decides alike.
//
// Ownership: the Trainer owns the model, optimizer, dataset and samplers. Blocking: run() trains on the
// calling thread until max_iters. Thread-safety: none (one trainer per process). No timeouts of its own.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/sampler.h"
#include "trident/data/tokenizer.h"
#include "trident/nn/model.h"
#include "trident/optim/adamw.h"
#include "trident/train/checkpoint.h"
#include "trident/train/config.h"
#include "trident/train/generate.h"

namespace trident::train {

struct TrainResult;

// A step's loss or gradient was not finite (on_nonfinite = stop). `parameter`: the first parameter, in the
// model's order, whose gradient on this rank is not finite ("" when this rank's are all finite: another
// rank's shard holds it, or only the loss is not finite).
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& what, int64_t step, std::string parameter)
      : Error(what), step(step), parameter(std::move(parameter)) {}
  int64_t step;
  std::string parameter;
};

struct TrainerHooks {
  int rank = 0;
  int world = 1;
  // Builds the model from its config (default nn::make_model); tests may inject another.
  std::function<std::unique_ptr<nn::Model>(const nlohmann::json&)> make_model;
  // A fresh run (no checkpoint loaded, no make_model given) builds its model without drawing the initial
  // values (nn::Model: deferred initialization): on_ready's ZeRO-3 wrapper initializes only the pieces each
  // rank owns, so no rank ever holds the whole model.
  bool defer_initialization = false;
  // The ZeRO stage of the data-parallel wrapper around the model (0: ddp or none): on a CUDA device the
  // planner's memory check before the model is allocated counts each rank's shard with it.
  int zero_stage = 0;
  // After the model is built (and a checkpoint loaded), before training: data parallelism broadcasts
  // rank 0's parameters and installs its gradient hooks here.
  std::function<void(nn::Model&)> on_ready;
  // Before each micro-step's forward+backward (data parallelism communicates only on the last: no_sync).
  std::function<void(int micro, int accum)> before_micro;
  // After the last micro-step's backward, before clipping and the optimizer step.
  std::function<void(nn::Model&)> after_backward;
  // Replace global-norm clipping (returns the pre-clip norm) and the optimizer step (ZeRO shards both).
  std::function<double(nn::Model&, float max_norm)> clip;
  std::function<void(float lr)> step;
  // Before a checkpoint is written, on every rank (ZeRO gathers its sharded optimizer state into the
  // trainer's optimizer here).
  std::function<void()> before_save;
  // After each optimizer step: extra fields for the step's metrics record (communication, memory).
  std::function<void(nlohmann::json&)> annotate_step;
  // After training (and sampling), before the final record or "done" line, on every rank: the
  // prediction-versus-measurement report goes here (train/prediction.h). Must not communicate.
  std::function<void(const TrainResult&)> on_finished;
  // Mean of a scalar over ranks (losses for logs and evaluation). Default: identity.
  std::function<double(double)> average;
  // Every world rank's copy of a few doubles (the same count on each), concatenated in world-rank order
  // (collective, once per step: the step records' per-rank time split). Null: one rank, nothing gathered.
  std::function<std::vector<double>(const std::vector<double>&)> gather_ranks;
  // Replaces model.forward_backward for training micro-steps and estimate_loss (model parallelism: the
  // pipeline engine or the sharded model). Same contract: returns the UNSCALED mean loss over B*T
  // positions (on every rank that calls it), gradients of loss * loss_scale when backward.
  std::function<double(const int32_t* x, const int32_t* y, int B, int T, bool backward, float loss_scale)>
      forward_backward;
  // Whether this process prints and writes files (metrics, checkpoints, the sample). -1: rank == 0. Model
  // parallelism sets rank/world to the DATA-parallel coordinates (tensor- and pipeline-parallel peers read
  // the same batch), so several processes have rank 0 and only world rank 0 may write.
  int writer = -1;
  // Resume: loads the checkpoint's weights (and optimizer moments when it has them) into the model and the
  // optimizer (model parallelism: shards the logical checkpoint). Default: load_weights +
  // load_optimizer_moments on the model's own layout.
  std::function<void(nn::Model&, optim::AdamW&, const LoadedCheckpoint&)> load_checkpoint;
  // Checkpoints: called on EVERY rank after before_save; returns the LOGICAL model (and its optimizer
  // moments, in that model's flat layout) to write, on the writer (model parallelism gathers the shards
  // there). Null or returning a null model: the trainer's own model and optimizer.
  struct SaveView {
    nn::Model* model = nullptr;
    const std::vector<float>* exp_avg = nullptr;
    const std::vector<float>* exp_avg_sq = nullptr;
    int64_t optimizer_step = 0;
    // A sharded model's checkpoint read one tensor at a time (CheckpointSnapshot::read; ZeRO-3): `model`
    // gives the names, shapes and config, every rank returns the view and runs the same reads (the writer
    // writes, the others drain), and the write is synchronous (the reads are collectives).
    std::function<void(int which, size_t offset, size_t count, float* dst)> read;
  };
  std::function<SaveView()> checkpoint_view;
  // The sample at the end: called on EVERY rank (may communicate); returns the model whose forward_logits
  // gives the full logits on the writer, or null to skip sampling (with a printed note). Default: the
  // trainer's model.
  std::function<nn::Model*()> sample_model;
  // The model sample_model returns gathers its parameters block by block as it runs (ZeRO-3): every rank
  // generates, in step (the same seed and the same logits give the same tokens, and a sample is a fixed
  // number of forward passes), and the writer prints it.
  bool sample_on_every_rank = false;
  // Where progress lines and JSON records go (default stdout). For tests.
  std::FILE* out = nullptr;
};

struct TrainResult {
  int64_t steps = 0;                 // optimizer steps completed (including those before a resume)
  std::vector<double> losses;        // the loss of every step run by this call
  double train_loss = NAN;           // last evaluation
  double val_loss = NAN;
  double tokens_per_s = 0;           // training tokens (all ranks) per second of training time
  std::string sample;                // text generated at the end ("" when sample_tokens = 0)
  std::string last_checkpoint;
  int64_t nonfinite_skips = 0;       // steps whose update was skipped (on_nonfinite = skip)
};

class Trainer {
 public:
  explicit Trainer(TrainConfig cfg, TrainerHooks hooks = {});
  ~Trainer();
  TrainResult run();

  nn::Model& model() { return *model_; }
  optim::AdamW& optimizer() { return *opt_; }
  const data::TokenDataset& dataset() const { return *dataset_; }
  const TrainConfig& config() const { return cfg_; }
  int64_t start_step() const { return start_step_; }
  // Mean loss over eval_iters random batches of a split at `step` (nanoGPT's estimate_loss).
  double estimate_loss(data::Split split, int64_t step);
  // Saves the checkpoint of `step` (every rank calls it; the writer writes); returns its folder. With
  // async_checkpoint the files are written on a thread: the next save, wait_for_checkpoint() and the end of
  // run() wait for it (and rethrow its error).
  std::string save(int64_t step);
  void wait_for_checkpoint();
  // Appends a record to the metrics file (and stdout with json=true); rank 0 only, like every record.
  void emit_record(const nlohmann::json& rec) { emit(rec); }

 private:
  // The planner's device memory for this rank against the GPU's (train/config.h check_device_memory); throws
  // OutOfMemory when it does not fit. A GPU outside the hardware catalog is not checked (logged).
  void check_gpu_memory(const nlohmann::json& model_config);
  void emit(const nlohmann::json& rec);
  bool writer() const;
  double micro_step(const int32_t* x, const int32_t* y, int B, int T, bool backward, float loss_scale);
  std::string first_nonfinite_gradient() const;
  void progress(int64_t step, double loss, double lr, double tps, double eta_s);

  TrainConfig cfg_;
  TrainerHooks hooks_;
  std::optional<data::TokenDataset> dataset_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<optim::AdamW> opt_;
  std::unique_ptr<data::TrainSampler> sampler_;
  std::unique_ptr<data::RandomWindowSampler> eval_train_, eval_val_;
  int64_t start_step_ = 0;
  bool resumed_ = false;        // started from a checkpoint (resume true, or auto with one present)
  int64_t evaluated_at_ = -1;
  double best_val_ = 1e9;
  double elapsed_before_ = 0;   // training seconds of earlier (resumed) runs
  double tokens_before_ = 0;
  double run_seconds_ = 0;      // training seconds and tokens of this run() call
  double run_tokens_ = 0;
  std::FILE* metrics_ = nullptr;
  bool tty_ = false;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
  AsyncCheckpointWriter writer_;
};

// `trident eval`: mean loss over the first K non-overlapping windows of a split (window i: inputs
// tokens[iT .. iT+T-1], targets tokens[iT+1 .. iT+T]); deterministic. Throws InvalidArgument when the
// split has fewer than K*T + 1 tokens.
double evaluate_windows(nn::Model& model, const data::TokenSpan& span, int block_size, int64_t windows);

// generate() (train/generate.h) that also works when the model's vocabulary is padded beyond the
// tokenizer's (vocab_multiple, tensor parallelism): logits are cropped to vocab_size before sampling.
std::vector<int32_t> generate_tokens(nn::Model& model, int block_size, int vocab_size, std::vector<int32_t> context,
                                     const GenerateOptions& opts);

// Rebuilds a model from a loaded checkpoint (make_model on its config, then its weights).
std::unique_ptr<nn::Model> model_from_checkpoint(const LoadedCheckpoint& ckpt,
                                                 const std::function<std::unique_ptr<nn::Model>(const nlohmann::json&)>&
                                                     make = nullptr);

}  // namespace trident::train
