// Megatron-LM tensor-parallel building blocks over one tensor-parallel ProcessGroup: the TP collectives
// (recorded into trident::timeline() as comm spans "all_reduce(tp)" / "all_gather(tp)" with bytes), the
// shard ranges of column-/row-/vocab-parallel layers, the vocab-parallel embedding and the vocab-parallel
// cross-entropy that never gathers full logits. parallel_model.h composes them into model shards.
//
// Shapes follow kernels/cpu/ops.h (row-major, Linear weights [out, in]). A vocab shard of rank t holds
// rows [t*V/T, (t+1)*V/T) of the embedding; a column-parallel Linear holds a block of output rows (and of
// its bias); a row-parallel Linear holds a block of input columns (its bias stays whole and is added once,
// after the all-reduce of the partial outputs).
//
// Ownership: TpComm shares its group (null or size 1: every collective is a no-op, nothing recorded).
// Blocking: every collective blocks the calling thread until done (the group's deadline applies; a dead
// peer or timeout throws NetworkError/TimeoutError from the call). Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trident/comm/process_group.h"

namespace trident::parallel {

// [begin, end) of rank `rank`'s block when n is split evenly over `size` ranks (n % size must be 0).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t n, int rank, int size);

class TpComm {
 public:
  explicit TpComm(std::shared_ptr<ProcessGroup> group);
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  // In-place all-reduce of n floats (sum or max); `microbatch`/`chunk` label the timeline span.
  void all_reduce_sum(float* buf, size_t n, int microbatch = -1, int chunk = -1);
  void all_reduce_max(float* buf, size_t n, int microbatch = -1, int chunk = -1);
  // recv[size * n] = every rank's send[n], rank order.
  void all_gather(const float* send, float* recv, size_t n, int microbatch = -1, int chunk = -1);

 private:
  void all_reduce(float* buf, size_t n, ReduceOp op, int microbatch, int chunk);
  std::shared_ptr<ProcessGroup> group_;
  int rank_ = 0;
  int size_ = 1;
};

// out[N, C] += bias[C] on every row (bias nullable: no-op).
void add_bias(float* out, const float* bias, int N, int C);

// Vocab-parallel embedding lookup: out[i] = wte_shard[tokens[i] - v0] when tokens[i] lies in
// [v0, v0 + vl), else 0 (the caller all-reduces). Tokens outside [0, V) throw InvalidArgument.
void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0,
                                      int64_t vl, int64_t V, int N, int C);
// dwte_shard[tokens[i] - v0] += dout[i] for in-range tokens.
void vocab_parallel_embedding_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0,
                                       int64_t vl, int N, int C);

// Vocab-parallel softmax cross-entropy over local logits[N, vl] (columns v0..v0+vl of the full [N, V]):
// all-reduce (max) of the row maxima, then one all-reduce (sum) of [sum of exp | target logit] (2N floats).
// Returns the SUM over rows of -log softmax[target] (identical on every rank). When dlogits is non-null,
// writes (softmax - onehot) * dscale for the local columns (may alias logits).
double vocab_parallel_cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int64_t vl,
                                    int64_t v0, int64_t V, float dscale, TpComm& tp, int microbatch = -1,
                                    int chunk = -1);

}  // namespace trident::parallel
