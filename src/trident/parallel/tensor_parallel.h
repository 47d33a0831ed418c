// Megatron-LM tensor parallelism over one tensor-parallel ProcessGroup: TpComm, the collectives nn's
// layers call (nn::TpGroup; recorded into trident::timeline() as comm spans "all_reduce(tp)" /
// "all_gather(tp)" with bytes), and the shard ranges of column-/row-/vocab-parallel layers. The layers
// themselves (column/row-parallel Linear, vocab-parallel embedding and cross-entropy) are nn/layers.h;
// parallel_model.h composes them into model shards.
//
// A vocab shard of rank t holds rows [t*V/T, (t+1)*V/T) of the embedding; a column-parallel Linear holds a
// block of output rows (and of its bias); a row-parallel Linear holds a block of input columns.
//
// Device memory: the collectives take buffers of the layers' device (TpComm's op table) and hand them to the
// group as they are: the nccl backend reduces device memory itself, every other backend stages it through
// host memory (ProcessGroup, comm/device_memory.h).
//
// Ownership: TpComm shares its group (null or size 1: every collective is a no-op, nothing recorded).
// Blocking: every collective blocks the calling thread until done (the group's deadline applies; a dead
// peer or timeout throws NetworkError/TimeoutError from the call). Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trident/comm/process_group.h"
#include "trident/kernels/device.h"
#include "trident/nn/layers.h"

namespace trident::parallel {

// [begin, end) of rank `rank`'s block when n is split evenly over `size` ranks (n % size must be 0).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t n, int rank, int size);

// The tensor-parallel collectives of nn's layers (nn/layers.h) over a ProcessGroup, on buffers of the
// device of `ops`.
class TpComm final : public nn::TpGroup {
 public:
  TpComm(std::shared_ptr<ProcessGroup> group, const kernels::DeviceOps& ops);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  // In-place all-reduce of n floats (sum or max); `microbatch`/`chunk` label the timeline span.
  void all_reduce_sum(float* buf, size_t n, int microbatch = -1, int chunk = -1) override;
  void all_reduce_max(float* buf, size_t n, int microbatch = -1, int chunk = -1) override;
  // recv[size * n] = every rank's send[n], rank order.
  void all_gather(const float* send, float* recv, size_t n, int microbatch = -1, int chunk = -1) override;

 private:
  void all_reduce(float* buf, size_t n, ReduceOp op, int microbatch, int chunk);
  std::shared_ptr<ProcessGroup> group_;
  const kernels::DeviceOps* ops_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace trident::parallel
