#include "trident/comm/algorithms/algorithms.h"
#include "trident/comm/algorithms/common.h"

namespace trident {

// The mirror of gather tree: each rank receives its subtree's blocks (relative order) from its parent,
// forwards each child's subtree, and keeps the first block.
void ScatterTree::run(AlgoContext& ctx, const CollArgs& a) {
  const int n = ctx.size(), r = ctx.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  if (n == 1 || a.count == 0) {
    if (r == a.root) algo::copy_bytes(a.recv, algo::at(a.send, r * a.count, es), bytes);
    return;
  }
  const algo::TreeLinks t = algo::binomial_links(r, a.root, n);
  auto rel = [&](int rank) { return algo::mod(rank - a.root, n); };
  auto subtree = [&](int v) { return v == 0 ? n : std::min(v & -v, n - v); };
  const int v = rel(r);
  if (t.children.empty()) {
    ctx.recv(t.parent, 0, a.recv, bytes);
    return;
  }
  const char* buf;
  if (r == a.root) {
    if (a.root == 0) {
      buf = static_cast<const char*>(a.send);
    } else {  // rotate rank order into relative order
      char* rot = static_cast<char*>(ctx.scratch(n * bytes));
      algo::copy_bytes(rot, algo::at(a.send, a.root * a.count, es), (n - a.root) * bytes);
      algo::copy_bytes(rot + static_cast<size_t>(n - a.root) * bytes, a.send, a.root * bytes);
      buf = rot;
    }
  } else {
    char* mine = static_cast<char*>(ctx.scratch(subtree(v) * bytes));
    ctx.recv(t.parent, 0, mine, subtree(v) * bytes);
    buf = mine;
  }
  algo::Pending children;
  for (int c : t.children)
    children.add(ctx.isend(c, 0, buf + static_cast<size_t>(rel(c) - v) * bytes, subtree(rel(c)) * bytes));
  algo::copy_bytes(a.recv, buf, bytes);
  children.wait(ctx);
}

}  // namespace trident
