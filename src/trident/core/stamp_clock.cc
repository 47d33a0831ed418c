#include "trident/core/stamp_clock.h"

#include <time.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace trident::stamp_clock {
namespace detail {

std::atomic<int64_t> g_next_anchor{0};

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The counter is a clock only where it ticks at one rate whatever the core's frequency and sleep state
// (constant_tsc, nonstop_tsc); Linux keeps it in step across cores on such CPUs, or marks it unstable and
// stops exporting the flags' clocksource, which a VM's kvm-clock also relies on.
bool tsc_in_use_init() {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    bool constant = false, nonstop = false;
    for (std::string w; words >> w;) {
      constant = constant || w == "constant_tsc";
      nonstop = nonstop || w == "nonstop_tsc";
    }
    return constant && nonstop;
  }
#endif
  return false;
}

}  // namespace detail

namespace {

struct Anchor {
  int64_t stamp;
  int64_t ns;
};

constexpr size_t kMaxAnchors = 4096;
constexpr int64_t kMinSpanNs = 1000000;  // two anchors this far apart give the rate to about 1e-4

struct Anchors {
  std::mutex mu;
  std::vector<Anchor> list;  // by stamp, oldest first
};
Anchors& anchors() {
  static Anchors* a = new Anchors;  // never destroyed: stamps may be converted during static destruction
  return *a;
}

// A (stamp, CLOCK_MONOTONIC) pair read as close together as this thread can: the best of three reads (an
// interrupt between the reads would shift the pair by its length).
Anchor read_pair() {
  Anchor best{0, 0};
  int64_t best_gap = -1;
  for (int i = 0; i < 3; ++i) {
    const int64_t s0 = now();
    const int64_t ns = detail::monotonic_ns();
    const int64_t s1 = now();
    if (best_gap < 0 || s1 - s0 < best_gap) {
      best_gap = s1 - s0;
      best = {s0 + (s1 - s0) / 2, ns};
    }
  }
  return best;
}

double rate_locked(const std::vector<Anchor>& l) {  // stamps per nanosecond
  if (l.size() < 2 || l.back().ns - l.front().ns <= 0) return 1.0;
  return static_cast<double>(l.back().stamp - l.front().stamp) / static_cast<double>(l.back().ns - l.front().ns);
}

void push_locked(std::vector<Anchor>& l, Anchor a) {
  if (!l.empty() && a.stamp <= l.back().stamp) return;
  if (l.size() == kMaxAnchors) l.erase(l.begin());
  l.push_back(a);
  // The next anchor in about a second (before the rate is known: in 1e9 stamps, a second or less).
  const double per_ns = l.size() >= 2 ? rate_locked(l) : 1.0;
  detail::g_next_anchor.store(a.stamp + static_cast<int64_t>(per_ns * 1e9), std::memory_order_relaxed);
}

// Makes sure an anchor lies at or after `stamp`, at least kMinSpanNs after the one before it (so that two
// anchors bracket every stamp taken so far and give a rate).
void cover_locked(std::vector<Anchor>& l, int64_t stamp) {
  if (!l.empty() && l.back().stamp >= stamp && l.size() >= 2) return;
  Anchor a = read_pair();
  if (!l.empty()) {
    while (a.ns - l.back().ns < kMinSpanNs) a = read_pair();  // at most a millisecond, at a dump
  } else {
    push_locked(l, a);
    while (a.ns - l.back().ns < kMinSpanNs) a = read_pair();
  }
  push_locked(l, a);
}

int64_t lerp(int64_t x, int64_t x0, int64_t x1, int64_t y0, int64_t y1) {
  if (x1 == x0) return y0 + (x - x0);
  const __int128 num = static_cast<__int128>(x - x0) * (y1 - y0);
  return y0 + static_cast<int64_t>(num / (x1 - x0));
}

}  // namespace

namespace detail {
void take_anchor(int64_t) {
  Anchors& a = anchors();
  std::unique_lock<std::mutex> lock(a.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another thread is taking one
  if (!a.list.empty() && now() < g_next_anchor.load(std::memory_order_relaxed)) return;
  push_locked(a.list, read_pair());
}
}  // namespace detail

int64_t to_ns(int64_t stamp) {
  if (stamp == 0 || !uses_tsc()) return stamp;
  Anchors& a = anchors();
  std::lock_guard<std::mutex> lock(a.mu);
  std::vector<Anchor>& l = a.list;
  cover_locked(l, stamp);
  auto it = std::upper_bound(l.begin(), l.end(), stamp, [](int64_t s, const Anchor& x) { return s < x.stamp; });
  size_t hi = static_cast<size_t>(it - l.begin());
  if (hi == 0) hi = 1;                 // before the oldest anchor kept: extrapolated from the first two
  if (hi == l.size()) hi = l.size() - 1;  // (cover_locked put the newest at or after the stamp)
  const Anchor& p = l[hi - 1];
  const Anchor& q = l[hi];
  return lerp(stamp, p.stamp, q.stamp, p.ns, q.ns);
}

int64_t from_ns(int64_t ns) {
  if (ns == 0 || !uses_tsc()) return ns;
  Anchors& a = anchors();
  std::lock_guard<std::mutex> lock(a.mu);
  std::vector<Anchor>& l = a.list;
  cover_locked(l, now());
  auto it = std::upper_bound(l.begin(), l.end(), ns, [](int64_t v, const Anchor& x) { return v < x.ns; });
  size_t hi = static_cast<size_t>(it - l.begin());
  if (hi == 0) hi = 1;
  if (hi == l.size()) hi = l.size() - 1;
  const Anchor& p = l[hi - 1];
  const Anchor& q = l[hi];
  return lerp(ns, p.ns, q.ns, p.stamp, q.stamp);
}

double ticks_per_second() {
  if (!uses_tsc()) return 1e9;
  Anchors& a = anchors();
  std::lock_guard<std::mutex> lock(a.mu);
  cover_locked(a.list, now());
  return rate_locked(a.list) * 1e9;
}

}  // namespace trident::stamp_clock
