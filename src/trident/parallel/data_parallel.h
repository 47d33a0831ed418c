// Data parallelism: DDP and ZeRO stages 1 and 2 as one mechanism over a model's flat buffers.
//
// Every rank holds the whole model and computes gradients on its shard of the global batch. Gradients are
// grouped into buckets (contiguous ranges of the flat gradient buffer, filled in reverse parameter order as
// backward produces them); the moment a bucket's last gradient is written (the model's grad-ready hook),
// its collective starts asynchronously on the process group, in place on the gradient memory (no copy):
//   ddp    all-reduce (avg) of every bucket; every rank runs AdamW on all parameters.
//   zero1  same all-reduce; AdamW state (moments) kept only for this rank's shard of the flat buffer; each
//          rank updates its shard, then the updated parameters are all-gathered.
//   zero2  reduce-scatter (avg) of every bucket, so a rank keeps only its shard of the reduced gradients;
//          then as zero1. (Gradient memory stays allocated by the model here: see memory().)
// Shards are equal slices of the flat buffer padded to a multiple of the world size; any size works.
// Gradient accumulation: set_require_sync(false) (or a NoSync scope) for all but the last micro-step;
// only the last one communicates. finish_gradient_sync() waits for every bucket before clipping/stepping.
//
// Ownership: borrows the model (must outlive this) and shares the process group. Thread-safety: one thread
// (the training loop) calls it; collectives run on the group's worker. Errors from collectives (dead peer,
// timeout) are rethrown by finish_gradient_sync() / step().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/comm/process_group.h"
#include "trident/nn/model.h"
#include "trident/optim/adamw.h"

namespace trident::parallel {

enum class Strategy { kDdp, kZero1, kZero2 };
Strategy parse_strategy(const std::string& name);  // ddp | zero1 | zero2
const char* strategy_name(Strategy s);

struct DataParallelOptions {
  Strategy strategy = Strategy::kDdp;
  size_t bucket_bytes = 25u << 20;  // PyTorch DDP's default (25 MiB)
  bool overlap = true;              // start each bucket during backward (false: all after backward)
  optim::AdamWConfig adamw;
};

// Bytes moved by this rank, per collective kind, in the last completed step (nccl-tests' convention:
// what this rank sends on the wire under a bandwidth-optimal algorithm: all-reduce 2(N-1)/N x size,
// reduce-scatter and all-gather (N-1)/N x size, broadcast size).
struct CommStats {
  std::map<std::string, double> bytes;  // kind -> bytes
  std::map<std::string, int> calls;     // kind -> collectives issued
  double total() const;
};

// Persistent bytes held per category on this rank.
struct MemoryReport {
  std::map<std::string, double> bytes;  // parameters, gradients, optimizer_state, master_weights, comm_buffers
  double total() const;
};

class DataParallel {
 public:
  DataParallel(nn::Model& model, std::shared_ptr<ProcessGroup> pg, DataParallelOptions options);
  ~DataParallel();

  // Rank 0's parameters to every rank (call once after building the model or loading a checkpoint).
  void broadcast_parameters();
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }
  // Waits for every bucket's collective of the last syncing micro-step (issues those not started yet).
  void finish_gradient_sync();
  // Global gradient norm over all parameters (every rank agrees); scales the gradients by
  // min(1, max_norm / (norm + 1e-6)) like torch.nn.utils.clip_grad_norm_. Returns the pre-clip norm.
  double clip_grad_norm(float max_norm);
  // One optimizer step with learning rate lr (ZeRO: on this rank's shard, then all-gather parameters).
  void step(float lr);

  Strategy strategy() const { return options_.strategy; }
  // The range [begin, end) of the flat buffers this rank owns (ddp: everything).
  size_t shard_begin() const { return shard_begin_; }
  size_t shard_end() const { return shard_end_; }
  size_t num_buckets() const { return buckets_.size(); }
  const CommStats& last_step_comm() const { return last_stats_; }
  MemoryReport memory() const;
  nlohmann::json report() const;  // memory + communication, for the end of training and metrics

  // Optimizer state for checkpoints: the full flat moments (gathered to every rank) and the step count.
  void gather_optimizer_state(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq, int64_t* step);
  void load_optimizer_state(const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq, int64_t step);

 private:
  struct Bucket {
    size_t begin, end;        // element range of the flat gradient buffer
    int pending = 0;          // parameters not yet ready in this micro-step
    int params = 0;
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(size_t param_index);
  void launch(Bucket& b);
  void account(const std::string& kind, double bytes);

  nn::Model& model_;
  std::shared_ptr<ProcessGroup> pg_;
  DataParallelOptions options_;
  int rank_, world_;
  size_t padded_ = 0;  // flat size padded to a multiple of world
  size_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  bool require_sync_ = true;
  bool launched_any_ = false;
  std::vector<float> padded_grads_;   // zero2 bucket staging only when a bucket is not shard-aligned
  // Optimizer (moments only for [shard_begin_, shard_end_)).
  std::vector<float> exp_avg_, exp_avg_sq_;
  std::vector<uint8_t> decay_mask_;
  int64_t step_count_ = 0;
  CommStats stats_, last_stats_;
};

}  // namespace trident::parallel
