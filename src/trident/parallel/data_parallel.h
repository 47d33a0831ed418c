// Data parallelism: DDP and ZeRO stages 1, 2 and 3 as one mechanism over a model's flat buffers, on the
// model's device (CPU or CUDA: every memory operation and elementwise kernel goes through
// kernels::device_ops(model.device()), so there is one DataParallel for both).
//
// DataParallel composes three parts along the axes the mechanism varies on:
//   BucketEngine    (dp_buckets.h)  which ranges form gradient buckets, launching each bucket's collective
//                                   the moment backward completes it, waiting, overlap accounting;
//   ShardingStrategy (dp_sharding.h) one per stage: what a bucket's collective is, what each rank owns of
//                                   the optimizer state and parameters, re-assembly after the step, and
//                                   zero3's per-unit parameter gather;
//   StoragePolicy   (dp_storage.h)  float32, or bfloat16 with a float32 master copy;
// plus the block schedule (here) that materialises parameter units before a block runs (zero3 gathers,
// bf16 widens) and releases them after the last block that reads them.
//
// Every rank computes gradients on its shard of the global batch. Gradients are grouped into buckets
// (contiguous ranges of the flat gradient buffer, filled in reverse parameter order as backward produces
// them; ddp/zero1: a small first bucket, DataParallelOptions::first_bucket_bytes, so the first collective
// starts early); the moment a bucket's last gradient is written (the model's grad-ready hook), its
// collective starts asynchronously on the process group, reading the gradient memory in place (no copy):
//   ddp    all-reduce (avg) of every bucket; every rank runs AdamW on all parameters.
//   zero1  same all-reduce; AdamW state (moments) kept only for this rank's shard of the flat buffer; each
//          rank updates its shard, then the updated parameters are all-gathered.
//   zero2  buckets are fixed-size chunks of the flat buffer (a multiple of N elements, counted from the
//          top, so only the lowest chunk is padded: the shard is exactly padded/N elements), each ready
//          once every parameter overlapping it is; reduce-scatter (avg) of every bucket into this rank's
//          persistent gradient shard; the bucket's
//          full-gradient pages are then handed back to the OS (madvise, they read back as zero, which is
//          what zero_grad wants), so no rank keeps a full gradient; AdamW on the shard; all-gather params.
//   zero3  as zero2, and parameters are sharded too: a bucket is a "unit" (the parameters one model block
//          owns, Model::blocks()); each rank keeps only its piece of every unit (its master float32 copy)
//          and the model's flat parameter buffer is a working buffer whose pages are released when not
//          in use. The model's block hook gathers (all-gatherv) a block's units just before its forward,
//          again before its backward (and its activation-checkpointing recompute), and releases each unit
//          after the last block of the pass that reads it; the next block's gather is prefetched
//          asynchronously while the current block computes. Per step: 2 all-gathers and 1 reduce-scatter
//          of the (padded) parameter volume; gradient accumulation re-gathers parameters each micro-step
//          but reduce-scatters gradients once (no_sync micro-steps accumulate the full local gradient).
// Registered gradients (every stage, CPU models; DataParallelOptions::shared_gradients): where the group
// offers registered memory (ProcessGroup::alloc_shared: the native backend, every rank on one host), the buffer the
// buckets are reduced from lives there (the model adopts it as its gradient buffer; bf16 ddp/zero1: the bf16
// gradients), so the peers read it with plain loads and stores instead of kernel copies. Released gradient
// pages (zero2/zero3, bf16) go back with MADV_REMOVE and read back as zero, as private ones do.
// Sharding (dp_sharding.h): zero1 one contiguous N-th of the padded buffer; zero2/zero3 one ceil(L/N)
// piece of every bucket/unit. Any size works.
// Gradient accumulation: set_require_sync(false) (or a NoSync scope) for all but the last micro-step;
// only the last one communicates gradients. finish_gradient_sync() waits for every bucket before
// clipping/stepping.
// Memory (float32, Psi = flat parameter count, per rank, persistent between steps): ddp 16 Psi (params 4,
// grads 4, moments 8), zero1 8 Psi + 8 Psi/N, zero2 4 Psi + 12 Psi/N, zero3 16 Psi/N, plus per-unit
// padding and the partial pages at unit edges (bfloat16 storage: see below). memory() reports held sizes, resident_memory() measures
// the buffers' resident pages with mincore().
// Overlap accounting (always on: a few clock reads per bucket, no allocation per step): per synced step,
// the backward window (from the first grad-ready hook of the syncing micro-step to the call of
// finish_gradient_sync()), each gradient bucket's collective as it really ran on the group's worker
// (Work::started_ns/finished_ns), and the time finish_gradient_sync() blocked. Hidden fraction = the
// collectives' time inside the window / their total time (0 when nothing overlapped, e.g. overlap=false).
// bfloat16 storage (DataParallelOptions::storage_dtype = kBFloat16; PyTorch FSDP's MixedPrecision with
// param_dtype = reduce_dtype = bfloat16, DeepSpeed's bf16 mode): persistent per rank are bfloat16
// parameters (ddp/zero1/zero2: all of them; zero3: this rank's pieces), bfloat16 gradients (ddp/zero1:
// all; zero2/zero3: the shard) and float32 master weights and AdamW moments (ddp: all; zero1/2/3: this
// rank's shard), K = 12 bytes of optimizer state per parameter:
//   ddp 16 Psi, zero1 4 Psi + 12 Psi/N, zero2 2 Psi + 14 Psi/N, zero3 16 Psi/N.
// The model's float32 flat buffers become transient working buffers. Parameters are materialised
// (bf16 -> fp32, exact) per "parameter unit" by the same block hooks zero3 uses: a unit is the run of
// parameters one block owns; its source is the local bf16 copy (ddp/zero1/zero2) or the all-gathered
// bf16 pieces (zero3: gathered into the upper half of the unit's float32 range and widened in place, so
// no staging buffer); its pages are released after the last block of the pass that reads it. Models
// without blocks keep the whole model materialised (one unit, refreshed after every step: +4 Psi).
// Gradients: when a bucket is ready (syncing micro-step) its float32 gradients are rounded to bf16
// (round to nearest even): ddp/zero1 into the persistent bf16 gradient buffer, then all-reduce (avg) in
// bf16 in place; zero2/zero3 in place into the first half of the bucket's float32 range, then
// reduce-scatter (avg) in bf16 into the bf16 shard. The float32 pages then go back to the OS. The
// comm layer (comm/reduce.h) combines bf16 pairwise in float32 and rounds each partial result to bf16:
// one rounding per combine, N-1 per element for N ranks (then the average's division, exact for N a
// power of two), not one float32 accumulation over all ranks. At N = 2 that is a single rounding whatever
// the algorithm, so all stages give bit-identical results (tested; the clip norm is summed in float64 in
// different orders, which could only matter at a float rounding boundary of the coefficient); at N > 2
// the order of the roundings follows the algorithm's chunking. Accumulation: no_sync micro-steps accumulate in the model's float32 gradient buffer
// (exact, like the float32 mode; costs 4 Psi of transient gradient pages until the syncing micro-step)
// rather than in bf16 (which would round every micro-step's sum and save those pages): accuracy first.
// clip_grad_norm() computes the norm of the bf16 gradients and defers the scale to step(), which runs
// AdamW on the float32 master with fp32(bf16 grad) x coef and then rounds: bf16 params = round(master);
// zero1/zero2 all-gather the bf16 parameters, zero3 keeps its bf16 pieces. Communication is the float32
// table with 2-byte elements. Checkpoints: gather_optimizer_state() writes the float32 MASTER weights
// into the model's flat buffer (every strategy; the next forward re-materialises the bf16 values, so a
// run that saves stays on the run that does not), gather_full_parameters() does the same and keeps them
// materialised for forward-only passes (sampling; the first training forward after it reads the master
// weights); broadcast_parameters() takes master and bf16 copies from the model's buffer, so a float32
// checkpoint loads into a bf16 run and vice versa. Change param_data() only before
// broadcast_parameters() (or the first forward): afterwards the master copy is the truth. Cost: every
// materialisation faults the released pages back in (zeroed by the kernel): forward and backward each
// re-fault the parameters, each step the gradients (about +10% CPU per step for nanoGPT on 2 ranks,
// nearly all system time; docs/PERFORMANCE.md).
// Checkpoints under zero3 (float32 storage): gather_optimizer_state() (the trainer's before_save path) also materialises the
// full parameters in the model's buffer on every rank, so the existing save path writes the whole model;
// they stay materialised (forward passes then gather nothing) until the next backward pass, which
// releases them, or step().
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

  // Rank 0's parameters to every rank (call once after building the model or loading a checkpoint).
  void broadcast_parameters();
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }
  // Waits for every bucket's collective of the last syncing micro-step (issues those not started yet).
  void finish_gradient_sync();
  // Global gradient norm over all parameters (every rank agrees); scales the gradients by
  // min(1, max_norm / (norm + 1e-6)) like torch.nn.utils.clip_grad_norm_. Returns the pre-clip norm.
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
