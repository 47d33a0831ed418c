#include "trident/comm/algorithms/shm_window.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/core/env.h"
#include "trident/core/error.h"

namespace trident {

// A fingerprint slot is rewritten by its rank at the start of a call while peers may read it from their slow
// checks (waiting, not yet synchronised with that call): seqlock-style, seq is cleared first and written
// last, and a reader that sees seq change (or 0) across its copy discards the copy (a torn read would
// otherwise report a mismatch that never happened: one call's count with the next call's dtype).
static void write_fingerprint(ShmWindow::Fingerprint& slot, const ShmWindow::Fingerprint& fp) {
  std::atomic_ref<uint64_t> seq(slot.seq);
  seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  ShmWindow::Fingerprint body = fp;
  body.seq = 0;
  std::memcpy(static_cast<void*>(&slot), &body, sizeof body);
  seq.store(fp.seq, std::memory_order_release);
}

static bool read_fingerprint(ShmWindow::Fingerprint& slot, ShmWindow::Fingerprint* out) {
  std::atomic_ref<uint64_t> seq(slot.seq);
  const uint64_t s0 = seq.load(std::memory_order_acquire);
  std::memcpy(static_cast<void*>(out), &slot, sizeof *out);
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint64_t s1 = seq.load(std::memory_order_relaxed);
  out->seq = s0;
  return s0 != 0 && s0 == s1;
}

// Per-rank control of the collective window: the phase counter alone on its line, then the fingerprints.
struct TinyLine {
  std::atomic<uint64_t> stamp;  // the call number this line holds (0: none yet)
  ShmWindow::Fingerprint fp;
  uint8_t payload[ShmWindow::kTinyBytes];
};
static_assert(sizeof(TinyLine) == 64, "a tiny line is one cache line");

struct ShmWindow::Ctl {
  alignas(64) std::atomic<uint64_t> counter;
  alignas(64) ShmWindow::Fingerprint fp[2];
  alignas(64) TinyLine tiny[2];
  alignas(64) std::atomic<int32_t> cpu;  // the CPU this rank last waited on (co-location check)
};


namespace {
constexpr size_t kWindowPage = 4096;
size_t window_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

// Layout of the region: the ranks' control lines, then 2 slots per rank, then 2 staging buffers per rank.
size_t ShmWindow::ctl_bytes(int n) { return window_round_up(sizeof(Ctl) * static_cast<size_t>(n), kWindowPage); }

size_t ShmWindow::region_bytes(int n, size_t stage_bytes) {
  return ctl_bytes(n) + static_cast<size_t>(n) * 2 * (kSlotBytes + window_round_up(stage_bytes, kWindowPage));
}

size_t ShmWindow::default_stage_bytes(int n) {
  size_t b = static_cast<size_t>(env::shm_window_bytes());
  if (b == 0) b = n <= 4 ? (size_t{1} << 20) : (size_t{256} << 10);
  return window_round_up(b, kWindowPage);
}

ShmWindow::ShmWindow(ShmSegment* seg)
    : seg_(seg), base_(seg->window_region()), me_(seg->local_rank()), n_(seg->local_size()) {
  const size_t fixed = ctl_bytes(n_) + static_cast<size_t>(n_) * 2 * kSlotBytes;
  if (base_ == nullptr || seg->window_bytes() <= fixed)
    TRIDENT_THROW(InvalidArgument, "shared-memory window: the segment's window region ({} bytes) is smaller than "
                  "the {} bytes {} ranks need before their staging buffers",
                  seg->window_bytes(), fixed, n_);
  stage_bytes_ = (seg->window_bytes() - fixed) / (static_cast<size_t>(n_) * 2);
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  spin_limit_ = env::short_spin(static_cast<unsigned>(n_) > cores) ? 64 : 4000;
}

ShmWindow::Ctl* ShmWindow::ctl(int r) const { return reinterpret_cast<Ctl*>(base_) + r; }

uint8_t* ShmWindow::slot(int r, int buf) {
  return base_ + ctl_bytes(n_) + (static_cast<size_t>(r) * 2 + buf) * kSlotBytes;
}

uint8_t* ShmWindow::stage(int r, int buf) {
  return base_ + ctl_bytes(n_) + static_cast<size_t>(n_) * 2 * kSlotBytes +
         (static_cast<size_t>(r) * 2 + buf) * stage_bytes_;
}

void ShmWindow::set_identity(std::string group, std::vector<int> global_ranks) {
  group_ = std::move(group);
  global_ranks_ = std::move(global_ranks);
}

void ShmWindow::begin(const Fingerprint& fp, std::chrono::steady_clock::time_point deadline,
                      std::function<void()> poll) {
  fp_ = fp;
  deadline_ = deadline;
  poll_ = std::move(poll);
  cur_fp_ = static_cast<int>(calls_++ & 1);
  // Visible to peers with this call's first publish (release); they read it after seeing that phase.
  write_fingerprint(ctl(me_)->fp[cur_fp_], fp);
}

std::string ShmWindow::describe(const Fingerprint& fp) {
  return fmt::format("{} [algorithm {}]",
                     trident::describe(fingerprint_args(fp.op, fp.dtype, fp.redop, fp.root, fp.count)),
                     algo_name(static_cast<Algo>(fp.algo)));
}

std::string ShmWindow::who(int r) const {
  int g = r < static_cast<int>(global_ranks_.size()) ? global_ranks_[r] : r;
  if (g != r) return fmt::format("rank {} (global rank {}, pid {})", r, g, seg_->pid(r));
  return fmt::format("rank {} (pid {})", r, seg_->pid(r));
}

void ShmWindow::publish() {
  ++phase_;
  ctl(me_)->counter.store(phase_, std::memory_order_release);
  for (int p = 0; p < n_; ++p)
    if (p != me_) seg_->ring(p);
}

namespace {
constexpr int kSpinUs = 200;
constexpr int kPureSpinUs = 50;
inline void window_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

template <class Ready, class Behind>
void ShmWindow::wait_until(Ready ready, Behind behind) {
  if (ready()) return;
  // Spin by time, not by iterations (a pause lasts 10 to 150 cycles depending on the CPU): long enough
  // to cover a peer's share of one round of the bandwidth path, so that ranks with a core each never
  // fall into sleeping and waking each other every phase. Oversubscribed: a few iterations only.
  // The spin yields when a late peer last waited on this rank's CPU (the scheduler does put both ranks on
  // one core, for a while after start), and after kPureSpinUs in any case: the peer then runs at once.
  if (spin_limit_ > 64) {
    // First a short spin that reads no clock and touches no shared line but the awaited ones: a peer one
    // cache-line transfer behind (small collectives, ranks on their own cores) arrives within it.
    for (int i = 0; i < 16; ++i) {
      window_relax();
      if (ready()) return;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + std::chrono::microseconds(kSpinUs);
    int cpu = sched_getcpu();
    ctl(me_)->cpu.store(cpu, std::memory_order_relaxed);
    for (int i = 1;; ++i) {
      if (ready()) return;
      window_relax();
      if ((i & 63) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= spin_until) break;
        // A peer we wait for last waited on this CPU: it is (or was) sharing our core; let it run.
        bool shared = false;
        for (int p = 0; p < n_ && !shared; ++p)
          shared = p != me_ && behind(p) && ctl(p)->cpu.load(std::memory_order_relaxed) == cpu;
        if (shared || now >= start + std::chrono::microseconds(kPureSpinUs)) {
          sched_yield();
          cpu = sched_getcpu();
          ctl(me_)->cpu.store(cpu, std::memory_order_relaxed);
        }
      }
    }
  } else {
    for (int i = 0; i < spin_limit_; ++i) {
      if (ready()) return;
      window_relax();
    }
  }
  auto next_check = std::chrono::steady_clock::now();
  for (;;) {
    uint32_t seen = seg_->bell(me_).load(std::memory_order_acquire);
    seg_->sleeping(me_).store(1, std::memory_order_seq_cst);
    if (ready()) {
      seg_->sleeping(me_).store(0, std::memory_order_relaxed);
      return;
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= next_check) {
      seg_->sleeping(me_).store(0, std::memory_order_relaxed);
      std::vector<int> missing;
      for (int p = 0; p < n_; ++p)
        if (p != me_ && behind(p)) missing.push_back(p);
      slow_checks_for(missing, [&](int q) { return static_cast<bool>(behind(q)); });
      next_check = now + std::chrono::milliseconds(100);
      continue;
    }
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now).count());
    seg_->sleep_on_bell(seen, std::clamp(ms, 1, 20));
    seg_->sleeping(me_).store(0, std::memory_order_relaxed);
    if (ready()) return;
    for (int i = 0; i < spin_limit_ / 8 && !ready(); ++i) window_relax();
  }
}

template <class Behind>
void ShmWindow::wait_for_peers(Behind behind) {
  wait_until(
      [&] {
        for (int p = 0; p < n_; ++p)
          if (p != me_ && behind(p)) return false;
        return true;
      },
      behind);
}

void ShmWindow::wait_all(uint64_t target) {
  wait_for_peers([&](int p) { return ctl(p)->counter.load(std::memory_order_acquire) < target; });
}

void ShmWindow::post_tiny(const void* data, size_t n) {
  TinyLine& t = ctl(me_)->tiny[cur_fp_];
  t.fp = fp_;
  std::memcpy(t.payload, data, n);
  t.stamp.store(calls_, std::memory_order_release);
  for (int p = 0; p < n_; ++p)
    if (p != me_) seg_->ring(p);
}

void ShmWindow::wait_tiny() {
  wait_for_peers([&](int p) { return ctl(p)->tiny[cur_fp_].stamp.load(std::memory_order_acquire) < calls_; });
  for (int p = 0; p < n_; ++p)
    if (p != me_) check_one(p, ctl(p)->tiny[cur_fp_].fp);
}

const uint8_t* ShmWindow::tiny(int r) const { return ctl(r)->tiny[cur_fp_].payload; }

void ShmWindow::slow_checks_for(const std::vector<int>& missing, const std::function<bool(int)>& behind) {
  if (seg_->aborted()) raise_aborted();
  if (poll_) poll_();  // the engine's message progress: a message-based collective at this seq is a mismatch
  // A peer waiting on another path of the window at this sequence number (e.g. tiny against slots).
  for (int p : missing) {
    Fingerprint f;
    if (!read_fingerprint(ctl(p)->fp[cur_fp_], &f)) continue;  // being rewritten: the peer moved on
    if (f.seq == fp_.seq) check_one(p, f);
  }
  for (int p : missing)
    if (!process_alive(seg_->pid(p), seg_->starttime(p)) && behind(p))  // re-read after seeing it gone
      fail(AbortRecord::Kind::kPeerDied,
           fmt::format("{} died during {} (sequence number {}) in group '{}'", who(p), describe(fp_), fp_.seq, group_), p);
  if (!missing.empty() && std::chrono::steady_clock::now() >= deadline_)
    fail(AbortRecord::Kind::kTimeout,
         fmt::format("{} (sequence number {}) in group '{}' timed out on rank {}; not heard from: rank(s) {}",
                     describe(fp_), fp_.seq, group_, me_, fmt::join(missing, ", ")),
         -1, missing);
}

void ShmWindow::fail(AbortRecord::Kind kind, const std::string& msg, int peer, std::vector<int> missing) {
  AbortRecord r;
  r.kind = kind;
  r.reporter = me_;
  r.peer = peer;
  r.ranks = std::move(missing);
  r.op = op_name(static_cast<OpKind>(fp_.op));
  r.seq = static_cast<long>(fp_.seq);
  r.message = msg;
  seg_->set_abort(r);
  r.raise(me_);
}

void ShmWindow::raise_aborted() { seg_->abort_record().raise(me_); }

void ShmWindow::check_fingerprints() {
  for (int p = 0; p < n_; ++p)
    if (p != me_) check_one(p, ctl(p)->fp[cur_fp_]);
}

void ShmWindow::check_one(int p, const Fingerprint& f) {
  if (f.seq == fp_.seq && f.count == fp_.count && f.op == fp_.op && f.dtype == fp_.dtype && f.redop == fp_.redop &&
      f.algo == fp_.algo && f.root == fp_.root)
    return;
  fail(AbortRecord::Kind::kMismatch,
       fmt::format("collective mismatch in group '{}' at sequence number {}: {} issued {} but {} issued {} "
                   "(sequence number {}); every rank must issue the same collectives in the same order with the "
                   "same count, dtype, op and root",
                   group_, fp_.seq, who(me_), describe(fp_), who(p), describe(f), f.seq),
       p);
}

int ShmWindow::acquire_slot() {
  int buf = static_cast<int>(slot_uses_++ & 1);
  if (slot_release_[buf] > 0) wait_all(slot_release_[buf]);
  return buf;
}

int ShmWindow::acquire_stage() {
  int buf = static_cast<int>(stage_uses_++ & 1);
  if (stage_release_[buf] > 0) wait_all(stage_release_[buf]);
  return buf;
}

// ---- single-copy path (algorithms/shm_cma.cc) ----
int32_t ShmWindow::peer_pid(int r) const { return seg_->pid(r); }

void ShmWindow::check_abort() {
  if (seg_->aborted()) raise_aborted();
}

void ShmWindow::fail_peer_access(int peer, int err, const std::string& what) {
  // Another rank failed first (the peer then left the collective and may have freed its buffers): its reason.
  check_abort();
  // A peer that is exiting has lost its memory before /proc shows it dead: give it a moment.
  bool gone = err == ESRCH;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !process_alive(seg_->pid(peer), seg_->starttime(peer));
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    check_abort();
  }
  if (gone)
    fail(AbortRecord::Kind::kPeerDied,
         fmt::format("{} died during {} (sequence number {}) in group '{}' ({} failed: {})", who(peer),
                          describe(fp_), fp_.seq, group_, what, std::strerror(err)),
         peer);
  fail(AbortRecord::Kind::kOther, fmt::format("{} on rank {} failed for {} during {} (sequence number {}) in group '{}': {}", what, me_,
                        who(peer), describe(fp_), fp_.seq, group_, std::strerror(err)),
       peer);
}
// ---- end single-copy path ----

int ShmWindow::peer_at_seq(uint64_t seq, Fingerprint* theirs) const {
  for (int p = 0; p < n_; ++p) {
    if (p == me_) continue;
    for (int k = 0; k < 2; ++k) {
      Fingerprint f;
      if (!read_fingerprint(ctl(p)->fp[k], &f)) continue;
      if (f.seq == seq && f.algo != 0) {
        if (theirs) *theirs = f;
        return p;
      }
    }
  }
  return -1;
}

}  // namespace trident
