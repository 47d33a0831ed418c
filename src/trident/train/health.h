// Live health of a multi-rank job: slow links and stragglers, named while it trains.
//
// Every step each rank reads its groups' transfer counters (ProcessGroup::traffic: per TCP peer, the bytes
// the kernel saw acknowledged and the time the connection was busy, so neither rank's scheduling shows up as
// a slow link; per shared-memory peer, the bytes of large messages received and the time they took; per
// collective, the time this rank spent inside it) and the ranks gather them on one group (one small
// all_gather). Rank 0 compares each link's bandwidth and each
// rank's lateness with its own baseline (the median of the first steps after a warm-up) and warns when one
// is off for most of the recent steps:
//   link host1/rank 3 -> host2/rank 4 at 0.45x its bandwidth since step 1200
//   host2/rank 5 arrives 180 ms late at 90% of collectives since step 1200
// Lateness needs no synchronized clocks: the rank that arrives last at a collective spends the least time in
// it, so a rank's lateness at a collective is the others' (median) time inside it minus its own.
//
// HealthDetector is the decision alone (fed synthetic series by its tests); HealthMonitor gathers the
// counters and feeds it. With a log path, rank 0 also appends each round's measurements to it (the run's
// health.jsonl, one JSON object per line, flushed per round, so a crash leaves at most a torn last line):
//   {"step", "time" (Unix seconds), "links": [{"src", "dst", "gbps", "baseline_gbps"}],
//    "ranks": [{"rank", "late_ms", "baseline_ms"}], "events": [HealthEvent::to_json()...]}
// ranks are global ranks; a baseline is null until measured; late_ms is the rank's lateness summed over
// the step's collectives; events (warnings and recoveries) only when some were raised. A job that starts
// at step s (a resume) keeps the file's rounds before s and drops the rest, as metrics.jsonl does.
// Thresholds come from the TRIDENT_HEALTH_* variables (core/env.cc); the defaults never fire
// on a healthy run (a bad step needs half the bandwidth or 50 ms of lateness, in 6 of 8 steps).
// Ownership: the trainer's wiring owns one monitor per job. Thread-safety: one thread. Blocking: check()
// is a collective on the monitored group (its deadline), plus on rank 0 one buffered append to the log.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident {

class ProcessGroup;

struct HealthOptions {
  bool enabled = true;              // TRIDENT_HEALTH
  double bandwidth_ratio = 0.5;     // TRIDENT_HEALTH_BANDWIDTH: a step is bad for a link below this x its baseline
  double late_s = 0.05;             // TRIDENT_HEALTH_LATE: ... for a rank that makes the others wait this much more
  int window = 8;                   // TRIDENT_HEALTH_WINDOW: steps looked at
  int bad_steps = 6;                // TRIDENT_HEALTH_BAD_STEPS: bad ones among them that raise a warning
  int warmup = 3;                   // TRIDENT_HEALTH_WARMUP: first measured steps ignored
  int baseline = 10;                // TRIDENT_HEALTH_BASELINE: the next ones, whose median is the baseline
  uint64_t min_bytes = 64 << 10;    // TRIDENT_HEALTH_MIN_BYTES: a link's step counts when it carried this much
  bool shm_links = false;           // TRIDENT_HEALTH_LINKS=all: also shared-memory links (default: TCP only)
  // From the environment; a bad value is an InvalidArgument naming the variable.
  static HealthOptions from_env();
};

struct HealthEvent {
  enum class Kind { kSlowLink, kLinkRecovered, kStraggler, kStragglerRecovered };
  Kind kind = Kind::kSlowLink;
  int src = -1;                // link: sending global rank; straggler: the rank
  int dst = -1;                // link: receiving global rank
  double ratio = 0;            // link: recent bandwidth / baseline
  double late_ms = 0;          // straggler: median lateness at the collectives of its bad steps it was late at
  double late_fraction = 0;    // straggler: of the collectives of its bad steps, those it was late at
  int64_t since_step = 0;      // first bad step of the window (recovered: the step it recovered at)
  std::string message;
  bool warning() const { return kind == Kind::kSlowLink || kind == Kind::kStraggler; }
  nlohmann::json to_json() const;
};

// One step's measurements, as gathered on rank 0.
struct HealthSample {
  struct Link {
    int src = 0, dst = 0;  // ranks (indices into the detector's names)
    uint64_t bytes = 0;    // timed bytes received by dst from src during the step
    uint64_t ns = 0;       // the time they took
  };
  int64_t step = 0;
  std::vector<Link> links;
  // Per collective of the step, each rank's time inside it in seconds (one entry per rank).
  std::vector<std::vector<double>> collective_s;
};

// What one add() measured: each judged link's bandwidth and each rank's lateness, beside their baselines
// (< 0 until measured). Indices as in the sample.
struct HealthRound {
  struct Link {
    int src = 0, dst = 0;
    double gbps = 0, baseline_gbps = -1;  // bytes per ns
  };
  struct Rank {
    double late_s = 0, baseline_s = -1;
  };
  std::vector<Link> links;
  std::vector<Rank> ranks;  // empty when the step had no collective every rank reported
};

class HealthDetector {
 public:
  // names[r]: how rank r is named in messages ("host1/rank 3").
  HealthDetector(HealthOptions options, std::vector<std::string> names);
  // Adds one step; returns the warnings (and recoveries) it raises.
  std::vector<HealthEvent> add(const HealthSample& sample);
  // The measurements of the last add().
  const HealthRound& last_round() const { return round_; }

 private:
  struct Entry {
    int64_t step = 0;
    bool bad = false;
    double value = 0;                // link: ratio to baseline; rank: lateness beyond baseline (s)
    int collectives = 0;             // rank: collectives in the step
    std::vector<double> late;        // rank: its lateness at the collectives it was late at (s)
  };
  struct Series {
    int seen = 0;
    std::vector<double> base;
    double baseline = -1;            // < 0 until measured
    std::deque<Entry> window;
    bool firing = false;
  };
  // Adds `value` (warm-up, baseline, or a judged entry); returns +1 when the series starts firing, -1 when
  // it recovers, 0 otherwise.
  int update(Series& s, int64_t step, double value, bool higher_is_bad, Entry entry);
  HealthOptions o_;
  std::vector<std::string> names_;
  std::map<std::pair<int, int>, Series> links_;
  std::vector<Series> ranks_;
  HealthRound round_;
};

class HealthMonitor {
 public:
  // `group`: the group the check gathers on and whose collectives' times name stragglers; `counters`: the
  // groups whose per-peer counters make up the links (`group` is added when missing). Groups of one rank, or
  // options.enabled false: check() does nothing. `log_path`: where rank 0 appends each round ("": nowhere).
  HealthMonitor(std::shared_ptr<ProcessGroup> group, std::vector<std::shared_ptr<ProcessGroup>> counters,
                HealthOptions options, std::string log_path = "");
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;
  // Every rank of the group calls it after each step (a collective). On rank 0 the new events are printed
  // (warnings as warnings) and returned; other ranks get none.
  std::vector<HealthEvent> check(int64_t step);
  // check(rec["step"]), and the events go into the step's metrics record as rec["health"].
  void annotate(nlohmann::json& rec);

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<std::shared_ptr<ProcessGroup>> counters_;
  HealthOptions o_;
  std::vector<uint64_t> last_counts_;           // per group rank: link counters at the previous check
  uint64_t last_seq_ = 0;                        // collectives up to this one were sent already
  std::unique_ptr<HealthDetector> detector_;     // rank 0
  // Rank 0's log: opened at the first round (keeping the rounds before it), one line per round.
  void log_round(int64_t step, const std::vector<HealthEvent>& events);
  std::string log_path_;
  std::FILE* log_ = nullptr;
};

}  // namespace trident
