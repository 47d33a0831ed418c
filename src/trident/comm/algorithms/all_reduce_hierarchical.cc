#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"
#include "trident/comm/algorithms/hierarchical.h"

namespace trident {

namespace {

// Half of the ring all-reduce on `ctx` over buf[count], in place: the reduce-scatter (rank r ends owning
// block r+1 of the size() blocks) or the all-gather that follows it.
void ring_half(AlgoContext& ctx, void* buf, size_t count, DType dtype, ReduceOp op, bool reduce_scatter) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  const size_t biggest = block_count(count, n, 0);
  const size_t chunk = algo::chunk_elems(ctx, biggest * es, es);
  auto plan = [&](int s, size_t c, algo::RingUnit& u) {
    const int sb = reduce_scatter ? algo::mod(r - s, n) : algo::mod(r + 1 - s, n);
    const int rb = reduce_scatter ? algo::mod(r - s - 1, n) : algo::mod(r - s, n);
    u.reduce = reduce_scatter;
    u.send = algo::at(buf, block_offset(count, n, sb) + c * chunk, es);
    u.send_elems = algo::chunk_len(block_count(count, n, sb), c, chunk);
    u.recv = algo::at(buf, block_offset(count, n, rb) + c * chunk, es);
    u.recv_elems = algo::chunk_len(block_count(count, n, rb), c, chunk);
  };
  algo::ring_pipeline(ctx, n - 1, algo::ceil_div(biggest, chunk), es, dtype, op, plan);
}

}  // namespace

void AllReduceHierarchical::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  if (n == 1 || a.count == 0) return;
  const HostLayout lay = host_layout(ctx);
  const int H = lay.hosts(), L = lay.min_local(), li = lay.local_index(r);
  const std::vector<int>& mine = lay.members[lay.host_of[r]];
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  // Uneven hosts: local ranks L.. hand their buffer to core rank (index % L) and wait for the result.
  if (li >= L) {
    const int core = mine[li % L];
    ctx.send(core, algo::kExtraTags, a.recv, bytes);
    ctx.recv(core, algo::kExtraTags + 1, a.recv, bytes);
    return;
  }
  std::vector<int> extras;
  for (size_t j = li + L; j < mine.size(); j += L) extras.push_back(mine[j]);
  for (int e : extras) ctx.wait({ctx.irecv_reduce(e, algo::kExtraTags, a.recv, a.count, a.dtype, a.redop)});

  const std::vector<int> core(mine.begin(), mine.begin() + L);
  {
    algo::SubContext intra(ctx, core, algo::kIntraFirstTags, 4);
    ring_half(intra, a.recv, a.count, a.dtype, a.redop, /*reduce_scatter=*/true);
  }
  if (H > 1) {
    std::vector<int> peers;
    for (const auto& m : lay.members) peers.push_back(m[li]);
    const int b = (li + 1) % L;  // the block this rank owns after the intra reduce-scatter
    CollArgs shard = a;
    shard.recv = algo::at(a.recv, block_offset(a.count, L, b), es);
    shard.send = shard.recv;
    shard.count = block_count(a.count, L, b);
    if (shard.count > 0) {
      algo::SubContext inter(ctx, peers, algo::kInterTags, 8);
      if (shard.count * es >= cost::kHierInterRingBytes) AllReduceRing::run(inter, shard);
      else AllReduceRecursiveDoubling::run(inter, shard);
    }
  }
  {
    algo::SubContext intra(ctx, core, algo::kIntraSecondTags, 12);
    ring_half(intra, a.recv, a.count, a.dtype, a.redop, /*reduce_scatter=*/false);
  }
  if (!extras.empty()) {
    std::vector<Request> out;
    for (int e : extras) out.push_back(ctx.isend(e, algo::kExtraTags + 1, a.recv, bytes));
    ctx.wait(out);
  }
}

}  // namespace trident
