#include "trident/plan/simulator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <queue>
#include <array>
#include <map>
#include <set>

#include <fmt/format.h>

#include "trident/core/error.h"
#include "trident/parallel/schedule.h"

namespace trident::plan {
namespace {

enum class Kind { kCompute, kColl, kP2P };
enum class Label { kFwd, kBwd, kTp, kDpAllReduce, kReduceScatter, kAllGather, kOptimizer, kSendAct, kSendGrad };

const char* label_name(Label l) {
  switch (l) {
    case Label::kFwd: return "forward";
    case Label::kBwd: return "backward";
    case Label::kTp: return "tp_all_reduce";
    case Label::kDpAllReduce: return "dp_all_reduce";
    case Label::kReduceScatter: return "reduce_scatter";
    case Label::kAllGather: return "all_gather";
    case Label::kOptimizer: return "optimizer";
    case Label::kSendAct: return "send_activation";
    case Label::kSendGrad: return "send_grad";
  }
  return "?";
}

struct Task {
  Kind kind = Kind::kCompute;
  Label label = Label::kFwd;
  int rank = 0;     // simulated rank (sender for p2p)
  int stream = 0;   // 0 compute, 1 comm, -1 none (p2p)
  int mb = -1, chunk = 0;
  double duration = 0;  // compute
  int coll = -1;        // collective id
  int dst = -1;         // p2p receiver
  double bytes = 0, latency = 0;
  int links[2] = {-1, -1};  // p2p links
  int deps = 0;
  std::vector<int> succ;
  double start = -1, end = -1;
};

struct Coll {
  std::vector<int> tasks;
  int arrived = 0;
  double latency = 0, volume = 0;
  std::vector<int> links;
};

struct Flow {
  std::vector<int> links;
  double remaining = 0, rate = 0, last = 0;
  int version = 0;
  int owner = -1;  // collective id, or -(task id) - 1 for p2p
  bool done = false;
};

struct Link {
  double bw = 0;
  std::vector<int> flows;
};

struct Event {
  double t;
  int type;  // 0 compute done (id task), 1 coll latency done (id coll), 2 flow done (id flow), 3 p2p latency (task)
  int id;
  int version;
  bool operator>(const Event& o) const { return t > o.t || (t == o.t && id > o.id); }
};

struct Stream {
  std::vector<int> tasks;
  size_t head = 0;
  bool busy = false;
};

class Engine {
 public:
  std::vector<Task> tasks;
  std::vector<Coll> colls;
  std::vector<Flow> flows;
  std::vector<Link> links;
  std::vector<std::array<Stream, 2>> streams;
  long events = 0;

  // Stream tasks are queued at creation unless `enqueue` is false (collective joins are queued by their
  // rank's own generator, so each stream keeps its rank's program order).
  int add_task(Task t, bool enqueue = true) {
    tasks.push_back(std::move(t));
    int id = int(tasks.size()) - 1;
    if (enqueue) this->enqueue(id);
    return id;
  }
  void enqueue(int id) {
    const Task& x = tasks[id];
    if (x.stream >= 0) streams[x.rank][x.stream].tasks.push_back(id);
  }
  void dep(int before, int after) {
    if (before < 0 || after < 0) return;
    tasks[before].succ.push_back(after);
    tasks[after].deps++;
  }

  void run() {
    for (size_t r = 0; r < streams.size(); ++r)
      for (int s = 0; s < 2; ++s) try_stream(int(r), s);
    for (size_t i = 0; i < tasks.size(); ++i)
      if (tasks[i].kind == Kind::kP2P && tasks[i].deps == 0 && tasks[i].start < 0) start(int(i));
    while (!q_.empty()) {
      Event e = q_.top();
      q_.pop();
      now_ = e.t;
      ++events;
      if (e.type == 0) {
        finish(e.id);
      } else if (e.type == 1) {
        Coll& c = colls[e.id];
        start_flow(c.links, c.volume, e.id);
      } else if (e.type == 3) {
        Task& t = tasks[e.id];
        start_flow({t.links[0], t.links[1]}, t.bytes, -e.id - 1);
      } else {
        Flow& f = flows[e.id];
        if (f.done || f.version != e.version) continue;
        end_flow(e.id);
      }
    }
    for (size_t i = 0; i < tasks.size(); ++i)
      if (tasks[i].end < 0)
        TRIDENT_THROW(Error, "simulator: task {} ({} of rank {}) never ran: the schedule has a dependency cycle", i,
                      label_name(tasks[i].label), tasks[i].rank);
  }

 private:
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> q_;
  double now_ = 0;

  void try_stream(int r, int s) {
    Stream& st = streams[r][s];
    if (st.busy || st.head >= st.tasks.size()) return;
    int id = st.tasks[st.head];
    if (tasks[id].deps > 0 || tasks[id].start >= 0) return;
    st.busy = true;
    start(id);
  }

  void start(int id) {
    Task& t = tasks[id];
    t.start = now_;
    if (t.kind == Kind::kCompute) {
      q_.push({now_ + t.duration, 0, id, 0});
    } else if (t.kind == Kind::kColl) {
      Coll& c = colls[t.coll];
      if (++c.arrived == int(c.tasks.size())) {
        if (c.volume <= 0 && c.latency <= 0) {
          complete_coll(t.coll);
        } else {
          q_.push({now_ + c.latency, 1, t.coll, 0});
        }
      }
    } else {
      q_.push({now_ + t.latency, 3, id, 0});
    }
  }

  void finish(int id) {
    Task& t = tasks[id];
    t.end = now_;
    if (t.stream >= 0) {
      Stream& st = streams[t.rank][t.stream];
      st.busy = false;
      st.head++;
    }
    for (int s : t.succ) {
      Task& n = tasks[s];
      if (--n.deps == 0) {
        if (n.stream >= 0)
          try_stream(n.rank, n.stream);
        else
          start(s);
      }
    }
    if (t.stream >= 0) try_stream(t.rank, t.stream);
  }

  void complete_coll(int c) {
    for (int id : colls[c].tasks) finish(id);
  }

  void advance(Flow& f) {
    f.remaining -= f.rate * (now_ - f.last);
    f.last = now_;
  }
  void reschedule(int fid) {
    Flow& f = flows[fid];
    double rate = 1e300;
    for (int l : f.links) rate = std::min(rate, links[l].bw / double(links[l].flows.size()));
    f.rate = rate;
    f.version++;
    q_.push({now_ + std::max(0.0, f.remaining) / rate, 2, fid, f.version});
  }
  void start_flow(std::vector<int> ls, double volume, int owner) {
    ls.erase(std::remove(ls.begin(), ls.end(), -1), ls.end());
    std::sort(ls.begin(), ls.end());
    ls.erase(std::unique(ls.begin(), ls.end()), ls.end());
    if (volume <= 0 || ls.empty()) {
      finish_owner(owner);
      return;
    }
    int fid = int(flows.size());
    flows.push_back(Flow{ls, volume, 0, now_, 0, owner, false});
    std::vector<int> affected;
    for (int l : ls) {
      for (int g : links[l].flows) advance(flows[g]), affected.push_back(g);
      links[l].flows.push_back(fid);
    }
    affected.push_back(fid);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (int g : affected) reschedule(g);
  }
  void end_flow(int fid) {
    Flow& f = flows[fid];
    f.done = true;
    std::vector<int> affected;
    for (int l : f.links) {
      auto& v = links[l].flows;
      v.erase(std::remove(v.begin(), v.end(), fid), v.end());
      for (int g : v) advance(flows[g]), affected.push_back(g);
    }
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (int g : affected) reschedule(g);
    finish_owner(f.owner);
  }
  void finish_owner(int owner) {
    if (owner >= 0)
      complete_coll(owner);
    else
      finish(-owner - 1);
  }
};

using Action = PipelineAction;
}  // namespace

std::vector<PipelineAction> pipeline_schedule(Schedule s, int pp, int stage, int m, int v) {
  std::vector<PipelineAction> a;
  if (pp == 1) {  // one stage: every forward, then every backward (no pipeline runs at pp = 1)
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < m; ++i) a.push_back({true, i, c});
    for (int c = v - 1; c >= 0; --c)
      for (int i = 0; i < m; ++i) a.push_back({false, i, c});
    return a;
  }
  // The schedules the pipeline engine runs (parallel/schedule.h), so the simulator plays the same order.
  const parallel::ScheduleKind kind = s == Schedule::kGPipe  ? parallel::ScheduleKind::kGPipe
                                      : s == Schedule::k1F1B ? parallel::ScheduleKind::k1F1B
                                                             : parallel::ScheduleKind::kInterleaved;
  const parallel::Schedule sched = parallel::make_schedule(kind, pp, m, kind == parallel::ScheduleKind::kInterleaved ? v : 1);
  for (const parallel::Action& x : sched.at(static_cast<size_t>(stage)))
    a.push_back({x.type == parallel::Action::kForward, x.mb, x.chunk});
  return a;
}

namespace {

double stage_param_count(const ModelSpec& m, int pp, int stage) {
  double p = double(m.layers / pp) * m.params_per_layer();
  if (stage == 0) p += m.embedding_params();
  if (stage == pp - 1) p += m.head_params() + (pp > 1 && m.tied_embeddings ? double(m.vocab) * m.hidden : 0.0);
  return p;
}

}  // namespace

Straggler parse_straggler(const std::string& s, const std::string& flag) {
  Straggler x;
  char extra;
  if (std::sscanf(s.c_str(), "rank:%d:%lf%c", &x.rank, &x.factor, &extra) != 2 || x.rank < 0 || x.factor <= 0)
    TRIDENT_THROW(InvalidArgument, "{} '{}': expected rank:R:FACTOR with R >= 0 and FACTOR > 0 (e.g. rank:3:1.5 = 1.5x slower)",
                  flag, s);
  return x;
}

DegradedLink parse_degraded(const std::string& s, const std::string& flag) {
  DegradedLink x;
  char extra;
  if (std::sscanf(s.c_str(), "node:%d:%lf%c", &x.node, &x.factor, &extra) != 2 || x.node < 0 || x.factor <= 0 ||
      x.factor > 1)
    TRIDENT_THROW(InvalidArgument,
                  "{} '{}': expected node:N:FACTOR with N >= 0 and 0 < FACTOR <= 1 (e.g. node:3:0.5 = half bandwidth)",
                  flag, s);
  return x;
}

nlohmann::json SimResult::to_json() const {
  return {{"step_time_s", step_time_s},       {"tokens_per_s", tokens_per_s},
          {"mfu", mfu},                       {"tflops_per_gpu", tflops_per_gpu},
          {"simulated_ranks", simulated_ranks}, {"used_symmetry", used_symmetry},
          {"events", events},                 {"compute_busy_s", compute_busy_s},
          {"comm_busy_s", comm_busy_s},       {"slowest_rank", slowest_rank}};
}

namespace {

// Refuses options the simulation cannot run, naming the flag.
void validate_sim_options(const SimOptions& opt) {
  const ClusterSpec& c = opt.cluster;
  validate_layout(opt.train, c, opt.layout);
  if (opt.steps < 1) TRIDENT_THROW(InvalidArgument, "--steps {}: must be >= 1", opt.steps);
  for (auto& s : opt.stragglers)
    if (s.rank >= c.gpus)
      TRIDENT_THROW(InvalidArgument, "--straggler rank:{}: the cluster has ranks 0..{}", s.rank, c.gpus - 1);
  for (auto& d : opt.degraded)
    if (d.node >= c.nodes())
      TRIDENT_THROW(InvalidArgument, "--degrade-link node:{}: the cluster has nodes 0..{}", d.node, c.nodes() - 1);
}

// The task graph of the simulated steps: which ranks are simulated (one per stage when every rank of a stage
// behaves alike, else all), their links, and per step the compute, tensor-parallel, data-parallel and
// pipeline tasks with their dependencies. simulate() builds it step by step, runs its Engine and reads the
// result back; the phases are the methods below, in that order.
class StepGraph {
 public:
  explicit StepGraph(const SimOptions& opt)
      : opt(opt), t(opt.train), c(opt.cluster), l(opt.layout), m(t.model), tp(l.tp), pp(l.pp), dp(l.dp),
        gpn(c.gpus_per_node), v(l.schedule == Schedule::kInterleaved ? std::max(1, l.interleave) : 1),
        m_mb(l.microbatches), wb(t.precision == Precision::kMixed ? 2 : 4), tok(double(l.micro_batch) * m.seq),
        inter(c.inter_per_rank()),
        sym(opt.exploit_symmetry && opt.stragglers.empty() && opt.degraded.empty()), nsim(sym ? pp : c.gpus) {
    setup_links();
    precompute_action_costs();
    fwd_last.assign(nsim, std::vector<int>(size_t(v) * m_mb, -1));
    bwd_last = fwd_first = bwd_first = fwd_last;
    prev_step_end.assign(nsim, -1);
  }

  int real_rank(int tpi, int dpi, int stage) const { return tpi + tp * (dpi + dp * stage); }
  // sim index -> (tp index, dp index, stage)
  void coords(int s, int* tpi, int* dpi, int* stage) const {
    if (sym) {
      *tpi = 0, *dpi = 0, *stage = s;
    } else {
      *tpi = s % tp, *dpi = (s / tp) % dp, *stage = s / (tp * dp);
    }
  }
  int sim_of(int tpi, int dpi, int stage) const { return sym ? stage : real_rank(tpi, dpi, stage); }
  int simulated_ranks() const { return nsim; }

  // Phase 1 of a step: clears the per-step bookkeeping.
  void begin_step() {
    for (auto* t2 : {&fwd_last, &bwd_last, &fwd_first, &bwd_first})
      for (auto& v2 : *t2) std::fill(v2.begin(), v2.end(), -1);
  }
  // Phase 2: compute + TP + DP tasks of sim rank s, in stream order, then its optimizer.
  void add_rank_step(int s, int step);
  // Phase 3: pipeline point-to-point transfers between consecutive virtual stages.
  void add_pipeline_transfers();
  // After Engine::run: the step time, throughput, MFU and the busiest rank.
  SimResult summarize() const;
  // Chrome trace of a sample of the simulated ranks.
  void write_trace(const SimResult& r) const;

  Engine E;

 private:
  void setup_links();
  void precompute_action_costs();
  // A collective over real ranks `members`: one Coll, one join task per SIMULATED member.
  void make_coll(const std::vector<int>& real_members, OpKind op, double bytes, double scale, Algo algo,
                 Label label, int stream, int mb, int chunk, std::vector<int>* out_tasks);
  // Collectives are created once per group, when its first simulated member is generated; the other
  // members find their join task by key.
  int group_coll(int kind, const std::vector<int>& members, int key_a, int key_b, int sim_rank, OpKind op,
                 double bytes, double scale, Algo algo, Label label, int stream, int mb, int chunk, int step);
  std::vector<int> tp_group(int dpi, int st) const {
    std::vector<int> g;
    for (int i = 0; i < tp; ++i) g.push_back(real_rank(i, dpi, st));
    return g;
  }
  std::vector<int> dp_group(int tpi, int st) const {
    std::vector<int> g;
    for (int i = 0; i < dp; ++i) g.push_back(real_rank(tpi, i, st));
    return g;
  }
  // Gradient / parameter sizes per chunk on each stage.
  double chunk_params(int st) const { return stage_param_count(m, pp, st) / tp / v; }
  int idx(int chunk, int mb) const { return chunk * m_mb + mb; }

  const SimOptions& opt;
  const TrainSpec& t;
  const ClusterSpec& c;
  const Layout& l;
  const ModelSpec& m;
  const int tp, pp, dp, gpn, v, m_mb;
  const double wb, tok;
  const LinkSpec inter;
  const bool sym;
  const int nsim;
  std::vector<double> slow;
  // Precomputed per-action costs.
  int lpc = 0;
  ComputeTime chunk_time, last_chunk_time;  // a virtual stage's layers; the last one's with the LM head
  double tp_bytes = 0, p2p_bytes = 0;
  int n_tp_f = 0, n_tp_b = 0;
  // fwd_last[s][idx(chunk, mb)] etc.: the first / last task of that action on sim rank s in this step.
  std::vector<std::vector<int>> fwd_last, bwd_last, fwd_first, bwd_first;
  std::vector<int> prev_step_end;
  std::map<std::tuple<int, int, int, int, int, int>, std::vector<int>> coll_cache;
};

void StepGraph::setup_links() {
  E.streams.resize(nsim);
  E.links.resize(size_t(nsim) * 4);  // nvl out, nvl in, nic out, nic in
  slow.assign(nsim, 1.0);
  for (int s = 0; s < nsim; ++s) {
    int tpi, dpi, st;
    coords(s, &tpi, &dpi, &st);
    const int node = real_rank(tpi, dpi, st) / gpn;
    double f = 1;
    for (auto& d : opt.degraded)
      if (d.node == node) f *= d.factor;
    E.links[s * 4 + 0].bw = E.links[s * 4 + 1].bw = c.intra.bandwidth_Bps;
    E.links[s * 4 + 2].bw = E.links[s * 4 + 3].bw = inter.bandwidth_Bps * f;
    for (auto& x : opt.stragglers)
      if (!sym && x.rank == real_rank(tpi, dpi, st)) slow[s] *= x.factor;
  }
}

void StepGraph::precompute_action_costs() {
  lpc = m.layers / (pp * v);
  chunk_time = compute_time(t, c, l, lpc, false);
  last_chunk_time = compute_time(t, c, l, lpc, true);
  tp_bytes = tok * m.hidden * wb;
  p2p_bytes = tok * m.hidden * wb / tp;
  n_tp_f = 2 * lpc;
  n_tp_b = 2 * lpc + (l.recompute == Recompute::kFull ? 2 * lpc : 0);
}

void StepGraph::make_coll(const std::vector<int>& real_members, OpKind op, double bytes, double scale,
                          Algo algo, Label label, int stream, int mb, int chunk, std::vector<int>* out_tasks) {
  const int world = int(real_members.size());
  std::set<int> nodes;
  for (int r : real_members) nodes.insert(r / gpn);
  const bool intra = nodes.size() == 1;
  const int g = std::max(1, world / int(nodes.size()));
  const int per_host = intra ? world : g;
  LinkSpec share = inter;  // this group's part of its hosts' NICs
  share.bandwidth_Bps *= per_host;
  const CommEstimate cost =
      estimate_collective(op, bytes, world, per_host, {link_cost(c.intra, c.hbm_Bps), link_cost(share, c.hbm_Bps)}, algo);
  Coll col;
  col.latency = cost.alpha_s * scale;
  // Bytes on each member's own link (device link or NIC share) that take the model's transfer time alone;
  // the engine stretches them when several collectives share the link.
  col.volume = cost.transfer_s * (intra ? c.intra.bandwidth_Bps : inter.bandwidth_Bps) * scale;
  const int cid = int(E.colls.size());
  for (int r : real_members) {
    const int tpi = r % tp, dpi = (r / tp) % dp, st = r / (tp * dp);
    if (sym && (tpi != 0 || dpi != 0)) continue;
    const int s = sim_of(tpi, dpi, st);
    col.links.push_back(s * 4 + (intra ? 0 : 2));
    col.links.push_back(s * 4 + (intra ? 1 : 3));
    Task tk;
    tk.kind = Kind::kColl, tk.label = label, tk.rank = s, tk.stream = stream, tk.coll = cid, tk.mb = mb, tk.chunk = chunk;
    tk.bytes = bytes;
    int id = E.add_task(tk, false);
    col.tasks.push_back(id);
    out_tasks->push_back(id);
  }
  E.colls.push_back(std::move(col));
}

int StepGraph::group_coll(int kind, const std::vector<int>& members, int key_a, int key_b, int sim_rank,
                          OpKind op, double bytes, double scale, Algo algo, Label label, int stream, int mb,
                          int chunk, int step) {
  auto key = std::make_tuple(kind, members.front(), key_a, key_b, step, stream);
  auto it = coll_cache.find(key);
  if (it == coll_cache.end()) {
    std::vector<int> ids;
    make_coll(members, op, bytes, scale, algo, label, stream, mb, chunk, &ids);
    it = coll_cache.emplace(key, std::move(ids)).first;
  }
  for (int id : it->second)
    if (E.tasks[id].rank == sim_rank) {
      E.enqueue(id);
      return id;
    }
  TRIDENT_THROW(Error, "simulator: rank {} is not a member of its own group", sim_rank);
}

void StepGraph::add_rank_step(int s, int step) {
  int tpi, dpi, st;
  coords(s, &tpi, &dpi, &st);
  auto actions = pipeline_schedule(l.schedule, pp, st, m_mb, v);
  std::vector<int> last_micro_of_chunk(v, -1);
  int last_comm = -1;
  std::vector<int> compute_ids;  // per action: last compute-stream task
  std::vector<int> zero3_tasks;  // per action: its parameter all-gather
  const double grad_chunk = chunk_params(st) * wb;
  const int nb = l.zero <= 2 && dp > 1 ? std::clamp(int(std::ceil(grad_chunk / opt.bucket_bytes)), 1, 16) : 1;
  int ai = 0;
  for (const Action& a : actions) {
    const int vs = a.chunk * pp + st;
    const bool last_vs = vs == pp * v - 1;
    const ComputeTime& ct = last_vs ? last_chunk_time : chunk_time;
    const double dur = (a.fwd ? ct.forward_s : ct.backward_s) * slow[s];
    const bool bucketed = !a.fwd && a.mb == m_mb - 1 && dp > 1 && l.zero <= 2;
    const int pieces = bucketed ? nb : 1;
    // ZeRO-3: gather this action's parameters (queued one action ahead: prefetch depth one, the
    // gather for action i+1 may start once action i-1 finished).
    auto zero3_ag = [&](int i) {
      const Action& b = actions[i];
      int id = group_coll(10 + (b.fwd ? 0 : 1), dp_group(tpi, st), b.chunk, b.mb, s, OpKind::kAllGather,
                          chunk_params(st) * wb, 1.0, opt.algorithm, Label::kAllGather, 1, b.mb, b.chunk, step);
      if (i >= 2) E.dep(compute_ids[i - 2], id);
      if (step > 0 && i == 0) E.dep(prev_step_end[s], id);
      return id;
    };
    int zero3_task = -1;
    if (l.zero == 3 && dp > 1) {
      if (ai == 0) zero3_tasks.push_back(zero3_ag(0));
      zero3_task = zero3_tasks[ai];
      if (ai + 1 < int(actions.size())) zero3_tasks.push_back(zero3_ag(ai + 1));
    }
    int first_id = -1, last_id = -1;
    for (int p = 0; p < pieces; ++p) {
      Task ct;
      ct.kind = Kind::kCompute, ct.label = a.fwd ? Label::kFwd : Label::kBwd, ct.rank = s, ct.stream = 0;
      ct.mb = a.mb, ct.chunk = a.chunk, ct.duration = dur / pieces;
      int cid = E.add_task(ct);
      if (first_id < 0) first_id = cid;
      if (zero3_task >= 0 && p == 0) E.dep(zero3_task, cid);
      last_id = cid;
      if (tp > 1) {
        const int n = a.fwd ? n_tp_f : n_tp_b;
        // n all-reduces aggregated: n x alpha, n x volume; keyed by (dp index, stage, action, piece).
        int tid = group_coll(a.fwd ? 1 : 2, tp_group(dpi, st), a.chunk * 1000003 + a.mb, p, s,
                             OpKind::kAllReduce, tp_bytes, double(n) / pieces, Algo::kAuto, Label::kTp, 0,
                             a.mb, a.chunk, step);
        E.dep(cid, tid);
        last_id = tid;
      }
      if (bucketed) {
        const OpKind op = l.zero == 0 ? OpKind::kAllReduce : OpKind::kReduceScatter;
        int did = group_coll(3, dp_group(tpi, st), a.chunk, p, s, op, grad_chunk / pieces, 1.0, opt.algorithm,
                             l.zero == 0 ? Label::kDpAllReduce : Label::kReduceScatter, 1, a.mb, a.chunk, step);
        E.dep(last_id, did);
        last_comm = did;
      }
    }
    if (l.zero == 3 && dp > 1 && !a.fwd) {
      int rid = group_coll(12, dp_group(tpi, st), a.chunk, a.mb, s, OpKind::kReduceScatter, grad_chunk, 1.0,
                           opt.algorithm, Label::kReduceScatter, 1, a.mb, a.chunk, step);
      E.dep(last_id, rid);
      last_comm = rid;
    }
    if (step > 0 && ai == 0) E.dep(prev_step_end[s], first_id);
    compute_ids.push_back(last_id);
    (a.fwd ? fwd_first : bwd_first)[s][idx(a.chunk, a.mb)] = first_id;
    (a.fwd ? fwd_last : bwd_last)[s][idx(a.chunk, a.mb)] = last_id;
    ++ai;
  }
  // Optimizer after the last gradient collective; ZeRO-1/2 then all-gather the updated parameters.
  Task ot;
  ot.kind = Kind::kCompute, ot.label = Label::kOptimizer, ot.rank = s, ot.stream = 0;
  MemoryBreakdown stt = model_state_bytes(stage_param_count(m, pp, st) / tp, dp, l.zero, t.precision);
  ot.duration = 2 * (stt.params + stt.grads + stt.optimizer + stt.master) / c.hbm_Bps * slow[s];
  int oid = E.add_task(ot);
  E.dep(last_comm, oid);
  int end = oid;
  if ((l.zero == 1 || l.zero == 2) && dp > 1) {
    int gid = group_coll(4, dp_group(tpi, st), 0, 0, s, OpKind::kAllGather, chunk_params(st) * v * wb, 1.0,
                         opt.algorithm, Label::kAllGather, 1, -1, 0, step);
    E.dep(oid, gid);
    end = gid;
  }
  prev_step_end[s] = end;
}

void StepGraph::add_pipeline_transfers() {
  if (pp > 1) {
    for (int s = 0; s < nsim; ++s) {
      int tpi, dpi, st;
      coords(s, &tpi, &dpi, &st);
      for (int chunk = 0; chunk < v; ++chunk) {
        const int vs = chunk * pp + st;
        for (int mb = 0; mb < m_mb; ++mb) {
          auto link_between = [&](int from_stage, int to_stage, int* out, int* in, double* lat) {
            const int ra = real_rank(tpi, dpi, from_stage), rb = real_rank(tpi, dpi, to_stage);
            const bool same = ra / gpn == rb / gpn;
            const int sa = sim_of(tpi, dpi, from_stage), sb = sim_of(tpi, dpi, to_stage);
            *out = sa * 4 + (same ? 0 : 2);
            *in = sb * 4 + (same ? 1 : 3);
            *lat = same ? c.intra.latency_s : inter.latency_s;
          };
          // One transfer of this microbatch's activation (or gradient) to virtual stage `to_vs`: after the
          // sender's action, before the receiver's.
          auto transfer = [&](Label label, int to_vs, const std::vector<std::vector<int>>& sender_last,
                              const std::vector<std::vector<int>>& receiver_first) {
            const int to_st = to_vs % pp, to_chunk = to_vs / pp;
            Task pt;
            pt.kind = Kind::kP2P, pt.label = label, pt.rank = s, pt.stream = -1, pt.mb = mb, pt.chunk = chunk;
            pt.bytes = p2p_bytes;
            link_between(st, to_st, &pt.links[0], &pt.links[1], &pt.latency);
            pt.dst = sim_of(tpi, dpi, to_st);
            int id = E.add_task(pt);
            E.dep(sender_last[s][idx(chunk, mb)], id);
            E.dep(id, receiver_first[pt.dst][idx(to_chunk, mb)]);
          };
          if (vs < pp * v - 1) transfer(Label::kSendAct, vs + 1, fwd_last, fwd_first);  // activation forward
          if (vs > 0) transfer(Label::kSendGrad, vs - 1, bwd_last, bwd_first);          // gradient backward
        }
      }
    }
  }
}

SimResult StepGraph::summarize() const {
  SimResult r;
  double makespan = 0;
  for (auto& tk : E.tasks)
    if (tk.end > makespan) makespan = tk.end, r.slowest_rank = tk.rank;
  r.step_time_s = makespan / opt.steps;
  const double tokens = double(t.global_batch) * m.seq;
  r.tokens_per_s = tokens / r.step_time_s;
  const double mf = model_flops_per_iteration(m, tokens);
  r.mfu = mf / (r.step_time_s * c.gpus * c.peak_flops);
  r.tflops_per_gpu = mf / r.step_time_s / c.gpus / 1e12;
  r.simulated_ranks = nsim;
  r.used_symmetry = sym;
  r.events = E.events;
  std::vector<double> comp(nsim, 0), comm(nsim, 0);
  for (auto& tk : E.tasks) {
    if (tk.stream == 0 && tk.kind == Kind::kCompute) comp[tk.rank] += tk.end - tk.start;
    if (tk.stream == 1) comm[tk.rank] += tk.end - tk.start;
  }
  int busiest = int(std::max_element(comp.begin(), comp.end()) - comp.begin());
  r.compute_busy_s = comp[busiest] / opt.steps;
  r.comm_busy_s = comm[busiest] / opt.steps;
  {
    int tpi, dpi, st;
    coords(r.slowest_rank, &tpi, &dpi, &st);
    r.slowest_rank = real_rank(tpi, dpi, st);
  }
  return r;
}

void StepGraph::write_trace(const SimResult& r) const {
  // Sample ranks: all when few, else evenly spaced plus stragglers and ranks of degraded nodes.
  std::set<int> traced;
  if (nsim <= opt.trace_max_ranks) {
    for (int s = 0; s < nsim; ++s) traced.insert(s);
  } else {
    for (auto& x : opt.stragglers) traced.insert(x.rank);
    for (auto& d : opt.degraded) traced.insert(std::min(nsim - 1, d.node * gpn));
    const int want = std::max(1, opt.trace_max_ranks - int(traced.size()));
    for (int i = 0; i < want; ++i) traced.insert(int(int64_t(i) * nsim / want));
  }
  nlohmann::json ev = nlohmann::json::array();
  for (int s : traced) {
    int tpi, dpi, st;
    coords(s, &tpi, &dpi, &st);
    const int rr = real_rank(tpi, dpi, st);
    std::string pname = sym ? fmt::format("stage {} (represents {} ranks)", st, tp * dp)
                            : fmt::format("rank {} (tp {}, dp {}, stage {})", rr, tpi, dpi, st);
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rr}, {"args", {{"name", pname}}}});
    ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rr}, {"args", {{"sort_index", rr}}}});
    const char* tnames[3] = {"compute", "comm", "p2p"};
    for (int k = 0; k < 3; ++k)
      ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rr}, {"tid", k}, {"args", {{"name", tnames[k]}}}});
  }
  for (auto& tk : E.tasks) {
    if (!traced.count(tk.rank)) continue;
    int tpi, dpi, st;
    coords(tk.rank, &tpi, &dpi, &st);
    std::string name = label_name(tk.label);
    if (tk.mb >= 0) name += fmt::format(" mb{}", tk.mb);
    if (v > 1) name += fmt::format(" c{}", tk.chunk);
    nlohmann::json args = {{"mb", tk.mb}, {"chunk", tk.chunk}};
    if (tk.bytes > 0) args["bytes"] = tk.bytes;
    ev.push_back({{"ph", "X"},
                  {"name", name},
                  {"pid", real_rank(tpi, dpi, st)},
                  {"tid", tk.stream < 0 ? 2 : tk.stream},
                  {"ts", tk.start * 1e6},
                  {"dur", (tk.end - tk.start) * 1e6},
                  {"args", args}});
  }
  nlohmann::json doc = {{"traceEvents", ev}, {"displayTimeUnit", "ms"},
                        {"otherData", {{"layout", l.str()}, {"step_time_s", r.step_time_s}}}};
  // The trace's folder is created as a run's output folder is (`--trace out/simulate.json` on a fresh clone).
  const std::filesystem::path parent = std::filesystem::path(opt.trace_path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) TRIDENT_THROW(IoError, "--trace: cannot create the folder '{}': {}", parent.string(), ec.message());
  std::ofstream out(opt.trace_path);
  if (!out)
    TRIDENT_THROW(IoError, "--trace: cannot write '{}': {}; give a writable path", opt.trace_path,
                  detail::errno_string(errno));
  out << doc.dump();
  if (!out) TRIDENT_THROW(IoError, "--trace: write to '{}' failed", opt.trace_path);
}

}  // namespace

SimResult simulate(const SimOptions& opt) {
  validate_sim_options(opt);
  StepGraph g(opt);
  for (int step = 0; step < opt.steps; ++step) {
    g.begin_step();
    for (int s = 0; s < g.simulated_ranks(); ++s) g.add_rank_step(s, step);
    g.add_pipeline_transfers();
  }
  g.E.run();
  SimResult r = g.summarize();
  if (!opt.trace_path.empty()) g.write_trace(r);
  return r;
}

std::vector<ScalingPoint> scaling_sweep(const SimOptions& base, const std::vector<int>& gpu_counts, bool strong) {
  std::vector<ScalingPoint> out;
  const Layout& bl = base.layout;
  const int per_dp_batch = base.train.global_batch / bl.dp;  // weak scaling keeps this
  for (int n : gpu_counts) {
    if (n % (bl.tp * bl.pp) != 0) continue;
    SimOptions o = base;
    o.trace_path.clear();
    o.cluster.gpus = n;
    Layout& l = o.layout;
    l.dp = n / (bl.tp * bl.pp);
    if (strong) {
      if (base.train.global_batch % l.dp != 0) continue;
      const int per = base.train.global_batch / l.dp;
      if (bl.pp == 1) {
        l.micro_batch = per, l.microbatches = 1;
      } else {
        if (per % bl.micro_batch != 0) continue;
        l.micro_batch = bl.micro_batch, l.microbatches = per / bl.micro_batch;
        if (l.schedule == Schedule::kInterleaved && l.microbatches % l.pp != 0) continue;
      }
    } else {
      o.train.global_batch = per_dp_batch * l.dp;
    }
    // Drop faults that fall outside a smaller cluster.
    std::erase_if(o.stragglers, [&](const Straggler& s) { return s.rank >= n; });
    std::erase_if(o.degraded, [&](const DegradedLink& d) { return d.node >= o.cluster.nodes(); });
    ScalingPoint p;
    p.gpus = n;
    p.layout = l;
    p.result = simulate(o);
    out.push_back(p);
  }
  if (!out.empty()) {
    const double t0 = out.front().result.tokens_per_s;
    const int n0 = out.front().gpus;
    for (auto& p : out) p.efficiency = p.result.tokens_per_s / (t0 * double(p.gpus) / n0);
  }
  return out;
}

}  // namespace trident::plan
