#include "trident/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/core/error.h"
#include "trident/plan/step_model.h"

namespace trident::plan {
namespace {

constexpr double kGB = 1e9;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string join(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, ",")); }

// Parameters held by pipeline stage `stage` (before TP sharding).
double stage_params(const ModelSpec& m, int pp, int stage) {
  const int lps = m.layers / pp;
  double p = lps * m.params_per_layer();
  const double final_norm = m.gated_mlp ? m.hidden : 2.0 * m.hidden;
  if (stage == 0) p += m.embedding_params();
  if (stage == pp - 1) {
    p += final_norm + m.head_params();
    if (pp > 1 && m.tied_embeddings) p += double(m.vocab) * m.hidden;  // a copy of the tied embedding
  }
  return p;
}

}  // namespace

LinkSpec ClusterSpec::inter_per_rank() const {
  LinkSpec l = nic;
  l.bandwidth_Bps = nic.bandwidth_Bps * nics_per_node / std::max(1, gpus_per_node);
  return l;
}

ClusterSpec make_cluster(const HardwareCatalog& cat, const std::string& gpu, int gpus, int gpus_per_node,
                         const std::string& node, const std::string& intra_link, const std::string& inter_link,
                         Precision precision) {
  ClusterSpec c;
  c.device = gpu;
  bool is_host = false;
  for (auto& h : cat.hosts())
    if (h.name == gpu) is_host = true;
  if (gpus <= 0) TRIDENT_THROW(InvalidArgument, "--gpus must be >= 1 (got {})", gpus);
  c.gpus = gpus;
  if (is_host) {
    HostSpec h = gpu == "this-machine" ? this_machine(cat) : cat.host(gpu);
    const int ranks_per_host = gpus_per_node > 0 ? gpus_per_node : std::min(gpus, std::max(1, h.cpu_cores));
    c.gpus_per_node = ranks_per_host;
    c.nics_per_node = 1;
    // Each rank runs single-threaded GEMMs; ranks beyond the core count share cores.
    const double share = std::min(1.0, double(h.cpu_cores) / ranks_per_host);
    c.peak_flops = (h.sgemm_flops_avx512 > 0 ? h.sgemm_flops_avx512 : h.sgemm_flops_avx2) * share;
    c.matmul_efficiency = 1.0;  // the catalog holds measured (achievable) rates
    c.attention_fwd_efficiency = c.attention_bwd_efficiency = 1.0;
    c.device_memory_bytes = h.memory_bytes / ranks_per_host;
    c.hbm_Bps = h.memcpy_Bps_per_core * share;
    c.intra = cat.link(intra_link.empty() ? h.intra_link : intra_link).spec;
    c.nic = cat.link(inter_link.empty() ? "tcp-loopback" : inter_link).spec;
    return c;
  }
  const GpuSpec& g = cat.gpu(gpu);
  std::string node_name = node;
  if (node_name.empty()) node_name = g.name.rfind("a100", 0) == 0 ? "dgx-a100" : "dgx-h100";
  const NodeSpec& n = cat.node(node_name);
  c.gpus_per_node = gpus_per_node > 0 ? gpus_per_node : n.gpus_per_node;
  c.nics_per_node = gpus_per_node > 0 ? std::max(1, n.nics_per_node * gpus_per_node / n.gpus_per_node) : n.nics_per_node;
  c.device_memory_bytes = g.memory_bytes;
  c.peak_flops = precision == Precision::kMixed ? g.peak_bf16_flops : g.peak_tf32_flops;
  c.matmul_efficiency = g.matmul_efficiency;
  // The catalog's attention figures are the bf16 tensor-core kernels'; float32 attention is charged at the
  // GEMMs' rate.
  const bool mixed = precision == Precision::kMixed;
  c.attention_fwd_efficiency = mixed ? g.attention_fwd_efficiency : g.matmul_efficiency;
  c.attention_bwd_efficiency = mixed ? g.attention_bwd_efficiency : g.matmul_efficiency;
  c.hbm_Bps = g.hbm_Bps;
  c.elementwise_Bps = g.hbm_Bps * g.elementwise_efficiency;
  c.intra = cat.link(intra_link.empty() ? g.intra_link : intra_link).spec;
  c.nic = cat.link(inter_link.empty() ? n.nic_link : inter_link).spec;
  return c;
}

ComputeTime compute_time(const TrainSpec& t, const ClusterSpec& c, const Layout& l, int layers, bool head) {
  const ModelSpec& m = t.model;
  const double tok = double(l.micro_batch) * m.seq;
  const double mm = c.peak_flops * c.matmul_efficiency;
  // Forward seconds of the layers and of the head: GEMMs, attention, elementwise traffic.
  const double g_layers = 2.0 * m.params_per_layer() * layers * tok / l.tp / mm;
  const double g_head = head ? 2.0 * m.vocab * double(m.hidden) * tok / l.tp / mm : 0.0;
  const double attn_flops = 4.0 * m.hidden * double(m.seq) * tok * layers / l.tp;
  const double a_f = attn_flops / (c.peak_flops * c.attention_fwd_efficiency);
  const double a_b = 2 * attn_flops / (c.peak_flops * c.attention_bwd_efficiency);
  TokenTraffic lt, ht;
  if (c.elementwise_Bps > 0) {
    const double a = t.activation_bytes > 0 ? t.activation_bytes : (t.precision == Precision::kMixed ? 2.0 : 4.0);
    lt = layer_traffic_per_token(m, l.tp, a, t.operand_copy_bytes);
    if (head) ht = head_traffic_per_token(m, l.tp, a, t.operand_copy_bytes);
  }
  const double bw = c.elementwise_Bps > 0 ? c.elementwise_Bps : 1.0;
  const double e_lf = lt.forward * layers * tok / bw, e_lb = lt.backward * layers * tok / bw;
  const double e_hf = ht.forward * tok / bw, e_hb = ht.backward * tok / bw;
  ComputeTime r;
  r.forward_s = g_layers + g_head + a_f + e_lf + e_hf;
  r.backward_s = 2 * (g_layers + g_head) + a_b + e_lb + e_hb;
  if (l.recompute == Recompute::kFull) r.backward_s += g_layers + a_f + e_lf;  // the layers' forward again
  if (l.recompute == Recompute::kSelective) r.backward_s += a_f;               // the attention core again
  r.gemm_s = 3 * (g_layers + g_head);
  r.attention_s = a_f + a_b;
  r.elementwise_s = e_lf + e_lb + e_hf + e_hb;
  return r;
}

std::string Layout::str() const {
  std::string s = fmt::format("tp{} pp{} dp{} zero{} mb{}x{} {}", tp, pp, dp, zero, micro_batch, microbatches,
                              to_string(recompute));
  if (pp > 1) s += fmt::format(" {}", to_string(schedule));
  if (schedule == Schedule::kInterleaved) s += fmt::format(" v{}", interleave);
  if (offload) s += " offload";
  return s;
}

double tp_traffic_bytes(const ModelSpec& m, int batch, int bytes_per_element) {
  return 4.0 * m.layers * double(batch) * m.seq * m.hidden * bytes_per_element;
}

void validate_layout(const TrainSpec& t, const ClusterSpec& c, const Layout& l) {
  const ModelSpec& m = t.model;
  if (l.tp < 1 || m.heads % l.tp != 0 || m.kv() % l.tp != 0) {
    std::vector<int> ok;
    for (int d : divisors(std::gcd(m.heads, m.kv()))) ok.push_back(d);
    TRIDENT_THROW(InvalidArgument, "--tp {}: tensor parallelism must divide the {} attention heads{}; allowed: {}", l.tp,
                  m.heads, m.kv() != m.heads ? fmt::format(" and {} KV heads", m.kv()) : "", join(ok));
  }
  if (l.pp < 1 || m.layers % l.pp != 0)
    TRIDENT_THROW(InvalidArgument, "--pp {}: pipeline stages must divide the {} layers; allowed: {}", l.pp, m.layers,
                  join(divisors(m.layers)));
  if (l.dp < 1) TRIDENT_THROW(InvalidArgument, "--dp {}: must be >= 1", l.dp);
  if (l.tp * l.pp * l.dp != c.gpus)
    TRIDENT_THROW(InvalidArgument, "--tp {} x --pp {} x --dp {} = {} but --gpus is {}; the product must equal the GPU count",
                  l.tp, l.pp, l.dp, l.tp * l.pp * l.dp, c.gpus);
  if (l.zero < 0 || l.zero > 3) TRIDENT_THROW(InvalidArgument, "--zero {}: allowed 0, 1, 2, 3", l.zero);
  if (l.micro_batch < 1) TRIDENT_THROW(InvalidArgument, "--micro-batch {}: must be >= 1", l.micro_batch);
  if (l.microbatches < 1) TRIDENT_THROW(InvalidArgument, "--microbatches {}: must be >= 1", l.microbatches);
  if (l.dp * l.micro_batch * l.microbatches != t.global_batch)
    TRIDENT_THROW(InvalidArgument,
                  "--global-batch {} must equal --dp {} x --micro-batch {} x --microbatches {} (= {}); "
                  "for this layout use --microbatches {}",
                  t.global_batch, l.dp, l.micro_batch, l.microbatches, l.dp * l.micro_batch * l.microbatches,
                  t.global_batch % (l.dp * l.micro_batch) == 0 ? std::to_string(t.global_batch / (l.dp * l.micro_batch))
                                                                : std::string("(none: the global batch is not divisible by dp x micro-batch)"));
  if (l.schedule == Schedule::kInterleaved) {
    if (l.interleave < 1 || m.layers % (l.pp * l.interleave) != 0)
      TRIDENT_THROW(InvalidArgument, "--interleave {}: pp x interleave must divide the {} layers", l.interleave, m.layers);
    if (l.microbatches % l.pp != 0)
      TRIDENT_THROW(InvalidArgument, "--microbatches {}: the interleaved schedule needs a multiple of --pp {}",
                    l.microbatches, l.pp);
  }
}

Evaluation evaluate(const TrainSpec& t, const ClusterSpec& c, const Layout& l) {
  validate_layout(t, c, l);
  const ModelSpec& m = t.model;
  Evaluation e;
  e.layout = l;
  const bool mixed = t.precision == Precision::kMixed;
  const double wb = mixed ? 2 : 4;  // bytes per working param / grad / activation element
  const int lps = m.layers / l.pp;
  const double tok = double(l.micro_batch) * m.seq;
  const int v = l.schedule == Schedule::kInterleaved ? std::max(1, l.interleave) : 1;
  const int mbs = l.microbatches;

  // ---- memory: first and last stage ----
  ActivationConfig ac{l.micro_batch, l.tp, t.sequence_parallel, l.recompute, t.precision};
  const double act_layer = activation_bytes_per_layer(m, ac);
  const double logits = 4.0 * tok * m.vocab / l.tp;
  auto stage_memory = [&](int stage) {
    MemoryBreakdown b = model_state_bytes(stage_params(m, l.pp, stage) / l.tp, l.dp, l.zero, t.precision, l.offload);
    const double inflight = stage == 0 ? inflight_microbatches(l.schedule, l.pp, mbs, v) : 1.0;
    b.activations = act_layer * lps * inflight + (stage == l.pp - 1 ? logits : 0.0);
    if (l.zero == 3) b.buffers = 2 * m.params_per_layer() / l.tp * wb;
    return b;
  };
  MemoryBreakdown first = stage_memory(0), last = stage_memory(l.pp - 1);
  e.memory = first.total() >= last.total() ? first : last;
  e.fits = e.memory.total() <= c.usable_memory();

  // ---- compute per microbatch on the last (heaviest) stage ----
  const ComputeTime ct = compute_time(t, c, l, lps, true);
  const double t_f = ct.forward_s, t_b = ct.backward_s;

  const LinkSpec inter = c.inter_per_rank();
  // A group of ranks that share a host `g` at a time: the device link inside, their part of the NICs across.
  auto links = [&](int g) {
    LinkSpec share = inter;
    share.bandwidth_Bps *= g;
    return GroupLinks{link_cost(c.intra, c.hbm_Bps), link_cost(share, c.hbm_Bps)};
  };

  // ---- TP: 2 all-reduces forward + 2 backward per layer (+2 recomputed forward with full recompute) ----
  double t_tp = 0;
  if (l.tp > 1) {
    const double bytes = tok * m.hidden * wb;
    const int n = lps * (4 + (l.recompute == Recompute::kFull ? 2 : 0));
    const OpKind op = OpKind::kAllReduce;
    const int g = std::min(l.tp, c.gpus_per_node);
    const CommEstimate one = estimate_collective(op, bytes, l.tp, g, links(g));
    t_tp = n * one.seconds;
    CommItem ci{"tp_all_reduce", l.tp <= c.gpus_per_node ? c.intra.name : c.nic.name, algo_name(one.algo),
                n * mbs * bus_bytes(op, bytes, l.tp), t_tp * mbs, t_tp * mbs};
    e.comm.push_back(ci);
    if (l.tp > c.gpus_per_node) e.warnings.push_back("TP crosses nodes: its all-reduces run over the NICs");
  }
  // ---- PP: one activation forward and one gradient backward per microbatch per stage boundary ----
  double t_p2p = 0;
  if (l.pp > 1) {
    const double bytes = tok * m.hidden * wb / l.tp;  // Megatron's scatter/gather optimisation
    const bool intra = l.tp * l.dp < c.gpus_per_node;
    const LinkSpec& link = intra ? c.intra : inter;
    t_p2p = 2 * (link.latency_s + bytes / link.bandwidth_Bps);
    e.comm.push_back({"pp_send_recv", link.name, "direct", 2.0 * bytes * mbs * v, t_p2p * mbs * v, t_p2p * mbs * v});
  }
  const double t_micro = t_f + t_b + t_tp + t_p2p;
  const double pipeline = (mbs + double(l.pp - 1) / v) * t_micro;
  e.bubble_s = double(l.pp - 1) / v * t_micro;
  e.bubble_fraction = bubble_fraction(l.pp, mbs, v);
  e.compute_s = mbs * (t_f + t_b);

  // ---- DP / ZeRO over the data-parallel group (stride tp, so g = gpus_per_node / tp share a node) ----
  double dp_exposed = 0;
  const double psi_rank = stage_params(m, l.pp, l.pp - 1) / l.tp;
  if (l.dp > 1) {
    const int g = std::max(1, std::min(l.dp, c.gpus_per_node / l.tp));
    const std::string link = g >= l.dp ? c.intra.name : c.nic.name;
    const double grad_bytes = psi_rank * wb;
    auto cost = [&](OpKind op, double bytes) { return estimate_collective(op, bytes, l.dp, g, links(g)).seconds; };
    auto algo = [&](OpKind op, double bytes) {
      return std::string(algo_name(estimate_collective(op, bytes, l.dp, g, links(g)).algo));
    };
    // Gradient buckets (25 MB) are reduced while backward runs; the last bucket cannot be hidden.
    const double last_bucket = std::min(1.0, 25e6 / grad_bytes);
    auto overlapped = [&](double t) { return exposed_after_overlap(t, t_b, last_bucket); };
    if (l.zero == 0) {
      const double t = cost(OpKind::kAllReduce, grad_bytes);
      dp_exposed = overlapped(t);
      e.comm.push_back({"dp_all_reduce", link, algo(OpKind::kAllReduce, grad_bytes),
                        bus_bytes(OpKind::kAllReduce, grad_bytes, l.dp), t, dp_exposed});
    } else if (l.zero <= 2) {
      const double trs = cost(OpKind::kReduceScatter, grad_bytes);
      const double tag = cost(OpKind::kAllGather, psi_rank * wb);
      dp_exposed = overlapped(trs) + tag;
      e.comm.push_back({"zero_reduce_scatter", link, algo(OpKind::kReduceScatter, grad_bytes),
                        bus_bytes(OpKind::kReduceScatter, grad_bytes, l.dp), trs, overlapped(trs)});
      e.comm.push_back({"zero_all_gather", link, algo(OpKind::kAllGather, psi_rank * wb),
                        bus_bytes(OpKind::kAllGather, psi_rank * wb, l.dp), tag, tag});
    } else {
      // ZeRO-3: every microbatch gathers the parameters for forward and again for backward, and
      // reduce-scatters the gradients; prefetch hides them behind compute when compute is longer.
      const double tag = cost(OpKind::kAllGather, psi_rank * wb);
      const double trs = cost(OpKind::kReduceScatter, grad_bytes);
      const double exposed_micro = std::max(0.0, tag - t_f) + std::max(0.0, tag + trs - t_b);
      dp_exposed = mbs * exposed_micro;
      e.comm.push_back({"zero3_all_gather", link, algo(OpKind::kAllGather, psi_rank * wb),
                        2.0 * mbs * bus_bytes(OpKind::kAllGather, psi_rank * wb, l.dp), 2 * mbs * tag,
                        mbs * (std::max(0.0, tag - t_f) + std::max(0.0, tag - t_b))});
      e.comm.push_back({"zero3_reduce_scatter", link, algo(OpKind::kReduceScatter, grad_bytes),
                        mbs * bus_bytes(OpKind::kReduceScatter, grad_bytes, l.dp), mbs * trs,
                        dp_exposed - mbs * (std::max(0.0, tag - t_f) + std::max(0.0, tag - t_b))});
    }
  }
  // ---- optimizer: memory bound, read + write of the rank's states ----
  MemoryBreakdown st = model_state_bytes(psi_rank, l.dp, l.zero, t.precision, l.offload);
  double t_opt = 2 * (st.params + st.grads + st.optimizer + st.master) / c.hbm_Bps;
  if (l.offload) {
    // The rank's shard of gradients goes to the host (and float32 parameters, their own master), the
    // updated parameters come back over the host link; the CPU reads and writes the shard's moments,
    // master, gradients and parameters in host memory. Not overlapped with the backward (docs/PLANNER.md).
    const double shard = l.zero >= 1 ? psi_rank / l.dp : psi_rank;
    const double link = shard * (mixed ? 2 + 2 : 4 + 4 + 4);
    const double host = 2 * (st.host_total() + shard * (mixed ? 2 + 2 : 4 + 4));
    t_opt = link / c.host_link_Bps + host / c.host_memory_Bps;
  }

  e.step_time_s = pipeline + dp_exposed + t_opt;
  const double tokens = double(t.global_batch) * m.seq;
  e.model_flops_per_iter = model_flops_per_iteration(m, tokens);
  e.hardware_flops_per_iter = hardware_flops_per_iteration(m, tokens, l.recompute);
  e.tokens_per_s = tokens / e.step_time_s;
  e.tflops_per_gpu = e.model_flops_per_iter / e.step_time_s / c.gpus / 1e12;
  e.mfu = e.model_flops_per_iter / (e.step_time_s * c.gpus * c.peak_flops);
  if (!e.fits)
    e.warnings.push_back(fmt::format("needs {:.1f} GB per GPU, {:.1f} GB usable", e.memory.total() / kGB,
                                     c.usable_memory() / kGB));
  if (l.offload)
    e.warnings.push_back(fmt::format("optimizer offload: {:.1f} GB per GPU in host memory, {:.1f} ms of copies and "
                                     "CPU AdamW per step", e.memory.host_total() / kGB, 1e3 * t_opt));
  if (l.pp > 1 && lps < 4) e.warnings.push_back(fmt::format("only {} layers per stage (< 4)", lps));
  if (e.bubble_fraction >= 0.10)
    e.warnings.push_back(fmt::format("bubble {:.1f}% >= 10%: raise --microbatches or use the interleaved schedule",
                                     100 * e.bubble_fraction));
  return e;
}

nlohmann::json Evaluation::to_json() const {
  nlohmann::json j;
  j["layout"] = {{"tp", layout.tp},
                 {"pp", layout.pp},
                 {"dp", layout.dp},
                 {"zero", layout.zero},
                 {"micro_batch", layout.micro_batch},
                 {"microbatches", layout.microbatches},
                 {"recompute", to_string(layout.recompute)},
                 {"schedule", to_string(layout.schedule)},
                 {"interleave", layout.interleave}};
  j["layout"]["offload"] = layout.offload;
  j["memory_per_gpu_bytes"] = memory.total();
  j["host_memory_per_gpu_bytes"] = memory.host_total();
  j["memory"] = {{"params", memory.params},           {"grads", memory.grads},
                 {"optimizer", memory.optimizer},     {"master", memory.master},
                 {"activations", memory.activations}, {"buffers", memory.buffers}};
  j["host_memory"] = {{"optimizer", memory.host_optimizer}, {"master", memory.host_master}};
  j["fits"] = fits;
  j["model_flops_per_iter"] = model_flops_per_iter;
  j["hardware_flops_per_iter"] = hardware_flops_per_iter;
  j["step_time_s"] = step_time_s;
  j["tokens_per_s"] = tokens_per_s;
  j["tflops_per_gpu"] = tflops_per_gpu;
  j["mfu"] = mfu;
  j["bubble_fraction"] = bubble_fraction;
  j["bubble_s"] = bubble_s;
  j["compute_s"] = compute_s;
  j["comm"] = nlohmann::json::array();
  for (auto& c : comm)
    j["comm"].push_back({{"kind", c.kind},
                         {"link", c.link},
                         {"algorithm", c.algorithm},
                         {"bytes_per_gpu", c.bytes_per_gpu},
                         {"time_s", c.time_s},
                         {"exposed_s", c.exposed_s}});
  j["warnings"] = warnings;
  return j;
}

std::string MemoryCheck::str() const {
  std::string s = fmt::format(
      "device memory per GPU: {:.1f} GB ({:.0f} bytes) needed, {:.1f} GB ({:.0f} bytes) usable of {:.1f} GB: parameters "
      "{:.1f} GB, gradients {:.1f} GB, optimizer state {:.1f} GB, master weights {:.1f} GB, activations {:.1f} GB, "
      "buffers {:.1f} GB",
      needed_bytes / kGB, needed_bytes, usable_bytes / kGB, usable_bytes, device_bytes / kGB, memory.params / kGB,
      memory.grads / kGB, memory.optimizer / kGB, memory.master / kGB, memory.activations / kGB, memory.buffers / kGB);
  if (host_bytes > 0) s += fmt::format("; host memory per GPU (offloaded optimizer): {:.1f} GB", host_bytes / kGB);
  if (!fits && !advice.empty()) s += "; " + advice;
  return s;
}

MemoryCheck check_memory(const TrainSpec& t, const ClusterSpec& c, const Layout& l) {
  const Evaluation e = evaluate(t, c, l);
  MemoryCheck r;
  r.memory = e.memory;
  r.needed_bytes = e.memory.total();
  r.host_bytes = e.memory.host_total();
  r.usable_bytes = c.usable_memory();
  r.device_bytes = c.device_memory_bytes;
  r.fits = e.fits;
  if (r.fits) return r;
  // Each change alone, with what it would need; evaluate() is the one arithmetic.
  std::vector<std::string> options;
  auto option = [&](const std::string& flags, Layout changed) {
    const double need = evaluate(t, c, changed).memory.total();
    options.push_back(fmt::format("{} ({:.1f} GB{})", flags, need / kGB, need <= r.usable_bytes ? ", fits" : ""));
  };
  if (!l.offload) {
    Layout x = l;
    x.offload = true;
    option("--offload optimizer (the optimizer state to host memory)", x);
  }
  if (l.dp > 1 && l.zero < 3) {
    Layout x = l;
    x.zero = 3;
    option("--parallel zero3", x);
  }
  if (l.micro_batch > 1) {
    Layout x = l;
    x.micro_batch = l.micro_batch / 2;
    x.microbatches = l.microbatches * 2;
    if (x.micro_batch * 2 == l.micro_batch)
      option(fmt::format("--batch_size {} --gradient_accumulation_steps {}", x.micro_batch, x.microbatches), x);
  }
  if (l.recompute != Recompute::kFull) {
    Layout x = l;
    x.recompute = Recompute::kFull;
    option("--activation_checkpointing", x);
  }
  if (l.dp == 1 && l.zero < 3) options.push_back("more ranks with --parallel zero3 (each holds 1/N of the state)");
  r.advice = fmt::format("use {}", fmt::join(options, ", or "));
  return r;
}

std::vector<Evaluation> enumerate_layouts(const TrainSpec& t, const ClusterSpec& c, int micro_batch) {
  std::vector<Evaluation> out;
  const ModelSpec& m = t.model;
  for (int tp : divisors(std::gcd(m.heads, m.kv()))) {
    if (tp > c.gpus_per_node || c.gpus % tp != 0) continue;
    for (int pp : divisors(m.layers)) {
      if (c.gpus % (tp * pp) != 0) continue;
      const int dp = c.gpus / (tp * pp);
      if (t.global_batch % (dp * micro_batch) != 0) continue;
      const int mbs = t.global_batch / (dp * micro_batch);
      for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
        for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          Layout l;
          l.tp = tp, l.pp = pp, l.dp = dp, l.zero = zero, l.micro_batch = micro_batch, l.microbatches = mbs;
          l.recompute = r;
          out.push_back(evaluate(t, c, l));
        }
      }
    }
  }
  return out;
}

Recommendation recommend(const TrainSpec& t, const ClusterSpec& c, const std::vector<Evaluation>& all) {
  Recommendation rec;
  const ModelSpec& m = t.model;
  auto pick = [&](const std::function<bool(const Evaluation&)>& pred) -> const Evaluation* {
    const Evaluation* best = nullptr;
    for (auto& e : all) {
      if (!e.fits || !pred(e)) continue;
      if (e.layout.pp > 1 && m.layers / e.layout.pp < 4) continue;
      if (!best || e.step_time_s < best->step_time_s) best = &e;
    }
    return best;
  };
  for (auto& e : all)
    if (e.fits && (!rec.fastest.step_time_s || e.step_time_s < rec.fastest.step_time_s)) rec.fastest = e;

  // The model-parallel ladder: TP grows first inside the NVLink domain, then PP (>= 4 layers per stage).
  std::vector<std::pair<int, int>> ladder;
  std::vector<int> tps;
  for (int tp : divisors(std::gcd(m.heads, m.kv())))
    if (tp <= c.gpus_per_node && c.gpus % tp == 0) tps.push_back(tp);
  for (int tp : tps) ladder.push_back({tp, 1});
  for (int pp : divisors(m.layers))
    if (pp > 1 && m.layers / pp >= 4) ladder.push_back({tps.back(), pp});

  auto light = [](const Evaluation& e) { return e.layout.recompute != Recompute::kFull; };
  const Evaluation* chosen = nullptr;
  std::string why;
  // 1. Pure data parallelism when the whole model state fits (ZeRO-0).
  chosen = pick([&](const Evaluation& e) { return e.layout.tp == 1 && e.layout.pp == 1 && e.layout.zero == 0; });
  if (chosen) why = "the full model state (16 bytes/param) and activations fit on one GPU: pure data parallelism";
  // 2. ZeRO-1/2 when only the optimizer state does not fit.
  if (!chosen) {
    for (int z : {1, 2}) {  // the lowest stage that fits
      if (!chosen)
        chosen = pick([&](const Evaluation& e) { return e.layout.tp == 1 && e.layout.pp == 1 && e.layout.zero == z; });
    }
    if (chosen) why = fmt::format("the optimizer state does not fit unsharded: ZeRO-{} shards it over DP {}", chosen->layout.zero, chosen->layout.dp);
  }
  // 3-5. Walk the model-parallel ladder: first without recompute-all or ZeRO, then allowing full
  // recompute, then ZeRO-1/2 on top of TP x PP.
  const std::vector<std::pair<std::string, std::function<bool(const Evaluation&)>>> passes = {
      {"", [&](const Evaluation& e) { return e.layout.zero == 0 && light(e); }},
      {"full recomputation was needed to fit", [&](const Evaluation& e) { return e.layout.zero == 0; }},
      {"the optimizer state still does not fit with model parallelism, so ZeRO-1 shards it",
       [&](const Evaluation& e) { return e.layout.zero <= 1; }},
      {"the optimizer state and gradients still do not fit with model parallelism, so ZeRO-2 shards them",
       [&](const Evaluation& e) { return e.layout.zero <= 2; }},
      {"nothing else fits: ZeRO-3 shards the parameters too", [&](const Evaluation&) { return true; }},
  };
  for (auto& [note, pred] : passes) {
    if (chosen) break;
    for (auto [tp, pp] : ladder) {
      chosen = pick([&](const Evaluation& e) { return e.layout.tp == tp && e.layout.pp == pp && pred(e); });
      if (chosen) {
        why = fmt::format("the model state does not fit on one GPU: the smallest model-parallel layout on the ladder "
                          "(TP first within the {}-GPU NVLink domain, then PP) that fits is TP {} x PP {}",
                          c.gpus_per_node, tp, pp);
        if (!note.empty()) why += "; " + note;
        break;
      }
    }
  }
  if (!chosen) {
    rec.reasons.push_back("no layout fits in memory: add GPUs, use a GPU with more memory, or a smaller micro-batch");
    return rec;
  }
  rec.found = true;
  rec.best = *chosen;
  const Layout& l = chosen->layout;
  const double psi = m.total_params();
  rec.reasons.push_back(fmt::format("model: {:.2f} B parameters; unsharded mixed-precision Adam state 16 B/param = {:.0f} GB; "
                                    "{:.1f} GB usable per GPU ({:.0f}% headroom)",
                                    psi / 1e9, 16 * psi / kGB, c.usable_memory() / kGB, 100 * c.memory_headroom));
  rec.reasons.push_back(why);
  if (l.tp > 1)
    rec.reasons.push_back(fmt::format("TP {} stays inside the NVLink domain ({} GPUs/node), so its per-layer all-reduces run on {}",
                                      l.tp, c.gpus_per_node, c.intra.name));
  if (l.pp > 1)
    rec.reasons.push_back(fmt::format("PP {}: {} layers per stage (>= 4); {} microbatches give a {:.1f}% bubble{}", l.pp,
                                      m.layers / l.pp, l.microbatches, 100 * chosen->bubble_fraction,
                                      chosen->bubble_fraction < 0.10 ? " (< 10%)" : " (>= 10%: raise the global batch or interleave)"));
  rec.reasons.push_back(fmt::format("DP {} = the remaining GPUs; {}; recompute {}; {:.1f} GB per GPU", l.dp,
                                    l.zero == 0 ? "no ZeRO (the optimizer state fits)" : fmt::format("ZeRO-{}", l.zero),
                                    to_string(l.recompute), chosen->memory.total() / kGB));
  if (rec.fastest.step_time_s > 0 && rec.fastest.step_time_s < 0.95 * chosen->step_time_s)
    rec.reasons.push_back(fmt::format("note: the model predicts {} is {:.0f}% faster ({:.3f} s vs {:.3f} s) but it leaves the "
                                      "framework (e.g. ZeRO traffic across nodes, or deeper pipelines); weigh that against "
                                      "the model's uncertainty",
                                      rec.fastest.layout.str(), 100 * (1 - rec.fastest.step_time_s / chosen->step_time_s),
                                      rec.fastest.step_time_s, chosen->step_time_s));
  return rec;
}

}  // namespace trident::plan
