#include "trident/comm/transport/shm.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/ranges.h>

#include "trident/comm/store/store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {
namespace {

constexpr uint64_t kShmMagic = 0x747269642d73686dULL;  // "trid-shm"
constexpr size_t kPage = 4096;

struct alignas(64) RankInfo {
  std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleeping;
  int32_t pid;
  uint32_t pad0;
  uint64_t starttime;
};

struct RingCtl {
  alignas(64) std::atomic<uint64_t> head;  // total bytes written (producer)
  alignas(64) std::atomic<uint64_t> tail;  // total bytes read (consumer)
};

struct Header {
  uint64_t magic;
  uint32_t local_size;
  uint32_t pad0;
  uint64_t ring_bytes;
  std::atomic<uint32_t> abort_state;  // 0 none, 1 writing, 2 record ready
  uint32_t abort_len;
  char abort_record[2048];  // AbortRecord::encode()
};

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

}  // namespace

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

struct ShmSegment::Layout {
  size_t ranks_off, rings_ctl_off, data_off, window_off, total;
  int n;
  size_t ring_bytes;
  Layout(int n, size_t ring_bytes, size_t window_stage_bytes = 0) : n(n), ring_bytes(ring_bytes) {
    ranks_off = round_up(sizeof(Header), kPage);
    rings_ctl_off = round_up(ranks_off + sizeof(RankInfo) * n, kPage);
    size_t pairs = static_cast<size_t>(n) * (n > 1 ? n - 1 : 0);
    data_off = round_up(rings_ctl_off + sizeof(RingCtl) * pairs, kPage);
    window_off = data_off + pairs * ring_bytes;
    total = window_off + window_bytes(n, window_stage_bytes);
  }
  // Window: controls, then 2 slots per rank, then 2 staging buffers per rank.
  static size_t window_ctl_bytes(int n) { return round_up(sizeof(ShmWindow::Ctl) * n, kPage); }
  static size_t window_bytes(int n, size_t stage) {
    return window_ctl_bytes(n) + static_cast<size_t>(n) * 2 * (ShmWindow::kSlotBytes + stage);
  }
  size_t pair(int src, int dst) const { return static_cast<size_t>(src) * (n - 1) + (dst < src ? dst : dst - 1); }
};

namespace {

class ShmChannel : public Channel {
 public:
  ShmChannel(ShmSegment* seg, int me, int peer, RingCtl* out_ctl, uint8_t* out_data, RingCtl* in_ctl,
             uint8_t* in_data, size_t cap)
      : seg_(seg), me_(me), peer_(peer), out_(out_ctl), out_data_(out_data), in_(in_ctl), in_data_(in_data),
        cap_(cap), mask_(cap - 1) {}

  size_t write_some(const void* data, size_t n) override {
    uint64_t head = out_->head.load(std::memory_order_relaxed);
    uint64_t tail = out_->tail.load(std::memory_order_acquire);
    size_t free_bytes = (cap_ - static_cast<size_t>(head - tail)) & ~static_cast<size_t>(63);
    size_t m = n < free_bytes ? n : free_bytes;
    if (m == 0) return 0;
    size_t off = head & mask_;
    size_t first = m < cap_ - off ? m : cap_ - off;
    std::memcpy(out_data_ + off, data, first);
    if (first < m) std::memcpy(out_data_, static_cast<const uint8_t*>(data) + first, m - first);
    out_->head.store(head + m, std::memory_order_release);
    seg_->ring(peer_);
    return m;
  }

  size_t read_some(void* data, size_t n) override {
    uint64_t tail = in_->tail.load(std::memory_order_relaxed);
    uint64_t head = in_->head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    size_t m = n < avail ? n : avail;
    if (m == 0) return 0;
    size_t off = tail & mask_;
    size_t first = m < cap_ - off ? m : cap_ - off;
    std::memcpy(data, in_data_ + off, first);
    if (first < m) std::memcpy(static_cast<uint8_t*>(data) + first, in_data_, m - first);
    in_->tail.store(tail + m, std::memory_order_release);
    seg_->ring(peer_);
    return m;
  }

  std::span<const uint8_t> peek() override {
    uint64_t tail = in_->tail.load(std::memory_order_relaxed);
    uint64_t head = in_->head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    size_t off = tail & mask_;
    size_t len = avail < cap_ - off ? avail : cap_ - off;
    return {in_data_ + off, len};
  }

  void consume(size_t n) override {
    if (n == 0) return;
    in_->tail.store(in_->tail.load(std::memory_order_relaxed) + n, std::memory_order_release);
    seg_->ring(peer_);
  }

  bool is_shm() const override { return true; }
  std::string describe() const override { return "shm"; }

 private:
  ShmSegment* seg_;
  int me_, peer_;
  RingCtl* out_;
  uint8_t* out_data_;
  RingCtl* in_;
  uint8_t* in_data_;
  size_t cap_, mask_;
};

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create_or_open(Store& store, const std::string& key, int local_rank,
                                                       int local_size, size_t ring_bytes, double timeout_s,
                                                       size_t window_bytes) {
  // Ring capacity: a power of two, at least 64 KiB.
  size_t cap = 64 * 1024;
  while (cap < ring_bytes) cap <<= 1;
  // Window staging per rank and buffer: a round of the bandwidth path (L2-sized), whole pages.
  if (window_bytes == 0) window_bytes = static_cast<size_t>(env::shm_window_bytes());
  if (window_bytes == 0) window_bytes = local_size <= 4 ? (size_t{1} << 20) : (size_t{256} << 10);
  window_bytes = round_up(window_bytes, kPage);
  Layout lay(local_size, cap, window_bytes);
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->local_rank_ = local_rank;
  seg->local_size_ = local_size;
  seg->ring_bytes_ = cap;
  seg->bytes_ = lay.total;
  Seconds timeout(timeout_s);

  std::string name;
  int fd = -1;
  if (local_rank == 0) {
    std::random_device rd;
    name = fmt::format("/trident-{}-{:x}{:x}", getpid(), rd(), rd());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    TRIDENT_SYSCHECK(fd, fmt::format("shm_open({}) for the shared-memory transport", name));
    if (ftruncate(fd, static_cast<off_t>(lay.total)) < 0) {
      int e = errno;
      close(fd);
      shm_unlink(name.c_str());
      TRIDENT_THROW(IoError,
                    "cannot size the shared-memory segment {} to {} bytes: {} (is /dev/shm full? lower "
                    "TRIDENT_SHM_RING_BYTES or use TRIDENT_TRANSPORT=tcp)",
                    name, lay.total, detail::errno_string(e));
    }
    store.set_string(key, name);
  } else {
    name = store.get_string(key, timeout);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    TRIDENT_SYSCHECK(fd, fmt::format("shm_open({}) published by local rank 0", name));
  }
  void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mmap_errno = errno;
  close(fd);
  if (p == MAP_FAILED) {
    if (local_rank == 0) shm_unlink(name.c_str());
    TRIDENT_THROW(IoError, "mmap of shared-memory segment {} ({} bytes) failed: {}", name, lay.total,
                  detail::errno_string(mmap_errno));
  }
  seg->base_ = static_cast<uint8_t*>(p);
  seg->window_bytes_ = window_bytes;
  seg->window_ = std::make_unique<ShmWindow>(seg.get(), seg->base_ + lay.window_off, window_bytes);
  auto* hdr = reinterpret_cast<Header*>(seg->base_);
  if (local_rank == 0) {
    hdr->local_size = static_cast<uint32_t>(local_size);
    hdr->ring_bytes = cap;
    hdr->abort_len = 0;
    std::atomic_thread_fence(std::memory_order_release);
    hdr->magic = kShmMagic;
  }
  auto* ri = reinterpret_cast<RankInfo*>(seg->base_ + lay.ranks_off) + local_rank;
  ri->pid = getpid();
  ri->starttime = process_starttime(getpid());
  // Everyone has opened and published its pid: then the name can go (no leak if a process dies later).
  int64_t opened = store.add(key + "/opened", 1);
  if (opened == local_size) store.set_string(key + "/all", "1");
  store.wait({key + "/all"}, timeout);
  if (local_rank == 0) shm_unlink(name.c_str());
  if (hdr->magic != kShmMagic || hdr->local_size != static_cast<uint32_t>(local_size))
    TRIDENT_THROW(NetworkError, "shared-memory segment {} has a bad header (magic {:x}, size {}); expected {} ranks",
                  name, hdr->magic, hdr->local_size, local_size);
  return seg;
}

ShmSegment::~ShmSegment() {
  if (base_) munmap(base_, bytes_);
}

std::unique_ptr<Channel> ShmSegment::channel_to(int peer) {
  Layout lay(local_size_, ring_bytes_);
  auto* ctl = reinterpret_cast<RingCtl*>(base_ + lay.rings_ctl_off);
  size_t out = lay.pair(local_rank_, peer), in = lay.pair(peer, local_rank_);
  return std::make_unique<ShmChannel>(this, local_rank_, peer, ctl + out, base_ + lay.data_off + out * ring_bytes_,
                                      ctl + in, base_ + lay.data_off + in * ring_bytes_, ring_bytes_);
}

std::atomic<uint32_t>& ShmSegment::bell(int local) {
  Layout lay(local_size_, ring_bytes_);
  return (reinterpret_cast<RankInfo*>(base_ + lay.ranks_off) + local)->bell;
}
std::atomic<uint32_t>& ShmSegment::sleeping(int local) {
  Layout lay(local_size_, ring_bytes_);
  return (reinterpret_cast<RankInfo*>(base_ + lay.ranks_off) + local)->sleeping;
}

void ShmSegment::ring(int local) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto& s = sleeping(local);
  if (s.load(std::memory_order_relaxed)) {
    auto& b = bell(local);
    b.fetch_add(1, std::memory_order_seq_cst);
    futex(&b, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void ShmSegment::sleep_on_bell(uint32_t seen, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  futex(&bell(local_rank_), FUTEX_WAIT, seen, &ts);
}

void ShmSegment::wake_all() {
  for (int i = 0; i < local_size_; ++i) {
    bell(i).fetch_add(1, std::memory_order_seq_cst);
    futex(&bell(i), FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void ShmSegment::set_abort(const AbortRecord& record) {
  auto* hdr = reinterpret_cast<Header*>(base_);
  uint32_t expected = 0;
  if (hdr->abort_state.compare_exchange_strong(expected, 1)) {
    const std::string bytes = record.encode(sizeof(hdr->abort_record));
    std::memcpy(hdr->abort_record, bytes.data(), bytes.size());
    hdr->abort_len = static_cast<uint32_t>(bytes.size());
    hdr->abort_state.store(2, std::memory_order_release);
  }
  wake_all();
}

bool ShmSegment::aborted() const {
  return reinterpret_cast<const Header*>(base_)->abort_state.load(std::memory_order_acquire) != 0;
}

AbortRecord ShmSegment::abort_record() const {
  auto* hdr = reinterpret_cast<const Header*>(base_);
  for (int i = 0; i < 1000 && hdr->abort_state.load(std::memory_order_acquire) == 1; ++i) usleep(100);
  if (hdr->abort_state.load(std::memory_order_acquire) != 2) {
    AbortRecord none;
    none.message = "the group was aborted (no reason recorded)";
    return none;
  }
  return AbortRecord::decode(std::string_view(hdr->abort_record, hdr->abort_len));
}

int32_t ShmSegment::pid(int local) const {
  Layout lay(local_size_, ring_bytes_);
  return (reinterpret_cast<const RankInfo*>(base_ + lay.ranks_off) + local)->pid;
}
uint64_t ShmSegment::starttime(int local) const {
  Layout lay(local_size_, ring_bytes_);
  return (reinterpret_cast<const RankInfo*>(base_ + lay.ranks_off) + local)->starttime;
}

namespace {
// Parses /proc/<pid>/stat: state (field 3) and starttime (field 22). Returns false if unreadable.
bool read_stat(int32_t pid, char* state, uint64_t* starttime) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (!p) return false;
  std::istringstream in(p + 2);
  std::string field;
  in >> *state;
  for (int i = 4; i <= 22 && in >> field; ++i)
    if (i == 22) *starttime = std::strtoull(field.c_str(), nullptr, 10);
  return true;
}
}  // namespace

uint64_t process_starttime(int32_t pid) {
  char state;
  uint64_t st = 0;
  return read_stat(pid, &state, &st) ? st : 0;
}

bool process_alive(int32_t pid, uint64_t starttime) {
  char state = '?';
  uint64_t st = 0;
  if (!read_stat(pid, &state, &st)) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return starttime == 0 || st == starttime;
}

// ---------------------------------------------------------------------------------------------------
// ShmWindow

ShmWindow::ShmWindow(ShmSegment* seg, uint8_t* base, size_t stage_bytes)
    : seg_(seg), base_(base), me_(seg->local_rank()), n_(seg->local_size()), stage_bytes_(stage_bytes) {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  spin_limit_ = env::short_spin(static_cast<unsigned>(n_) > cores) ? 64 : 4000;
}

ShmWindow::Ctl* ShmWindow::ctl(int r) const { return reinterpret_cast<Ctl*>(base_) + r; }

uint8_t* ShmWindow::slot(int r, int buf) {
  return base_ + ShmSegment::Layout::window_ctl_bytes(n_) + (static_cast<size_t>(r) * 2 + buf) * kSlotBytes;
}

uint8_t* ShmWindow::stage(int r, int buf) {
  return base_ + ShmSegment::Layout::window_ctl_bytes(n_) + static_cast<size_t>(n_) * 2 * kSlotBytes +
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

void ShmWindow::wait_all(uint64_t target) {
  auto behind = [&](int p) { return ctl(p)->counter.load(std::memory_order_acquire) < target; };
  wait_until(
      [&] {
        for (int p = 0; p < n_; ++p)
          if (p != me_ && behind(p)) return false;
        return true;
      },
      behind);
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
  auto behind = [&](int p) { return ctl(p)->tiny[cur_fp_].stamp.load(std::memory_order_acquire) < calls_; };
  wait_until(
      [&] {
        for (int p = 0; p < n_; ++p)
          if (p != me_ && behind(p)) return false;
        return true;
      },
      behind);
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
