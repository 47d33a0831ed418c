#include "trident/train/health.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/comm/process_group.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {

namespace {

// The lower median (of an even count, the smaller middle value): a noisy high sample never decides.
double lower_median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t k = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

int env_count(const char* name, int lo, int hi) {
  const int64_t v = env::param_size(name);
  if (v < lo || v > hi)
    TRIDENT_THROW(InvalidArgument, "{}={}: expected a whole number from {} to {}", name, v, lo, hi);
  return static_cast<int>(v);
}

}  // namespace

HealthOptions HealthOptions::from_env() {
  HealthOptions o;
  o.enabled = env::param_bool("TRIDENT_HEALTH");
  const std::string ratio = env::param_string("TRIDENT_HEALTH_BANDWIDTH");
  size_t pos = 0;
  try {
    o.bandwidth_ratio = std::stod(ratio, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != ratio.size() || !(o.bandwidth_ratio > 0 && o.bandwidth_ratio < 1))
    TRIDENT_THROW(InvalidArgument,
                  "TRIDENT_HEALTH_BANDWIDTH='{}': expected a fraction between 0 and 1 (a link is slow below this "
                  "fraction of its baseline bandwidth), e.g. 0.5",
                  ratio);
  o.late_s = env::param_seconds("TRIDENT_HEALTH_LATE");
  if (!(o.late_s > 0))
    TRIDENT_THROW(InvalidArgument, "TRIDENT_HEALTH_LATE: expected a positive duration such as 50ms, got {} s", o.late_s);
  o.window = env_count("TRIDENT_HEALTH_WINDOW", 1, 10000);
  o.bad_steps = env_count("TRIDENT_HEALTH_BAD_STEPS", 1, 10000);
  if (o.bad_steps > o.window)
    TRIDENT_THROW(InvalidArgument,
                  "TRIDENT_HEALTH_BAD_STEPS={} exceeds TRIDENT_HEALTH_WINDOW={}: a warning needs that many bad steps "
                  "among the last WINDOW; lower one or raise the other",
                  o.bad_steps, o.window);
  o.warmup = env_count("TRIDENT_HEALTH_WARMUP", 0, 1000000);
  o.baseline = env_count("TRIDENT_HEALTH_BASELINE", 1, 1000000);
  o.min_bytes = static_cast<uint64_t>(env::param_size("TRIDENT_HEALTH_MIN_BYTES"));
  const std::string links = env::param_string("TRIDENT_HEALTH_LINKS");
  if (links != "tcp" && links != "all")
    TRIDENT_THROW(InvalidArgument, "TRIDENT_HEALTH_LINKS='{}': expected tcp (links between hosts) or all", links);
  o.shm_links = links == "all";
  return o;
}

nlohmann::json HealthEvent::to_json() const {
  static const char* kinds[] = {"slow_link", "link_recovered", "straggler", "straggler_recovered"};
  nlohmann::json j = {{"kind", kinds[static_cast<int>(kind)]}, {"since_step", since_step}, {"message", message}};
  if (kind == Kind::kSlowLink || kind == Kind::kLinkRecovered) {
    j["src"] = src;
    j["dst"] = dst;
    j["ratio"] = ratio;
  } else {
    j["rank"] = src;
    j["late_ms"] = late_ms;
    j["late_fraction"] = late_fraction;
  }
  return j;
}

HealthDetector::HealthDetector(HealthOptions options, std::vector<std::string> names)
    : o_(options), names_(std::move(names)), ranks_(names_.size()) {}

int HealthDetector::update(Series& s, int64_t step, double value, bool higher_is_bad, Entry e) {
  if (++s.seen <= o_.warmup) return 0;
  if (s.baseline < 0) {
    s.base.push_back(value);
    if (static_cast<int>(s.base.size()) >= o_.baseline) s.baseline = lower_median(s.base);
    return 0;
  }
  e.step = step;
  e.value = higher_is_bad ? value - s.baseline : value / s.baseline;
  e.bad = higher_is_bad ? e.value >= o_.late_s : e.value < o_.bandwidth_ratio;
  s.window.push_back(std::move(e));
  while (static_cast<int>(s.window.size()) > o_.window) s.window.pop_front();
  int bad = 0;
  for (const Entry& x : s.window) bad += x.bad ? 1 : 0;
  if (!s.firing) {
    if (!s.window.back().bad || bad < o_.bad_steps) return 0;
    s.firing = true;
    return 1;
  }
  // Firing: recovered once the last bad_steps steps were all good.
  if (static_cast<int>(s.window.size()) < o_.bad_steps) return 0;
  for (int i = 0; i < o_.bad_steps; ++i)
    if (s.window[s.window.size() - 1 - i].bad) return 0;
  s.firing = false;
  return -1;
}

std::vector<HealthEvent> HealthDetector::add(const HealthSample& sample) {
  std::vector<HealthEvent> events;
  round_ = HealthRound{};
  auto first_bad = [](const Series& s) {
    for (const Entry& e : s.window)
      if (e.bad) return e.step;
    return s.window.back().step;
  };
  // ---- links: bandwidth of the step against the link's baseline ----
  for (const auto& l : sample.links) {
    if (l.bytes < o_.min_bytes || l.ns == 0 || l.src < 0 || l.dst < 0 || l.src >= static_cast<int>(names_.size()) ||
        l.dst >= static_cast<int>(names_.size()))
      continue;
    Series& s = links_[{l.src, l.dst}];
    const double bw = static_cast<double>(l.bytes) / static_cast<double>(l.ns);
    const int change = update(s, sample.step, bw, false, {});
    round_.links.push_back({l.src, l.dst, bw, s.baseline});
    if (change == 0) continue;
    HealthEvent e;
    e.src = l.src;
    e.dst = l.dst;
    if (change > 0) {
      std::vector<double> ratios;
      for (const Entry& x : s.window)
        if (x.bad) ratios.push_back(x.value);
      e.kind = HealthEvent::Kind::kSlowLink;
      e.ratio = lower_median(ratios);
      e.since_step = first_bad(s);
      e.message = fmt::format("link {} -> {} at {:.2f}x its bandwidth since step {}", names_[l.src], names_[l.dst],
                              e.ratio, e.since_step);
    } else {
      e.kind = HealthEvent::Kind::kLinkRecovered;
      e.ratio = s.window.back().value;
      e.since_step = sample.step;
      e.message = fmt::format("link {} -> {} back at {:.2f}x its bandwidth at step {}", names_[l.src], names_[l.dst],
                              e.ratio, e.since_step);
    }
    events.push_back(std::move(e));
  }
  // ---- ranks: how long each made the others wait this step, against its baseline ----
  const int n = static_cast<int>(names_.size());
  if (n < 2 || sample.collective_s.empty()) return events;
  std::vector<double> total(n, 0);
  std::vector<std::vector<double>> late(n);
  std::vector<double> others;
  for (const auto& times : sample.collective_s) {
    if (static_cast<int>(times.size()) != n) continue;
    for (int r = 0; r < n; ++r) {
      others.clear();
      for (int q = 0; q < n; ++q)
        if (q != r) others.push_back(times[q]);
      const double lateness = std::max(0.0, lower_median(others) - times[r]);
      total[r] += lateness;
      if (lateness >= o_.late_s / 4) late[r].push_back(lateness);
    }
  }
  for (int r = 0; r < n; ++r) {
    Series& s = ranks_[r];
    Entry entry;
    entry.collectives = static_cast<int>(sample.collective_s.size());
    entry.late = std::move(late[r]);
    const int change = update(s, sample.step, total[r], true, std::move(entry));
    round_.ranks.push_back({total[r], s.baseline});
    if (change == 0) continue;
    HealthEvent e;
    e.src = r;
    if (change > 0) {
      std::vector<double> all;
      int collectives = 0;
      for (const Entry& x : s.window) {  // over the bad steps: how late, and how often, while it lasts
        if (!x.bad) continue;
        all.insert(all.end(), x.late.begin(), x.late.end());
        collectives += x.collectives;
      }
      e.kind = HealthEvent::Kind::kStraggler;
      e.late_ms = lower_median(all) * 1e3;
      e.late_fraction = collectives > 0 ? static_cast<double>(all.size()) / collectives : 0;
      e.since_step = first_bad(s);
      e.message = fmt::format("{} arrives {:.0f} ms late at {:.0f}% of collectives since step {}", names_[r], e.late_ms,
                              e.late_fraction * 100, e.since_step);
    } else {
      e.kind = HealthEvent::Kind::kStragglerRecovered;
      e.since_step = sample.step;
      e.message = fmt::format("{} no longer arrives late at step {}", names_[r], e.since_step);
    }
    events.push_back(std::move(e));
  }
  return events;
}

HealthMonitor::HealthMonitor(std::shared_ptr<ProcessGroup> group, std::vector<std::shared_ptr<ProcessGroup>> counters,
                             HealthOptions options, std::string log_path)
    : group_(std::move(group)), counters_(std::move(counters)), o_(options), log_path_(std::move(log_path)) {
  if (!group_) return;
  bool has = false;
  for (auto& g : counters_) has |= g == group_;
  if (!has) counters_.insert(counters_.begin(), group_);
  counters_.erase(std::remove(counters_.begin(), counters_.end(), nullptr), counters_.end());
}

std::vector<HealthEvent> HealthMonitor::check(int64_t step) {
  if (!o_.enabled || !group_ || group_->size() < 2) return {};
  const int n = group_->size();
  const int k = GroupTraffic::kRecent;
  const GroupTraffic own = group_->traffic();
  // This rank's links, summed over the groups (keyed by the peer's global rank). TCP links are measured by
  // the sending side's kernel (bytes acknowledged over the time the connection was busy: neither rank's
  // scheduling moves it, so an oversubscribed or computing rank does not look like a slow link);
  // shared-memory links (TRIDENT_HEALTH_LINKS=all) by the receiver's timing of the messages it waited for.
  std::map<int, int> of_global;
  for (int i = 0; i < n; ++i) of_global[group_->global_rank(i)] = i;
  std::vector<uint64_t> counts(4 * static_cast<size_t>(n), 0);  // per peer: out bytes, out ns, in bytes, in ns
  for (auto& g : counters_) {
    const GroupTraffic t = g.get() == group_.get() ? own : g->traffic();
    for (const PeerTraffic& p : t.peers) {
      auto it = of_global.find(p.global_rank);
      if (it == of_global.end()) continue;
      uint64_t* c = counts.data() + 4 * it->second;
      if (p.tcp) {
        c[0] += p.tx_acked_bytes;
        c[1] += p.tx_busy_ns;
      } else if (o_.shm_links) {
        c[2] += p.rx_timed_bytes;
        c[3] += p.rx_busy_ns;
      }
    }
  }
  // Row: [collectives, (seq, seconds) x k, (out bytes, out ns, in bytes, in ns) x n] -- the step's deltas.
  const size_t row = 1 + 2 * static_cast<size_t>(k) + 4 * static_cast<size_t>(n);
  std::vector<double> mine(row, 0), all(row * n, 0);
  std::vector<GroupTraffic::Collective> fresh;
  for (const auto& c : own.recent)
    if (c.seq > last_seq_) fresh.push_back(c);
  if (static_cast<int>(fresh.size()) > k) fresh.erase(fresh.begin(), fresh.end() - k);
  mine[0] = static_cast<double>(fresh.size());
  for (size_t i = 0; i < fresh.size(); ++i) {
    mine[1 + 2 * i] = static_cast<double>(fresh[i].seq);
    mine[2 + 2 * i] = static_cast<double>(fresh[i].ns) * 1e-9;
    last_seq_ = std::max(last_seq_, fresh[i].seq);
  }
  if (last_counts_.size() != counts.size()) last_counts_.assign(counts.size(), 0);
  for (size_t i = 0; i < counts.size(); ++i)  // a counter that went back (a reconnected socket) starts over
    mine[1 + 2 * k + i] = counts[i] >= last_counts_[i] ? static_cast<double>(counts[i] - last_counts_[i]) : 0;
  last_counts_ = counts;
  group_->all_gather(mine.data(), all.data(), row, DType::kFloat64);
  if (group_->rank() != 0) return {};

  if (!detector_) {
    std::vector<std::string> names(n);
    for (int r = 0; r < n; ++r) {
      const std::string host = r < static_cast<int>(own.peers.size()) ? own.peers[r].host : std::string();
      names[r] = host.empty() ? fmt::format("rank {}", group_->global_rank(r))
                              : fmt::format("{}/rank {}", host, group_->global_rank(r));
    }
    detector_ = std::make_unique<HealthDetector>(o_, std::move(names));
  }
  HealthSample s;
  s.step = step;
  for (int me = 0; me < n; ++me) {
    const double* r = all.data() + row * me + 1 + 2 * k;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      const double* c = r + 4 * peer;
      if (c[0] > 0 && c[1] > 0) s.links.push_back({me, peer, static_cast<uint64_t>(c[0]), static_cast<uint64_t>(c[1])});
      if (c[2] > 0 && c[3] > 0) s.links.push_back({peer, me, static_cast<uint64_t>(c[2]), static_cast<uint64_t>(c[3])});
    }
  }
  // The collectives every rank reported, in sequence order.
  std::map<uint64_t, std::vector<double>> by_seq;
  for (int r = 0; r < n; ++r) {
    const double* x = all.data() + row * r;
    const int count = std::min(k, static_cast<int>(x[0]));
    for (int i = 0; i < count; ++i) {
      auto& v = by_seq[static_cast<uint64_t>(x[1 + 2 * i])];
      if (static_cast<int>(v.size()) == r) v.push_back(x[2 + 2 * i]);
    }
  }
  for (auto& [seq, times] : by_seq)
    if (static_cast<int>(times.size()) == n) s.collective_s.push_back(std::move(times));
  if (log_debug_enabled("health")) {
    std::string links, times;
    for (const auto& l : s.links)
      links += fmt::format(" {}->{} {:.3f} GB/s", l.src, l.dst, static_cast<double>(l.bytes) / static_cast<double>(l.ns));
    for (const auto& c : s.collective_s) {
      std::vector<double> ms;
      for (double x : c) ms.push_back(x * 1e3);
      times += fmt::format(" [{:.0f}]", fmt::join(ms, " "));
    }
    log_debug("health", "step {}: links{}; ms inside the collectives{}", step, links, times);
  }
  std::vector<HealthEvent> events = detector_->add(s);
  for (HealthEvent& e : events) {
    e.src = group_->global_rank(e.src);
    if (e.dst >= 0) e.dst = group_->global_rank(e.dst);
    if (e.warning()) log_warn("health: {}", e.message);
    else log_info("health: {}", e.message);
  }
  if (!log_path_.empty()) log_round(step, events);
  return events;
}

HealthMonitor::~HealthMonitor() {
  if (log_ != nullptr) std::fclose(log_);
}

void HealthMonitor::log_round(int64_t step, const std::vector<HealthEvent>& events) {
  if (log_ == nullptr) {
    // A resumed job rewrites the file with the rounds before its first step (a crashed run may have logged
    // more), as the trainer does metrics.jsonl; a fresh one (step 0) starts it empty.
    std::string kept;
    if (std::FILE* in = std::fopen(log_path_.c_str(), "r")) {
      char buf[1 << 16];
      std::string text;
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) text.append(buf, n);
      std::fclose(in);
      for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
        const std::string_view line(text.data() + at, nl + 1 - at);
        const auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (r.is_object() && r.value("step", step) < step) kept += line;
      }
    }
    log_ = std::fopen(log_path_.c_str(), "w");
    if (log_ == nullptr) {
      log_warn("health: cannot write '{}': {}; the rounds are not logged", log_path_, detail::errno_string(errno));
      log_path_.clear();
      return;
    }
    std::fputs(kept.c_str(), log_);
  }
  const HealthRound& round = detector_->last_round();
  const auto baseline = [](double x, double scale) { return x < 0 ? nlohmann::json() : nlohmann::json(x * scale); };
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json rec = {{"step", step},
                        {"time", std::chrono::duration<double>(since_epoch).count()},
                        {"links", nlohmann::json::array()},
                        {"ranks", nlohmann::json::array()}};
  for (const auto& l : round.links)
    rec["links"].push_back({{"src", group_->global_rank(l.src)},
                            {"dst", group_->global_rank(l.dst)},
                            {"gbps", l.gbps},
                            {"baseline_gbps", baseline(l.baseline_gbps, 1)}});
  for (size_t r = 0; r < round.ranks.size(); ++r)
    rec["ranks"].push_back({{"rank", group_->global_rank(static_cast<int>(r))},
                            {"late_ms", round.ranks[r].late_s * 1e3},
                            {"baseline_ms", baseline(round.ranks[r].baseline_s, 1e3)}});
  for (const HealthEvent& e : events) rec["events"].push_back(e.to_json());
  const std::string line = rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fputs(line.c_str(), log_);
  std::fflush(log_);
}

void HealthMonitor::annotate(nlohmann::json& rec) {
  const std::vector<HealthEvent> events = check(rec.value("step", int64_t{0}));
  for (const HealthEvent& e : events) rec["health"].push_back(e.to_json());
}

}  // namespace trident
