#include "trident/parallel/tensor_parallel.h"

#include "trident/comm/collective.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"

namespace trident::parallel {

ShardRange shard_range(int64_t n, int rank, int size) {
  TRIDENT_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument, "shard_range: rank {} of {} is invalid",
                rank, size);
  TRIDENT_CHECK(n % size == 0, InvalidArgument, "shard_range: {} elements do not split evenly over {} ranks", n,
                size);
  const int64_t per = n / size;
  return {per * rank, per * (rank + 1)};
}

TpComm::TpComm(std::shared_ptr<ProcessGroup> group, const kernels::DeviceOps& ops)
    : group_(std::move(group)), ops_(&ops) {
  if (group_) {
    rank_ = group_->rank();
    size_ = group_->size();
  }
}

void TpComm::all_reduce(float* buf, size_t n, ReduceOp op, int microbatch, int chunk) {
  if (size_ <= 1 || n == 0) return;
  // Bytes this rank sends under a bandwidth-optimal all-reduce (the bus convention: comm/collective.h).
  const double bytes = bus_bytes(OpKind::kAllReduce, static_cast<double>(n * sizeof(float)), size_);
  ScopedSpan span(SpanKind::kComm, "all_reduce(tp)", microbatch, chunk, bytes);
  group_->all_reduce(buf, n, DType::kFloat32, op);
}

void TpComm::all_reduce_sum(float* buf, size_t n, int microbatch, int chunk) {
  all_reduce(buf, n, ReduceOp::kSum, microbatch, chunk);
}
void TpComm::all_reduce_max(float* buf, size_t n, int microbatch, int chunk) {
  all_reduce(buf, n, ReduceOp::kMax, microbatch, chunk);
}

void TpComm::all_gather(const float* send, float* recv, size_t n, int microbatch, int chunk) {
  if (size_ <= 1) {
    if (n > 0 && recv != send) ops_->copy(recv, send, n * sizeof(float));
    return;
  }
  const double size = static_cast<double>(size_elems(OpKind::kAllGather, n, size_) * sizeof(float));
  const double bytes = bus_bytes(OpKind::kAllGather, size, size_);
  ScopedSpan span(SpanKind::kComm, "all_gather(tp)", microbatch, chunk, bytes);
  group_->all_gather(send, recv, n, DType::kFloat32);
}

}  // namespace trident::parallel
