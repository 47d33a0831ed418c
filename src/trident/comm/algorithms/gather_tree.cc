#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// Relative rank v = r - root owns the subtree [v, v + size(v)); each rank gathers its subtree's blocks in
// relative order (children's subtrees are contiguous after its own block) and sends them to its parent.
// The root rotates relative order back to rank order (unless root == 0, where they coincide).
void GatherTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  if (n == 1 || a.count == 0) {
    if (r == a.root) algo::copy_bytes(algo::at(a.recv, r * a.count, es), a.send, bytes);
    return;
  }
  const algo::TreeLinks t = algo::binomial_links(r, a.root, n);
  auto rel = [&](int rank) { return algo::mod(rank - a.root, n); };
  auto subtree = [&](int v) { return v == 0 ? n : std::min(v & -v, n - v); };
  const int v = rel(r);
  if (t.children.empty()) {
    ctx.send(t.parent, 0, a.send, bytes);
    return;
  }
  char* buf = (r == a.root && a.root == 0) ? static_cast<char*>(a.recv)
                                            : static_cast<char*>(ctx.scratch(subtree(v) * bytes));
  algo::copy_bytes(buf, a.send, bytes);
  algo::Pending children;
  for (int c : t.children)
    children.add(ctx.irecv(c, 0, buf + static_cast<size_t>(rel(c) - v) * bytes, subtree(rel(c)) * bytes));
  children.wait(ctx);
  if (t.parent >= 0) {
    ctx.send(t.parent, 0, buf, subtree(v) * bytes);
  } else if (a.root != 0) {
    // Relative block j is rank (root + j) % n.
    algo::copy_bytes(algo::at(a.recv, a.root * a.count, es), buf, (n - a.root) * bytes);
    algo::copy_bytes(a.recv, buf + static_cast<size_t>(n - a.root) * bytes, a.root * bytes);
  }
}

}  // namespace trident
