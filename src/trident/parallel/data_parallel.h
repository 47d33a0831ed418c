// Data parallelism: DDP and ZeRO stages 1, 2 and 3 as one mechanism over a model's flat buffers, on the
// model's device (every memory operation and elementwise kernel goes through kernels::device_ops(
// model.device()), so there is one DataParallel for CPU and CUDA). It composes a BucketEngine
// (dp_buckets.h: buckets, launch during backward, overlap accounting), one ShardingStrategy per stage
// (dp_sharding.h: what a bucket's collective is, what each rank owns) and a StoragePolicy (dp_storage.h:
// float32, or bfloat16 with a float32 master copy). docs/ARCHITECTURE.md ("Data parallelism") explains
// buckets, shards, zero3's parameter units, registered gradients and bfloat16 rounding.
//
// Use: broadcast_parameters() once; for gradient accumulation set_require_sync(false) (or a NoSync scope)
// on all but the last micro-step (only that one communicates); finish_gradient_sync() waits for every
// bucket before clip_grad_norm() and step(). Change param_data() only before broadcast_parameters() (or the
// first forward): afterwards the master copy is the truth.
// Memory per rank, persistent between steps (Psi = flat parameter count; memory() reports held sizes,
// resident_memory() measures resident pages with mincore()), plus padding per unit:
//   float32   ddp 16 Psi, zero1 8 Psi + 8 Psi/N,  zero2 4 Psi + 12 Psi/N, zero3 16 Psi/N
//   bfloat16  ddp 16 Psi, zero1 4 Psi + 12 Psi/N, zero2 2 Psi + 14 Psi/N, zero3 16 Psi/N
// Optimizer offload (options.adamw.offload): each rank's moments (and bf16 storage's master weights) of
// the pieces it owns live in host memory and its update runs on the CPU's AdamW kernel over chunked copies
// (dp_storage.h); memory() reports them under host_bytes. Checkpoints hold the same full state either way.
// Checkpoints: gather_optimizer_state() (collective) writes the float32 master weights into the model's flat
// buffer (zero3: the full parameters, materialised until the next backward or step()); broadcast_parameters()
// takes master and bfloat16 copies from it, so a float32 checkpoint loads into a bfloat16 run and back.
//
// Ownership: borrows the model (must outlive this) and shares the process group. Thread-safety: one thread
// (the training loop) calls it and runs the model; collectives run on the group's worker. Blocking:
// zero3's block hooks block in forward/backward until a block's gather arrives. Timeouts: the group's.
// Errors from collectives (dead peer, timeout) are rethrown by the call that waits: finish_gradient_sync(),
// step(), or (zero3) the model's forward/backward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/comm/process_group.h"
#include "trident/nn/model.h"
#include "trident/optim/adamw.h"
#include "trident/parallel/dp_buckets.h"
#include "trident/parallel/dp_sharding.h"
#include "trident/parallel/dp_storage.h"

namespace trident::parallel {

struct DataParallelOptions {
  Strategy strategy = Strategy::kDdp;
  size_t bucket_bytes = 25u << 20;  // PyTorch DDP's default (25 MiB)
  // ddp/zero1: the first bucket (the last parameters, whose gradients backward produces first) closes at
  // this size so its all-reduce starts early in backward, as PyTorch DDP's 1 MiB first bucket; capped at
  // bucket_bytes (0: no smaller first bucket). zero2 and zero3 bucket as before.
  size_t first_bucket_bytes = 1u << 20;
  bool overlap = true;              // start each bucket during backward (false: all after backward)
  optim::AdamWConfig adamw;
  // Storage of parameters and gradients between uses: kFloat32 (parameters are their own master
  // weights) or kBFloat16 (float32 master weights and moments; see the header comment). Others throw.
  DType storage_dtype = DType::kFloat32;
  // The gradients that are reduced (the model's gradient buffer, which the model adopts, nn::Model::
  // adopt_grad_storage; bf16 ddp/zero1: the bf16 gradient buffer) live in memory the group reduces in
  // place (ProcessGroup::alloc_shared: on one host the peers read and write it with plain loads and
  // stores, no kernel copy), when the group offers it and the model is on the CPU. Results are bitwise
  // the same either way; false keeps private memory.
  bool shared_gradients = true;
};

class DataParallel {
 public:
  DataParallel(nn::Model& model, std::shared_ptr<ProcessGroup> pg, DataParallelOptions options);
  ~DataParallel();

  // Rank 0's parameters to every rank (call once after building the model or loading a checkpoint). For a
  // model built without its initial values (zero3 only: nn::Model::initialized() false) nothing is sent:
  // each rank draws the pieces it owns (Model::initialize_range), which are what rank 0 would have sent.
  void broadcast_parameters();
  // Checkpoints without the whole model (zero3, float32 storage, on the CPU): read_checkpoint_range gathers
  // flat elements [begin, begin + count) of the parameters (which 0), exp_avg (1) or exp_avg_sq (2) into dst,
  // a range of one tensor at a time, so a save holds one tensor beyond the shards (collective: every rank
  // reads the same ranges in the same order). False for the other strategies, which gather the whole state.
  bool streams_checkpoints() const;
  void read_checkpoint_range(int which, size_t begin, size_t count, float* dst);
  int64_t optimizer_step() const;
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }
  // Waits for every bucket's collective of the last syncing micro-step (issues those not started yet).
  void finish_gradient_sync();
  // Global gradient norm over all parameters (every rank agrees); scales the gradients by
  // optim::clip_coefficient(norm, max_norm), torch.nn.utils.clip_grad_norm_'s rule. Returns the pre-clip norm.
  double clip_grad_norm(float max_norm);
  // One optimizer step with learning rate lr (ZeRO: on this rank's shard; zero1/2 then all-gather the
  // parameters, zero3 leaves them to the next forward's block gathers).
  void step(float lr);

  Strategy strategy() const { return options_.strategy; }
  DType storage_dtype() const { return options_.storage_dtype; }
  // The range [begin, end) of the flat buffers this rank owns (ddp: everything; zero1: one contiguous
  // shard). zero2/zero3 own one piece of every unit instead (units()); both are 0 for them.
  size_t shard_begin() const { return sharding_->shard_begin(); }
  size_t shard_end() const { return sharding_->shard_end(); }
  size_t num_buckets() const { return engine_->buckets().size(); }
  // The gradient buckets' element ranges [begin, end) of the flat buffer, in launch order (highest first).
  std::vector<std::pair<size_t, size_t>> bucket_ranges() const;
  // The model's gradients live in the group's registered memory (DataParallelOptions::shared_gradients).
  bool gradients_shared() const { return gradients_shared_; }
  const CommStats& last_step_comm() const { return last_stats_; }
  // Bytes held per category: parameters, gradients, master_weights, optimizer_state, comm_buffers (buffer
  // sizes; zero3 and bf16 parameters: the stored copy plus the float32 units materialised now; float32
  // mode: master_weights 0, the parameters are their own master).
  MemoryReport memory() const;
  // Bytes measured resident in RAM per category (mincore on each buffer's pages, a partial page at either
  // end of a buffer counted in full): the model's flat parameter and gradient buffers (counted under
  // parameters and gradients), the shards, the bf16 copies, the master weights, the moments and the
  // persistent staging buffers.
  MemoryReport resident_memory() const;
  nlohmann::json report() const;  // memory (held and resident) + communication + overlap, for the end of training
  // Overlap of the gradient collectives with backward in the last synced step (zero before the first), its
  // per-bucket timings (indexed like the buckets; launched_ns 0 for a bucket without a collective), and the
  // sums over every synced step since construction or reset_overlap_stats() (means: divide by steps).
  const OverlapStats& last_step_overlap() const { return engine_->last_overlap(); }
  const std::vector<BucketTiming>& last_step_bucket_timings() const { return engine_->timings(); }
  const OverlapStats& overlap_totals() const { return engine_->overlap_totals(); }
  void reset_overlap_stats() { engine_->reset_overlap_totals(); }

  // Parameter units materialised by the block hooks (zero3, and bf16 storage): ranges of the flat buffer,
  // highest offset first; for zero3 the same ranges as units().
  size_t num_param_units() const { return punits_.size(); }
  // zero2/zero3: the units this rank's shard is made of (empty for ddp and zero1) and the shard's size
  // (sum of the units' pieces, including padding).
  const std::vector<ShardUnit>& units() const { return sharding_->units(); }
  size_t shard_numel() const { return sharding_->shard_numel(); }
  // zero3: the most flat-buffer elements gathered (in flight or resident) at once since construction or
  // reset_peak_gathered(): the working set of the block schedule (current block + prefetched block + the
  // units a later block of the same pass still reads, e.g. the tied embedding).
  size_t peak_gathered_numel() const { return peak_gathered_; }
  void reset_peak_gathered() { peak_gathered_ = gathered_; }
  // zero3: gathers every unit into the model's flat parameter buffer (collective: every rank calls), so
  // param_data() holds the whole model until the next backward pass or step(). No-op for other stages.
  void gather_full_parameters();

  // Optimizer state for checkpoints: the full flat moments (gathered to every rank) and the step count.
  // Collective. zero3: also gathers the full parameters (see gather_full_parameters()), so that a
  // checkpoint written right after it (the trainer's before_save hook) has the whole model.
  void gather_optimizer_state(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq, int64_t* step);
  void load_optimizer_state(const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq, int64_t step);

 private:
  void launch(size_t bucket);
  void on_grad_ready(size_t param_index);
  void release_finished_grads(bool wait);
  // The group's registered memory for `bytes` (ProcessGroup::alloc_shared), or nullptr when it has none or
  // it cannot be had (then a warning: training goes on in private memory).
  std::shared_ptr<RegisteredBuffer> shared_buffer(size_t bytes);
  bool bf16() const { return options_.storage_dtype == DType::kBFloat16; }
  bool zero3() const { return options_.strategy == Strategy::kZero3; }
  bool block_hooks() const { return zero3() || (bf16() && !punits_.empty()); }

  // ---- parameter units and the block schedule (zero3, and bf16 storage) ----
  enum class ParamState : uint8_t { kReleased, kInFlight, kGathered };
  BucketLayout build_param_units();  // punits_, block_units_, last_fwd_/last_bwd_ from the model's blocks
  // Moves parameter unit ui to `to`, keeping gathered_ (elements of the units in flight or gathered) and
  // its peak in step: the one place a unit's state changes after ensure_sharded().
  void set_unit_state(size_t ui, ParamState to);
  void ensure_sharded();  // the stored parameters (and master) from the model's buffer, once
  void on_block(int block, nn::Model::BlockEvent e);
  void gather_unit(size_t u);  // zero3: starts the all-gather of unit u unless gathered or in flight
  void wait_unit(size_t u);    // unit u materialised in the model's buffer
  void release_unit(size_t u);
  void release_all_units();
  // bf16: the float32 master weights into the model's flat buffer on every rank (collective for zero*).
  void write_master_to_model();
  // Full flat float32 of a per-rank state buffer into a host vector (collective for zero*).
  void gather_state_to_host(const float* state, std::vector<float>* out);

  nn::Model& model_;
  DataParallelOptions options_;
  detail::DpContext ctx_;
  std::unique_ptr<ShardingStrategy> sharding_;
  std::unique_ptr<StoragePolicy> storage_;
  std::unique_ptr<BucketEngine> engine_;
  bool require_sync_ = true;
  bool gradients_shared_ = false;
  // Parameter units (zero3: the gradient buckets; bf16 ddp/zero1/zero2: the block runs), highest offset
  // first, and the block schedule: units each block reads; the last block of a forward pass (highest
  // index) and of a backward pass (lowest index) that reads each unit.
  std::vector<std::pair<size_t, size_t>> punits_;
  std::vector<std::vector<size_t>> block_units_;
  std::vector<int> last_fwd_, last_bwd_;
  std::vector<ParamState> param_state_;
  std::vector<std::shared_ptr<Work>> gather_work_;
  bool sharded_ = false, materialized_ = false;
  bool deferred_init_ = false;  // the model holds no values yet: ensure_sharded() draws this rank's pieces
  bool always_materialized_ = false;  // bf16 without model blocks: the model's buffer stays materialised
  size_t gathered_ = 0, peak_gathered_ = 0;  // elements of units not released
  CommStats last_stats_;
};

// PyTorch's no_sync(): micro-steps inside the scope accumulate gradients locally and communicate nothing;
// the previous setting comes back at the end of the scope.
class NoSync {
 public:
  explicit NoSync(DataParallel& dp) : dp_(dp), was_(dp.require_sync()) { dp_.set_require_sync(false); }
  ~NoSync() { dp_.set_require_sync(was_); }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  DataParallel& dp_;
  bool was_;
};

}  // namespace trident::parallel
