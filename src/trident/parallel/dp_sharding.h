// DataParallel's sharding strategies: one class per ddp / zero1 / zero2 / zero3, each saying what a
// gradient bucket's collective is (all-reduce in place, or reduce-scatter into this rank's gradient
// shard), which pieces of the flat buffer this rank owns (its AdamW moments and, with bf16 storage, its
// master weights), how the updated parameters become whole again after the step (nothing, an all-gather,
// per-unit all-gathervs) and, for zero3, the all-gather of one parameter unit before a block uses it.
// What the elements are (float32, or bfloat16 with a float32 master) is the storage policy's
// (parallel/dp_storage.h); when buckets launch is the bucket engine's (parallel/dp_buckets.h).
//
// Sharding: zero1 splits the whole flat buffer into N equal pieces (padded to a multiple of N); zero2 and
// zero3 split each bucket/unit of L elements into N pieces of ceil(L/N) (the last ones shorter or empty),
// and a rank's shard is the concatenation of its pieces. Any size works.
//
// Ownership: strategies borrow the DpContext (DataParallel owns both). Thread-safety: the training loop's
// thread only. Errors: collectives' failures are rethrown by the waits.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/kernels/device.h"
#include "trident/nn/model.h"
#include "trident/parallel/dp_buckets.h"

namespace trident::parallel {

enum class Strategy { kDdp, kZero1, kZero2, kZero3 };
Strategy parse_strategy(const std::string& name);  // ddp | zero1 | zero2 | zero3
const char* strategy_name(Strategy s);

// Bytes moved by this rank, per collective kind, in the last completed step (nccl-tests' convention:
// what this rank sends on the wire under a bandwidth-optimal algorithm: all-reduce 2(N-1)/N x size,
// reduce-scatter and all-gather (N-1)/N x size, broadcast size).
struct CommStats {
  std::map<std::string, double> bytes;  // kind (op_name) -> bytes each rank moved, nccl-tests' bus convention
  std::map<std::string, int> calls;     // kind -> collectives issued
  double total() const;
};

// A contiguous range of the flat buffers sharded across ranks (zero2: a gradient bucket; zero3: the
// parameters one block owns). Piece r is [begin + r*piece, begin + min(end - begin, (r+1)*piece)).
struct ShardUnit {
  size_t begin = 0, end = 0;
  size_t piece = 0;         // ceil((end - begin) / N)
  size_t shard_offset = 0;  // of this rank's piece in the shard buffers
  size_t mine_begin = 0;    // this rank's piece in flat coordinates
  size_t mine_count = 0;    // its valid elements (<= piece; 0 for an empty piece)
};

// A piece of the flat buffer this rank updates: flat elements [flat_begin, flat_begin + count), stored
// at `offset` in this rank's state buffers (moments, master weights, gradient shard).
struct OwnedPiece {
  size_t flat_begin = 0, count = 0, offset = 0;
};

namespace detail {

// What the strategy, the storage policy and DataParallel share: the model, its device's op table (every
// memory operation and elementwise kernel goes through it), the group, and the step's traffic.
struct DpContext {
  nn::Model& model;
  std::shared_ptr<ProcessGroup> pg;
  const kernels::DeviceOps& ops;
  int rank = 0, world = 1;
  size_t n = 0;       // flat parameter count
  size_t padded = 0;  // n rounded up to a multiple of world
  CommStats stats;

  bool on_cpu() const { return ops.device == kernels::Device::kCpu; }
  // Counts one collective of nccl-tests' size `size_bytes` (comm/collective.h: size_bytes) under its name,
  // at the bytes each rank moves by the bus convention (bus_bytes).
  void account(OpKind op, double size_bytes);
  // [p, p + count) is no longer needed and must read back as zero: on the CPU its whole pages go back to
  // the OS (nn::release_pages; the partial pages at either end are left as they are), on a device it is
  // zeroed.
  void release(float* p, size_t count) const;
};

}  // namespace detail

class StoragePolicy;

class ShardingStrategy {
 public:
  explicit ShardingStrategy(detail::DpContext& c) : c_(c) {}
  virtual ~ShardingStrategy() = default;

  virtual Strategy kind() const = 0;
  bool shards_gradients() const { return kind() == Strategy::kZero2 || kind() == Strategy::kZero3; }
  bool shards_parameters() const { return kind() == Strategy::kZero3; }

  // The gradient buckets (first_cap/cap in elements; zero3: `param_units`, the block-owned ranges, are
  // the buckets). Builds owned() and, for zero2/zero3, units() from them. Called once.
  virtual BucketLayout layout(size_t first_cap, size_t cap, const BucketLayout* param_units) = 0;

  // Posts bucket i's gradient collective over the storage's gradients (null: nothing to run).
  virtual std::shared_ptr<Work> reduce(size_t i, GradBucket& b, StoragePolicy& s) = 0;
  // Squared L2 norm of the reduced gradients over all ranks (every rank gets it).
  virtual double grad_sq_norm(StoragePolicy& s) = 0;
  // AdamW on the owned pieces; then the stored parameters made whole where this strategy keeps them
  // whole (zero1/zero2: all-gather; ddp: every rank updated everything; zero3: the block gathers do it).
  virtual void update(StoragePolicy& s, float lr) = 0;
  // state (owned pieces, state_numel() float32 elements) -> full flat float32 `full` (n elements) on every
  // rank; both live in the memory of `mem` (the model's device, or the host for offloaded state: the
  // collectives take either). Collective for zero*.
  virtual void gather_state(const kernels::DeviceOps& mem, const float* state, float* full) = 0;
  // zero2/zero3: flat elements [begin, begin + count) of a state kept in pieces of the units (moments,
  // zero3's parameter shard), which must lie inside one unit, gathered into dst on every rank: each rank
  // sends only the part of its piece inside the range (collective; every rank calls with the same range).
  void gather_state_range(const float* state, size_t begin, size_t count, float* dst);
  // The owned pieces of full (n float32) -> state (zeroed first), both in the memory of `mem`. Local.
  void scatter_state(const kernels::DeviceOps& mem, const float* full, float* state) const;
  // zero3: starts the all-gather of parameter unit ui from the storage's shard into the model's buffer.
  virtual std::shared_ptr<Work> gather_param_unit(size_t ui, StoragePolicy& s);

  const std::vector<OwnedPiece>& owned() const { return owned_; }
  size_t state_numel() const { return state_numel_; }
  size_t shard_begin() const { return shard_begin_; }  // ddp/zero1: the owned contiguous range
  size_t shard_end() const { return shard_end_; }
  const std::vector<ShardUnit>& units() const { return units_; }  // zero2/zero3
  size_t shard_numel() const { return shard_numel_; }

 protected:
  void build_units(const std::vector<GradBucket>& buckets);  // zero2/zero3

  detail::DpContext& c_;
  std::vector<OwnedPiece> owned_;
  size_t state_numel_ = 0;
  size_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<ShardUnit> units_;
  std::vector<std::vector<size_t>> counts_;  // per unit: all_gatherv counts
  size_t shard_numel_ = 0;
};

std::unique_ptr<ShardingStrategy> make_sharding(Strategy s, detail::DpContext& c);

}  // namespace trident::parallel
