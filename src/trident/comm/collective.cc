#include "trident/comm/collective.h"

#include <array>

#include "trident/core/error.h"

namespace trident {
namespace {

using E = Extent;
using B = BusFactor;

// One row per OpKind, in the enum's order (checked below).
constexpr std::array<CollectiveInfo, kNumOpKinds> kCollectives = {{
    {.op = OpKind::kBroadcast, .name = "broadcast", .rooted = true, .reduces = false, .point_to_point = false,
     .in_place = true, .send_at_root = E::kCount, .recv_at_root = E::kNone, .send_elsewhere = E::kNone,
     .recv_elsewhere = E::kCount, .size = E::kCount, .bus = B::kOne},
    {.op = OpKind::kReduce, .name = "reduce", .rooted = true, .reduces = true, .point_to_point = false,
     .in_place = false, .send_at_root = E::kCount, .recv_at_root = E::kCount, .send_elsewhere = E::kCount,
     .recv_elsewhere = E::kNone, .size = E::kCount, .bus = B::kOne},
    {.op = OpKind::kAllReduce, .name = "all_reduce", .rooted = false, .reduces = true, .point_to_point = false,
     .in_place = true, .send_at_root = E::kCount, .recv_at_root = E::kCount, .send_elsewhere = E::kCount,
     .recv_elsewhere = E::kCount, .size = E::kCount, .bus = B::kTwiceOneRankShort},
    {.op = OpKind::kGather, .name = "gather", .rooted = true, .reduces = false, .point_to_point = false,
     .in_place = false, .send_at_root = E::kCount, .recv_at_root = E::kCountTimesWorld,
     .send_elsewhere = E::kCount, .recv_elsewhere = E::kNone, .size = E::kCountTimesWorld,
     .bus = B::kOneRankShort},
    {.op = OpKind::kScatter, .name = "scatter", .rooted = true, .reduces = false, .point_to_point = false,
     .in_place = false, .send_at_root = E::kCountTimesWorld, .recv_at_root = E::kCount,
     .send_elsewhere = E::kNone, .recv_elsewhere = E::kCount, .size = E::kCountTimesWorld,
     .bus = B::kOneRankShort},
    {.op = OpKind::kAllGather, .name = "all_gather", .rooted = false, .reduces = false, .point_to_point = false,
     .in_place = false, .send_at_root = E::kCount, .recv_at_root = E::kCountTimesWorld,
     .send_elsewhere = E::kCount, .recv_elsewhere = E::kCountTimesWorld, .size = E::kCountTimesWorld,
     .bus = B::kOneRankShort},
    {.op = OpKind::kAllGatherV, .name = "all_gatherv", .rooted = false, .reduces = false,
     .point_to_point = false, .in_place = false, .send_at_root = E::kOwnCount, .recv_at_root = E::kTotalCount,
     .send_elsewhere = E::kOwnCount, .recv_elsewhere = E::kTotalCount, .size = E::kTotalCount,
     .bus = B::kOneRankShort},
    {.op = OpKind::kReduceScatter, .name = "reduce_scatter", .rooted = false, .reduces = true,
     .point_to_point = false, .in_place = false, .send_at_root = E::kCountTimesWorld,
     .recv_at_root = E::kCount, .send_elsewhere = E::kCountTimesWorld, .recv_elsewhere = E::kCount,
     .size = E::kCountTimesWorld, .bus = B::kOneRankShort},
    {.op = OpKind::kAllToAll, .name = "all_to_all", .rooted = false, .reduces = false, .point_to_point = false,
     .in_place = false, .send_at_root = E::kCountTimesWorld, .recv_at_root = E::kCountTimesWorld,
     .send_elsewhere = E::kCountTimesWorld, .recv_elsewhere = E::kCountTimesWorld,
     .size = E::kCountTimesWorld, .bus = B::kOneRankShort},
    {.op = OpKind::kBarrier, .name = "barrier", .rooted = false, .reduces = false, .point_to_point = false,
     .in_place = false, .send_at_root = E::kNone, .recv_at_root = E::kNone, .send_elsewhere = E::kNone,
     .recv_elsewhere = E::kNone, .size = E::kNone, .bus = B::kNone},
    {.op = OpKind::kSend, .name = "send", .rooted = false, .reduces = false, .point_to_point = true,
     .in_place = false, .send_at_root = E::kCount, .recv_at_root = E::kNone, .send_elsewhere = E::kCount,
     .recv_elsewhere = E::kNone, .size = E::kCount, .bus = B::kOne},
    {.op = OpKind::kRecv, .name = "recv", .rooted = false, .reduces = false, .point_to_point = true,
     .in_place = false, .send_at_root = E::kNone, .recv_at_root = E::kCount, .send_elsewhere = E::kNone,
     .recv_elsewhere = E::kCount, .size = E::kCount, .bus = B::kOne},
}};

constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumOpKinds; ++i)
    if (static_cast<int>(kCollectives[static_cast<size_t>(i)].op) != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "kCollectives must hold one row per OpKind, in the enum's order");

size_t total_count(const CollArgs& a) {
  size_t total = 0;
  if (a.counts != nullptr)
    for (size_t c : *a.counts) total += c;
  return total;
}

}  // namespace

const CollectiveInfo& collective_info(OpKind op) {
  const auto i = static_cast<size_t>(op);
  if (i >= kCollectives.size()) TRIDENT_THROW(InvalidArgument, "unknown collective kind {}", i);
  return kCollectives[i];
}

size_t extent_elems(Extent e, const CollArgs& a, int rank, int world) {
  switch (e) {
    case Extent::kNone: return 0;
    case Extent::kCount: return a.count;
    case Extent::kCountTimesWorld: return a.count * static_cast<size_t>(world);
    case Extent::kOwnCount:
      return a.counts != nullptr && rank >= 0 && static_cast<size_t>(rank) < a.counts->size()
                 ? (*a.counts)[static_cast<size_t>(rank)]
                 : 0;
    case Extent::kTotalCount: return total_count(a);
  }
  return 0;
}

BufferBytes buffer_bytes(const CollArgs& a, int rank, int world) {
  const CollectiveInfo& c = collective_info(a.op);
  const bool root = c.rooted && rank == a.root;
  const size_t es = dtype_size(a.dtype);
  return {extent_elems(root ? c.send_at_root : c.send_elsewhere, a, rank, world) * es,
          extent_elems(root ? c.recv_at_root : c.recv_elsewhere, a, rank, world) * es};
}

size_t size_bytes(const CollArgs& a, int world) {
  const CollectiveInfo& c = collective_info(a.op);
  if (c.size == Extent::kNone) return 0;
  return extent_elems(c.size, a, 0, world) * dtype_size(a.dtype);
}

size_t size_elems(OpKind op, size_t count, int world) {
  switch (collective_info(op).size) {
    case Extent::kNone: return 0;
    case Extent::kCount:
    case Extent::kOwnCount: return count;
    case Extent::kCountTimesWorld:
    case Extent::kTotalCount: return count * static_cast<size_t>(world);
  }
  return 0;
}

// size x busbw / algbw, in an order that keeps integral byte counts exact: size x k (n-1) first, then / n.
static double bus_scaled(BusFactor b, double size, int world) {
  switch (b) {
    case BusFactor::kNone: return 0.0;
    case BusFactor::kOne: return size;
    case BusFactor::kOneRankShort: return size * (world - 1) / world;
    case BusFactor::kTwiceOneRankShort: return 2 * size * (world - 1) / world;
  }
  return 0.0;
}

double bus_factor(OpKind op, int world) {
  return world > 0 ? bus_scaled(collective_info(op).bus, 1.0, world) : 0.0;
}

double bus_bytes(OpKind op, double size_bytes, int world) {
  return world <= 1 ? 0.0 : bus_scaled(collective_info(op).bus, size_bytes, world);
}

// Every call is written as name(count, dtype[, reduction][, root][, peer, tag]); a call without payload as
// name().
std::string describe(const CollArgs& a) {
  // A fingerprint from a peer may carry any value; its description must not throw.
  if (static_cast<size_t>(a.op) >= kCollectives.size())
    return fmt::format("op {}(count={}, {})", static_cast<int>(a.op), a.count, dtype_name(a.dtype));
  const CollectiveInfo& c = collective_info(a.op);
  if (c.size == Extent::kNone) return fmt::format("{}()", c.name);
  std::string s = fmt::format("{}(count={}, {}", c.name, a.count, dtype_name(a.dtype));
  if (c.reduces) s += fmt::format(", {}", reduce_op_name(a.redop));
  if (c.rooted) s += fmt::format(", root={}", a.root);
  if (c.point_to_point) s += fmt::format(", peer={}, tag={}", a.peer, a.tag);
  return s + ")";
}

}  // namespace trident
