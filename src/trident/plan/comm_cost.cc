#include "trident/plan/comm_cost.h"

#include <cmath>
#include <limits>

namespace trident::plan {

LinkCost link_cost(const LinkSpec& link, double local_Bps) {
  LinkCost c;
  c.alpha_s = link.latency_s;
  c.beta_s_per_byte = link.bandwidth_Bps > 0 ? 1.0 / link.bandwidth_Bps : std::numeric_limits<double>::infinity();
  c.gamma_s_per_byte = local_Bps > 0 ? 1.0 / local_Bps : 0.0;
  return c;
}

CommEstimate estimate_collective(OpKind op, double bytes, int world, int per_host, const GroupLinks& links,
                                 Algo forced) {
  CommEstimate best;
  if (world <= 1) return best;
  const HostLayout layout = HostLayout::blocks(world, per_host);
  const size_t b = bytes > 0 ? static_cast<size_t>(std::llround(bytes)) : 0;
  // time is linear in the link terms: the latency part is the same call on links without bandwidth terms.
  const LinkCost intra_alpha{links.intra.alpha_s, 0, 0}, inter_alpha{links.inter.alpha_s, 0, 0};
  auto evaluate = [&](const AlgoCost& c) {
    CommEstimate e;
    e.algo = c.algo;
    e.seconds = predict_seconds(c, b, layout, links.intra, links.inter);
    e.alpha_s = predict_seconds(c, b, layout, intra_alpha, inter_alpha);
    e.transfer_s = e.seconds - e.alpha_s;
    return e;
  };
  auto runs = [&](const AlgoCost& c) {
    if (c.op != op || c.algo == Algo::kShm || c.algo == Algo::kCma) return false;
    return !c.pow2_only || cost::is_pow2(world);
  };
  bool found = false;
  if (forced != Algo::kAuto) {
    const AlgoCost* c = find_cost(op, forced);
    if (c && runs(*c)) {
      CommEstimate e = evaluate(*c);
      if (std::isfinite(e.seconds)) return e;
    }
  }
  for (const AlgoCost& c : cost_table()) {
    if (!runs(c)) continue;
    CommEstimate e = evaluate(c);
    if (!std::isfinite(e.seconds)) continue;
    if (!found || e.seconds < best.seconds) best = e, found = true;
  }
  return best;
}

}  // namespace trident::plan
