#include "trident/comm/device_reads.h"

#include <algorithm>
#include <iterator>

#include "trident/core/error.h"

namespace trident {
namespace {

size_t elem(const DeviceReads& r) { return dtype_size(r.args->dtype); }

// Reduce-scatter by reads: this rank reduces slice `me` of every rank's input into its own output; then
// gathers the other slices from their owners' outputs.
void all_reduce(const DeviceReads& r) {
  const CollArgs& a = *r.args;
  const size_t es = elem(r), c = a.count, W = static_cast<size_t>(r.size), me = static_cast<size_t>(r.rank);
  auto lo = [&](size_t q) { return c * q / W; };
  std::vector<const void*> srcs(W);
  for (size_t q = 0; q < W; ++q) srcs[q] = r.send[q] + lo(me) * es;
  r.dm->reduce(r.recv[me] + lo(me) * es, srcs.data(), r.size, lo(me + 1) - lo(me), a.dtype, a.redop);
  r.phase_done();
  for (size_t q = 0; q < W; ++q)
    if (q != me) r.dm->copy(r.recv[me] + lo(q) * es, r.recv[q] + lo(q) * es, (lo(q + 1) - lo(q)) * es);
  r.phase_done();
}

void reduce_scatter(const DeviceReads& r) {
  const CollArgs& a = *r.args;
  const size_t es = elem(r), c = a.count, W = static_cast<size_t>(r.size), me = static_cast<size_t>(r.rank);
  std::vector<const void*> srcs(W);
  for (size_t q = 0; q < W; ++q) srcs[q] = r.send[q] + me * c * es;
  r.dm->reduce(r.recv[me], srcs.data(), r.size, c, a.dtype, a.redop);
  r.phase_done();
}

void all_gather(const DeviceReads& r) {
  const size_t es = elem(r), c = r.args->count, me = static_cast<size_t>(r.rank);
  for (size_t q = 0; q < static_cast<size_t>(r.size); ++q) r.dm->copy(r.recv[me] + q * c * es, r.send[q], c * es);
  r.phase_done();
}

void all_gatherv(const DeviceReads& r) {
  const size_t es = elem(r), me = static_cast<size_t>(r.rank);
  size_t at = 0;
  for (size_t q = 0; q < static_cast<size_t>(r.size); ++q) {
    const size_t k = (*r.args->counts)[q];
    r.dm->copy(r.recv[me] + at * es, r.send[q], k * es);
    at += k;
  }
  r.phase_done();
}

void broadcast(const DeviceReads& r) {
  const CollArgs& a = *r.args;
  const size_t me = static_cast<size_t>(r.rank);
  if (r.rank != a.root) r.dm->copy(r.recv[me], r.recv[static_cast<size_t>(a.root)], a.count * elem(r));
  r.phase_done();
}

struct Pattern {
  OpKind op;
  void (*run)(const DeviceReads&);
};
constexpr Pattern kPatterns[] = {{OpKind::kAllReduce, all_reduce},
                                 {OpKind::kReduceScatter, reduce_scatter},
                                 {OpKind::kAllGather, all_gather},
                                 {OpKind::kAllGatherV, all_gatherv},
                                 {OpKind::kBroadcast, broadcast}};

const Pattern* find(OpKind op) {
  auto it = std::find_if(std::begin(kPatterns), std::end(kPatterns), [op](const Pattern& p) { return p.op == op; });
  return it == std::end(kPatterns) ? nullptr : it;
}

}  // namespace

bool device_reads_support(OpKind op) { return find(op) != nullptr; }

void run_device_reads(const DeviceReads& r) {
  const Pattern* p = find(r.args->op);
  TRIDENT_CHECK(p != nullptr, InvalidArgument, "the device path has no read pattern for {}", op_name(r.args->op));
  p->run(r);
}

}  // namespace trident
