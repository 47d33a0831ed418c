#include "trident/parallel/schedule.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "trident/core/error.h"

namespace trident::parallel {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved" || name == "interleaved-1f1b") return ScheduleKind::kInterleaved;
  TRIDENT_THROW(InvalidArgument, "unknown pipeline schedule '{}': use one of gpipe, 1f1b, interleaved", name);
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return fmt::format("{}(c{},mb{})", a.type == Action::kForward ? "F" : "B", a.chunk, a.mb);
}

void validate_schedule_args(ScheduleKind kind, int P, int m, int v) {
  TRIDENT_CHECK(P >= 1, InvalidArgument, "pipeline: {} pipeline stages; need at least 1 (--pp)", P);
  TRIDENT_CHECK(m >= 1, InvalidArgument, "pipeline: {} microbatches; need at least 1 (--microbatches)", m);
  TRIDENT_CHECK(v >= 1, InvalidArgument, "pipeline: {} virtual stages per rank; need at least 1 (--virtual-stages)", v);
  if (kind != ScheduleKind::kInterleaved && v != 1)
    TRIDENT_THROW(InvalidArgument,
                  "pipeline: schedule {} runs one model chunk per rank, but {} virtual stages were asked for; use "
                  "--schedule interleaved for v > 1, or --virtual-stages 1",
                  schedule_name(kind), v);
  if (kind == ScheduleKind::kInterleaved && m % P != 0) {
    int lo = std::max(P, m / P * P), hi = (m / P + 1) * P;
    TRIDENT_THROW(InvalidArgument,
                  "pipeline: the interleaved schedule needs the number of microbatches ({}) to be a multiple of the "
                  "pipeline size ({}); use --microbatches {}{}",
                  m, P, lo, lo == hi ? std::string() : fmt::format(" or {}", hi));
  }
}

namespace {

std::vector<Action> gpipe_rank(int m) {
  std::vector<Action> a;
  for (int i = 0; i < m; ++i) a.push_back({Action::kForward, 0, i});
  for (int i = 0; i < m; ++i) a.push_back({Action::kBackward, 0, i});
  return a;
}

// PipeDream-flush / Megatron-LM's forward_backward_pipelining_without_interleaving.
std::vector<Action> one_f_one_b_rank(int P, int p, int m) {
  std::vector<Action> a;
  const int warmup = std::min(P - p - 1, m);
  const int remaining = m - warmup;
  for (int i = 0; i < warmup; ++i) a.push_back({Action::kForward, 0, i});
  for (int i = 0; i < remaining; ++i) {
    a.push_back({Action::kForward, 0, warmup + i});
    a.push_back({Action::kBackward, 0, i});
  }
  for (int i = remaining; i < m; ++i) a.push_back({Action::kBackward, 0, i});
  return a;
}

// Megatron-LM's forward_backward_pipelining_with_interleaving (microbatch groups of P).
std::vector<Action> interleaved_rank(int P, int p, int m, int v) {
  const int total = m * v;
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % (P * v)) / P;
    return forward ? c : v - 1 - c;
  };
  auto mb_of = [&](int k) { return (k / (P * v)) * P + (k % (P * v)) % P; };
  int warmup = m == P ? total : std::min(total, (P - p - 1) * 2 + (v - 1) * P);
  const int remaining = total - warmup;
  std::vector<Action> a;
  for (int k = 0; k < warmup; ++k) a.push_back({Action::kForward, chunk_of(k, true), mb_of(k)});
  for (int k = 0; k < remaining; ++k) {
    int kf = k + warmup;
    a.push_back({Action::kForward, chunk_of(kf, true), mb_of(kf)});
    a.push_back({Action::kBackward, chunk_of(k, false), mb_of(k)});
  }
  for (int k = remaining; k < total; ++k) a.push_back({Action::kBackward, chunk_of(k, false), mb_of(k)});
  return a;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int P, int m, int v) {
  validate_schedule_args(kind, P, m, v);
  Schedule s(P);
  for (int p = 0; p < P; ++p) {
    switch (kind) {
      case ScheduleKind::kGPipe: s[p] = gpipe_rank(m); break;
      case ScheduleKind::k1F1B: s[p] = one_f_one_b_rank(P, p, m); break;
      case ScheduleKind::kInterleaved: s[p] = interleaved_rank(P, p, m, v); break;
    }
  }
  return s;
}

Schedule forward_only(const Schedule& s) {
  Schedule out(s.size());
  for (size_t p = 0; p < s.size(); ++p)
    for (const Action& a : s[p])
      if (a.type == Action::kForward) out[p].push_back(a);
  return out;
}

void check_schedule(const Schedule& s, int P, int m, int v, bool with_backward) {
  TRIDENT_CHECK(static_cast<int>(s.size()) == P, InvalidArgument, "schedule has {} rank lists for {} ranks", s.size(),
                P);
  for (int p = 0; p < P; ++p) {
    std::vector<int> fwd(static_cast<size_t>(m) * v, 0), bwd(static_cast<size_t>(m) * v, 0);
    for (const Action& a : s[p]) {
      TRIDENT_CHECK(a.chunk >= 0 && a.chunk < v && a.mb >= 0 && a.mb < m, InvalidArgument,
                    "rank {}: action {} is outside {} chunks x {} microbatches", p, to_string(a), v, m);
      size_t k = static_cast<size_t>(a.chunk) * m + a.mb;
      if (a.type == Action::kForward) {
        TRIDENT_CHECK(fwd[k]++ == 0, InvalidArgument, "rank {}: {} appears twice", p, to_string(a));
      } else {
        TRIDENT_CHECK(with_backward, InvalidArgument, "rank {}: forward-only schedule has {}", p, to_string(a));
        TRIDENT_CHECK(fwd[k] == 1, InvalidArgument, "rank {}: {} comes before its forward", p, to_string(a));
        TRIDENT_CHECK(bwd[k]++ == 0, InvalidArgument, "rank {}: {} appears twice", p, to_string(a));
      }
    }
    for (int c = 0; c < v; ++c)
      for (int i = 0; i < m; ++i) {
        size_t k = static_cast<size_t>(c) * m + i;
        TRIDENT_CHECK(fwd[k] == 1, InvalidArgument, "rank {}: forward of chunk {} microbatch {} is missing", p, c, i);
        TRIDENT_CHECK(!with_backward || bwd[k] == 1, InvalidArgument,
                      "rank {}: backward of chunk {} microbatch {} is missing", p, c, i);
      }
  }
}

void check_fifo_order(const Schedule& s, int P, int v) {
  const int S = P * v;
  // Messages on link (s -> s+1) for activations, (s+1 -> s) for gradients, keyed by the sending rank and
  // the receiving rank: every pair of ranks (a, b) is checked as one ordered stream per direction and kind
  // (a property of the schedule; the pipeline engine matches by tag and does not rely on it).
  using Key = std::pair<int, int>;  // (from rank, to rank)
  std::map<Key, std::vector<std::pair<int, int>>> sent_act, need_act, sent_grad, need_grad;  // (vstage, mb)
  for (int p = 0; p < P; ++p)
    for (const Action& a : s[p]) {
      const int st = a.chunk * P + p;
      if (a.type == Action::kForward) {
        if (st + 1 < S) sent_act[{p, (st + 1) % P}].push_back({st, a.mb});
        if (st > 0) need_act[{(st - 1) % P, p}].push_back({st - 1, a.mb});
      } else {
        if (st > 0) sent_grad[{p, (st - 1) % P}].push_back({st, a.mb});
        if (st + 1 < S) need_grad[{(st + 1) % P, p}].push_back({st + 1, a.mb});
      }
    }
  if (P == 1) return;  // all hand-offs are local
  auto cmp = [](const auto& sent, const auto& need, const char* what) {
    for (const auto& [k, list] : sent) {
      auto it = need.find(k);
      if (it == need.end() || it->second != list)
        TRIDENT_THROW(InvalidArgument,
                      "schedule: rank {} sends {} to rank {} in a different order than rank {} needs them; the engine "
                      "matches messages in order on each link",
                      k.first, what, k.second, k.second);
    }
  };
  cmp(sent_act, need_act, "activations");
  cmp(sent_grad, need_grad, "gradients");
}

int max_in_flight(const std::vector<Action>& actions) { return max_in_flight(actions, -1); }

int max_in_flight(const std::vector<Action>& actions, int chunk) {
  int cur = 0, peak = 0;
  for (const Action& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    cur += a.type == Action::kForward ? 1 : -1;
    peak = std::max(peak, cur);
  }
  return peak;
}

ReplayResult replay(const Schedule& s, int P, int v, const DurationFn& duration, const LatencyFn& latency) {
  TRIDENT_CHECK(P >= 1 && v >= 1 && static_cast<int>(s.size()) == P, InvalidArgument,
                "replay: {} rank lists for P = {}, v = {}", s.size(), P, v);
  const int S = P * v;
  int m = 0;
  for (const auto& r : s)
    for (const Action& a : r) {
      TRIDENT_CHECK(a.chunk >= 0 && a.chunk < v && a.mb >= 0, InvalidArgument, "replay: bad action {}", to_string(a));
      m = std::max(m, a.mb + 1);
    }
  constexpr double kNone = -1;
  // finish[type][stage*m + mb]
  std::vector<double> done_f(static_cast<size_t>(S) * m, kNone), done_b(static_cast<size_t>(S) * m, kNone);
  auto lat = [&](int from, int to) { return from == to || !latency ? 0.0 : latency(from, to); };

  ReplayResult r;
  r.busy.assign(P, 0);
  r.idle.assign(P, 0);
  r.start.resize(P);
  r.finish.resize(P);
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0);
  size_t total = 0, finished = 0;
  for (int p = 0; p < P; ++p) {
    total += s[p].size();
    r.start[p].assign(s[p].size(), 0);
    r.finish[p].assign(s[p].size(), 0);
  }
  bool progress = true;
  while (finished < total && progress) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      while (next[p] < s[p].size()) {
        const Action& a = s[p][next[p]];
        const int st = a.chunk * P + p;
        double ready = free_at[p];
        bool ok = true;
        auto need = [&](const std::vector<double>& done, int stage) {
          double t = done[static_cast<size_t>(stage) * m + a.mb];
          if (t == kNone) {
            ok = false;
            return;
          }
          ready = std::max(ready, t + lat(stage % P, p));
        };
        if (a.type == Action::kForward) {
          if (st > 0) need(done_f, st - 1);
        } else {
          need(done_f, st);
          if (ok && st + 1 < S) need(done_b, st + 1);
        }
        if (!ok) break;
        double d = duration(p, a);
        TRIDENT_CHECK(d >= 0, InvalidArgument, "replay: negative duration {} for {} on rank {}", d, to_string(a), p);
        auto& done = a.type == Action::kForward ? done_f : done_b;
        double& slot = done[static_cast<size_t>(st) * m + a.mb];
        TRIDENT_CHECK(slot == kNone, InvalidArgument, "replay: rank {} runs {} twice", p, to_string(a));
        r.start[p][next[p]] = ready;
        r.finish[p][next[p]] = ready + d;
        slot = ready + d;
        free_at[p] = ready + d;
        r.busy[p] += d;
        ++next[p];
        ++finished;
        progress = true;
      }
    }
  }
  if (finished < total) {
    std::string stuck;
    for (int p = 0; p < P; ++p)
      if (next[p] < s[p].size())
        stuck += fmt::format("{}rank {} at {}", stuck.empty() ? "" : ", ", p, to_string(s[p][next[p]]));
    TRIDENT_THROW(InvalidArgument,
                  "replay: the schedule deadlocks (or misses an action another rank needs): {} of {} actions ran; "
                  "stuck: {}",
                  finished, total, stuck);
  }
  double t0 = std::numeric_limits<double>::infinity(), t1 = 0;
  for (int p = 0; p < P; ++p)
    for (size_t i = 0; i < s[p].size(); ++i) {
      t0 = std::min(t0, r.start[p][i]);
      t1 = std::max(t1, r.finish[p][i]);
    }
  if (total == 0) t0 = 0;
  r.makespan = t1 - t0;
  double ideal = 0;
  for (int p = 0; p < P; ++p) {
    r.idle[p] = r.makespan - r.busy[p];
    ideal = std::max(ideal, r.busy[p]);
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - ideal / r.makespan : 0;
  r.bubble_ratio = ideal > 0 ? (r.makespan - ideal) / ideal : 0;
  return r;
}

ReplayResult replay(const Schedule& s, int P, int v, const ReplayTimes& times) {
  const size_t S = static_cast<size_t>(P) * v;
  auto pick = [&](const std::vector<double>& t, int stage, const char* what) {
    TRIDENT_CHECK(t.size() == 1 || t.size() == S, InvalidArgument,
                  "replay: {} times has {} entries; give 1 or one per virtual stage ({})", what, t.size(), S);
    return t.size() == 1 ? t[0] : t[stage];
  };
  return replay(
      s, P, v,
      [&](int p, const Action& a) {
        int st = a.chunk * P + p;
        return a.type == Action::kForward ? pick(times.forward, st, "forward") : pick(times.backward, st, "backward");
      },
      [&](int, int) { return times.p2p_latency; });
}

}  // namespace trident::parallel
