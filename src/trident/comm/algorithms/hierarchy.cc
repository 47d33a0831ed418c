// host_layout (algorithm.h) and SubContext (hierarchical.h).
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/comm/algorithms/hierarchical.h"
#include "trident/core/error.h"

namespace trident {

HostLayout host_layout(const AlgoContext& ctx) {
  std::vector<int> h(ctx.size());
  for (int r = 0; r < ctx.size(); ++r) h[r] = ctx.host_of(r);
  return HostLayout::from_hosts(std::move(h));
}

namespace algo {

SubContext::SubContext(AlgoContext& parent, std::vector<int> members, uint32_t tag_base, int slot_base)
    : parent_(parent), members_(std::move(members)), tag_base_(tag_base), slot_base_(slot_base) {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == parent.rank()) rank_ = static_cast<int>(i);
  TRIDENT_CHECK(rank_ >= 0, InvalidArgument, "SubContext: rank {} is not among its members", parent.rank());
}

uint32_t SubContext::tag(uint32_t step) const {
  // Fold tags (0xFFFF000x) pass through unshifted: sub-contexts with a nonzero base never run a fold.
  if (step >= 0xFFFF0000u) return step;
  TRIDENT_CHECK(step < (1u << 28), InvalidArgument,
                "hierarchical: step tag {} overflows its phase's tag range; raise TRIDENT_CHUNK_BYTES", step);
  return tag_base_ + step;
}

Request SubContext::isend(int peer, uint32_t step, const void* data, size_t nbytes) {
  return parent_.isend(members_[peer], tag(step), data, nbytes);
}
Request SubContext::irecv(int peer, uint32_t step, void* data, size_t nbytes) {
  return parent_.irecv(members_[peer], tag(step), data, nbytes);
}
Request SubContext::irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                                 const void* own) {
  return parent_.irecv_reduce(members_[peer], tag(step), dst, count, dtype, op, own);
}

}  // namespace algo
}  // namespace trident
