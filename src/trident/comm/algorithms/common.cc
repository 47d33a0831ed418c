#include "trident/comm/algorithms/common.h"

#include <algorithm>

namespace trident::algo {

size_t chunk_elems(const AlgoContext& ctx, size_t piece_bytes, size_t esize) {
  size_t bytes = ctx.chunk_bytes();
  if (bytes == 0) {
    constexpr size_t kWhole = size_t{1} << 20, kMin = size_t{512} << 10, kMax = size_t{4} << 20;
    bytes = piece_bytes <= kWhole ? piece_bytes : std::clamp(piece_bytes / 4 / 4096 * 4096, kMin, kMax);
  }
  return std::max<size_t>(1, bytes / std::max<size_t>(1, esize));
}

Fold fold_in(AlgoContext& ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int n = ctx.size(), r = ctx.rank();
  Fold f;
  f.p = floor_pow2(n);
  f.rem = n - f.p;
  if (r < 2 * f.rem) {
    if (r % 2 == 0) {
      ctx.send(r + 1, kFoldInTag, buf, count * dtype_size(dtype));
      f.newrank = -1;
    } else {
      ctx.wait({ctx.irecv_reduce(r - 1, kFoldInTag, buf, count, dtype, op)});
      f.newrank = r / 2;
    }
  } else {
    f.newrank = r - f.rem;
  }
  return f;
}

void fold_out(AlgoContext& ctx, const Fold& f, void* buf, size_t bytes) {
  const int r = ctx.rank();
  if (r >= 2 * f.rem) return;
  if (r % 2 == 1)
    ctx.send(r - 1, kFoldOutTag, buf, bytes);
  else
    ctx.recv(r + 1, kFoldOutTag, buf, bytes);
}

TreeLinks binomial_links(int rank, int root, int n) {
  TreeLinks t;
  const int vr = mod(rank - root, n);
  int limit;
  if (vr == 0) {
    limit = 1 << ceil_log2(n);
  } else {
    limit = vr & -vr;
    t.parent = mod(vr - limit + root, n);
  }
  for (int mask = limit >> 1; mask >= 1; mask >>= 1)
    if (vr + mask < n) t.children.push_back(mod(vr + mask + root, n));
  return t;
}

TreeLinks chain_links(int rank, int root, int n) {
  TreeLinks t;
  const int vr = mod(rank - root, n);
  if (vr > 0) t.parent = mod(rank - 1, n);
  if (vr + 1 < n) t.children.push_back(mod(rank + 1, n));
  return t;
}

TreeLinks star_links(int rank, int root, int n) {
  TreeLinks t;
  if (rank != root) {
    t.parent = root;
    return t;
  }
  for (int k = 1; k < n; ++k) t.children.push_back(mod(root + k, n));
  return t;
}

namespace {
constexpr size_t kWindow = 4;  // chunks in flight per link
}

void reduce_in_order(AlgoContext& ctx, std::span<const int> peers, uint32_t step, void* dst, size_t count,
                     DType dtype, ReduceOp op) {
  if (peers.empty()) return;
  const Request first = ctx.irecv_reduce(peers[0], step, dst, count, dtype, op);
  if (peers.size() == 1) {
    ctx.wait({first});
    return;
  }
  const size_t later = peers.size() - 1, bytes = count * dtype_size(dtype);
  const size_t window = std::clamp<size_t>(kOrderedScratchBytes / std::max<size_t>(bytes, 1), 1, later);
  char* buf = static_cast<char*>(ctx.scratch(window * bytes, kOrderedReduceSlot));
  std::vector<Request> in(window);
  for (size_t i = 0; i < window; ++i) in[i] = ctx.irecv(peers[1 + i], step, buf + i * bytes, bytes);
  ctx.wait({first});
  for (size_t i = 0; i < later; ++i) {
    const size_t s = i % window;
    ctx.wait({in[s]});
    reduce_into(dst, buf + s * bytes, count, dtype, op);
    if (i + window < later) in[s] = ctx.irecv(peers[1 + i + window], step, buf + s * bytes, bytes);
  }
}

void tree_reduce(AlgoContext& ctx, const TreeLinks& t, void* acc, size_t count, DType dtype, ReduceOp op,
                 size_t chunk, uint32_t tag_base) {
  if (count == 0) return;
  const size_t es = dtype_size(dtype);
  const size_t chunks = ceil_div(count, chunk);
  std::vector<Pending> recvs(chunks), sends(chunks);
  // The first child combines into acc on arrival; the others land in scratch, one piece per later child
  // for each chunk in flight (fewer chunks in flight when that would pass kOrderedScratchBytes), and are
  // combined in the order of t.children once the chunk's receives are all done.
  const size_t later = t.children.empty() ? 0 : t.children.size() - 1;
  size_t window = kWindow;
  char* pieces = nullptr;
  if (later > 0) {
    window = std::clamp<size_t>(kOrderedScratchBytes / (later * chunk * es), 1, kWindow);
    pieces = static_cast<char*>(ctx.scratch(window * later * chunk * es, kOrderedReduceSlot));
  }
  auto piece = [&](size_t c, size_t j) { return pieces + ((c % window) * later + (j - 1)) * chunk * es; };
  auto post = [&](size_t c) {
    const size_t len = chunk_len(count, c, chunk);
    const auto tag = tag_base + static_cast<uint32_t>(c);
    for (size_t j = 0; j < t.children.size(); ++j)
      recvs[c].add(j == 0 ? ctx.irecv_reduce(t.children[0], tag, at(acc, c * chunk, es), len, dtype, op)
                          : ctx.irecv(t.children[j], tag, piece(c, j), len * es));
  };
  for (size_t c = 0; c < std::min(window, chunks); ++c) post(c);
  for (size_t c = 0; c < chunks; ++c) {
    recvs[c].wait(ctx);
    for (size_t j = 1; j < t.children.size(); ++j)
      reduce_into(at(acc, c * chunk, es), piece(c, j), chunk_len(count, c, chunk), dtype, op);
    if (c + window < chunks) post(c + window);
    if (t.parent >= 0) {
      sends[c].add(ctx.isend(t.parent, tag_base + static_cast<uint32_t>(c), at(acc, c * chunk, es),
                             chunk_len(count, c, chunk) * es));
      if (c >= kWindow) sends[c - kWindow].wait(ctx);
    }
  }
  for (auto& s : sends) s.wait(ctx);
}

void tree_bcast(AlgoContext& ctx, const TreeLinks& t, void* buf, size_t count, size_t es, size_t chunk,
                uint32_t tag_base) {
  if (count == 0) return;
  const size_t chunks = ceil_div(count, chunk);
  std::vector<Pending> recvs(chunks), sends(chunks);
  auto post = [&](size_t c) {
    if (t.parent >= 0)
      recvs[c].add(ctx.irecv(t.parent, tag_base + static_cast<uint32_t>(c), at(buf, c * chunk, es),
                             chunk_len(count, c, chunk) * es));
  };
  for (size_t c = 0; c < std::min(kWindow, chunks); ++c) post(c);
  for (size_t c = 0; c < chunks; ++c) {
    recvs[c].wait(ctx);
    if (c + kWindow < chunks) post(c + kWindow);
    for (int child : t.children)
      sends[c].add(ctx.isend(child, tag_base + static_cast<uint32_t>(c), at(buf, c * chunk, es),
                             chunk_len(count, c, chunk) * es));
    if (c >= kWindow) sends[c - kWindow].wait(ctx);
  }
  for (auto& s : sends) s.wait(ctx);
}

}  // namespace trident::algo
