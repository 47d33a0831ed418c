#include "trident/comm/transport/shm.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
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
// The first kBigRings peers a rank writes to get rings of `ring_bytes`; later ones share kSmallRingsBudget
// per rank, kSmallRingBytes each at most (up to 132 local ranks), halving beyond, at least one page.
constexpr int kBigRings = 4;
constexpr size_t kSmallRingBytes = 16 * 1024;
constexpr size_t kSmallRingsBudget = 2 << 20;
constexpr size_t kMinRingBytes = 4096;

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

// Segment layout: header, the ranks' infos, the connection table, one ring arena per rank, the window.
// A ring lives in its producer's arena (its RingCtl in the arena's control page(s), its data page-aligned
// after them) and is carved out the first time that rank writes to the peer; it is then published in the
// connection table at (consumer, producer), where the consumer finds it. The file is sparse and mapped
// without MAP_POPULATE, so a host pays for the rings its ranks use (a pattern that talks to few peers: a
// few MiB per rank), and a rank's resident set holds only the rings it writes or reads. Worst case (every
// rank writes to every other one): per rank kBigRings rings of `ring_bytes` plus at most kSmallRingsBudget.
struct ShmSegment::Layout {
  size_t ranks_off, conn_off, arenas_off, arena_ctl_bytes, arena_bytes, window_off, total;
  int n, big;
  size_t big_cap, small_cap;
  Layout(int n, size_t big_cap, size_t window_bytes = 0) : n(n), big_cap(big_cap) {
    const int peers = n > 1 ? n - 1 : 0;
    big = std::min(peers, kBigRings);
    const size_t rest = static_cast<size_t>(peers - big);
    small_cap = std::min(big_cap, rest == 0 ? kSmallRingBytes
                                            : std::clamp(std::bit_floor(kSmallRingsBudget / rest), kMinRingBytes,
                                                         kSmallRingBytes));
    ranks_off = round_up(sizeof(Header), kPage);
    conn_off = round_up(ranks_off + sizeof(RankInfo) * n, kPage);
    arenas_off = round_up(conn_off + sizeof(uint64_t) * static_cast<size_t>(n) * n, kPage);
    arena_ctl_bytes = round_up(sizeof(RingCtl) * static_cast<size_t>(peers), kPage);
    arena_bytes = arena_ctl_bytes + static_cast<size_t>(big) * big_cap + static_cast<size_t>(peers - big) * small_cap;
    window_off = arenas_off + static_cast<size_t>(n) * arena_bytes;
    total = window_off + round_up(window_bytes, kPage);
  }
  size_t arena(int src) const { return arenas_off + static_cast<size_t>(src) * arena_bytes; }
  // Entry of the ring from `src` to `dst`: 0 while none, else (log2 capacity << 56) | (its index in src's
  // arena << 40) | offset of its data from the start of that arena.
  size_t conn(int dst, int src) const { return conn_off + sizeof(uint64_t) * (static_cast<size_t>(dst) * n + src); }
};

namespace {

// Both rings are attached lazily: the outgoing one is created by the first write, the incoming one is
// looked up (one load of the connection table) until the peer has created it.
class ShmChannel : public Channel {
 public:
  ShmChannel(ShmSegment* seg, int peer) : seg_(seg), peer_(peer) {}

  size_t write_some(const void* data, size_t n) override {
    if (!out_.ctl && !(out_ = seg_->ring_to(peer_)).ctl) return 0;
    RingCtl* ctl = static_cast<RingCtl*>(out_.ctl);
    const size_t cap = out_.cap, mask = cap - 1;
    uint64_t head = ctl->head.load(std::memory_order_relaxed);
    uint64_t tail = ctl->tail.load(std::memory_order_acquire);
    size_t free_bytes = (cap - static_cast<size_t>(head - tail)) & ~static_cast<size_t>(63);
    size_t m = n < free_bytes ? n : free_bytes;
    if (m == 0) return 0;
    size_t off = head & mask;
    size_t first = m < cap - off ? m : cap - off;
    std::memcpy(out_.data + off, data, first);
    if (first < m) std::memcpy(out_.data, static_cast<const uint8_t*>(data) + first, m - first);
    ctl->head.store(head + m, std::memory_order_release);
    seg_->ring(peer_);
    return m;
  }

  size_t read_some(void* data, size_t n) override {
    if (!in_.ctl && !(in_ = seg_->ring_from(peer_)).ctl) return 0;
    RingCtl* ctl = static_cast<RingCtl*>(in_.ctl);
    const size_t cap = in_.cap, mask = cap - 1;
    uint64_t tail = ctl->tail.load(std::memory_order_relaxed);
    uint64_t head = ctl->head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    size_t m = n < avail ? n : avail;
    if (m == 0) return 0;
    size_t off = tail & mask;
    size_t first = m < cap - off ? m : cap - off;
    std::memcpy(data, in_.data + off, first);
    if (first < m) std::memcpy(static_cast<uint8_t*>(data) + first, in_.data, m - first);
    ctl->tail.store(tail + m, std::memory_order_release);
    seg_->ring(peer_);
    return m;
  }

  std::span<const uint8_t> peek() override {
    if (!in_.ctl && !(in_ = seg_->ring_from(peer_)).ctl) return {};
    RingCtl* ctl = static_cast<RingCtl*>(in_.ctl);
    uint64_t tail = ctl->tail.load(std::memory_order_relaxed);
    uint64_t head = ctl->head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(head - tail);
    size_t off = tail & (in_.cap - 1);
    size_t len = avail < in_.cap - off ? avail : in_.cap - off;
    return {in_.data + off, len};
  }

  void consume(size_t n) override {
    if (n == 0) return;
    RingCtl* ctl = static_cast<RingCtl*>(in_.ctl);
    ctl->tail.store(ctl->tail.load(std::memory_order_relaxed) + n, std::memory_order_release);
    seg_->ring(peer_);
  }

  bool is_shm() const override { return true; }
  std::string describe() const override { return "shm"; }

 private:
  ShmSegment* seg_;
  int peer_;
  ShmSegment::Ring out_, in_;
};

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create_or_open(Store& store, const std::string& key, int local_rank,
                                                       int local_size, size_t ring_bytes, double timeout_s,
                                                       size_t window_bytes) {
  const size_t cap = ring_capacity(ring_bytes);
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
    // The file is sparse: only the rings in use take memory. If every rank sent to every other one, it
    // would fill; a /dev/shm smaller than that is worth a warning (a full one is a SIGBUS on first touch).
    struct statvfs fs {};
    if (fstatvfs(fd, &fs) == 0 && static_cast<double>(fs.f_bavail) * fs.f_frsize < static_cast<double>(lay.total))
      log_warn("shared-memory transport: /dev/shm has {} MiB free, less than the {} MiB that {} local ranks "
               "need if every rank sends to every other one (lower TRIDENT_SHM_RING_BYTES or enlarge /dev/shm)",
               static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize >> 20, lay.total >> 20, local_size);
    store.set_string(key, name);
  } else {
    name = store.get_string(key, timeout);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    TRIDENT_SYSCHECK(fd, fmt::format("shm_open({}) published by local rank 0", name));
  }
  // Not populated: the file is sparse and each rank faults in the pages it touches (see Layout).
  void* p = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mmap_errno = errno;
  close(fd);
  if (p == MAP_FAILED) {
    if (local_rank == 0) shm_unlink(name.c_str());
    TRIDENT_THROW(IoError, "mmap of shared-memory segment {} ({} bytes) failed: {}", name, lay.total,
                  detail::errno_string(mmap_errno));
  }
  seg->base_ = static_cast<uint8_t*>(p);
  seg->ranks_ = seg->base_ + lay.ranks_off;
  seg->window_off_ = lay.window_off;
  seg->window_bytes_ = window_bytes;
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

std::unique_ptr<Channel> ShmSegment::channel_to(int peer) { return std::make_unique<ShmChannel>(this, peer); }

ShmSegment::Ring ShmSegment::ring_to(int peer) {
  Layout lay(local_size_, ring_bytes_);
  std::lock_guard<std::mutex> lock(arena_mu_);
  auto& entry = *reinterpret_cast<std::atomic<uint64_t>*>(base_ + lay.conn(peer, local_rank_));
  uint64_t e = entry.load(std::memory_order_acquire);
  if (e == 0) {
    // Rings are never freed and each peer gets at most one: the arena holds them all (see Layout).
    const size_t cap = rings_opened_ < lay.big ? lay.big_cap : lay.small_cap;
    const size_t data_off = lay.arena_ctl_bytes + arena_used_;
    arena_used_ += cap;
    // The pages are fresh (zero): head and tail start at 0. Published with release, read with acquire.
    e = (static_cast<uint64_t>(std::countr_zero(cap)) << 56) | (static_cast<uint64_t>(rings_opened_) << 40) | data_off;
    ++rings_opened_;
    entry.store(e, std::memory_order_release);
  }
  return decode_ring(lay, local_rank_, e);
}

ShmSegment::Ring ShmSegment::ring_from(int peer) {
  Layout lay(local_size_, ring_bytes_);
  auto& entry = *reinterpret_cast<std::atomic<uint64_t>*>(base_ + lay.conn(local_rank_, peer));
  return decode_ring(lay, peer, entry.load(std::memory_order_acquire));
}

ShmSegment::Ring ShmSegment::decode_ring(const Layout& lay, int src, uint64_t e) {
  if (e == 0) return {};
  uint8_t* arena = base_ + lay.arena(src);
  const size_t index = (e >> 40) & 0xffff, data_off = e & ((uint64_t{1} << 40) - 1);
  return {arena + index * sizeof(RingCtl), arena + data_off, size_t{1} << (e >> 56)};
}

size_t ShmSegment::ring_capacity(size_t ring_bytes) {
  size_t cap = 64 * 1024;
  while (cap < ring_bytes) cap <<= 1;
  return cap;
}

std::atomic<uint32_t>& ShmSegment::bell(int local) { return (reinterpret_cast<RankInfo*>(ranks_) + local)->bell; }
std::atomic<uint32_t>& ShmSegment::sleeping(int local) {
  return (reinterpret_cast<RankInfo*>(ranks_) + local)->sleeping;
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

int32_t ShmSegment::pid(int local) const { return (reinterpret_cast<const RankInfo*>(ranks_) + local)->pid; }
uint64_t ShmSegment::starttime(int local) const {
  return (reinterpret_cast<const RankInfo*>(ranks_) + local)->starttime;
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

}  // namespace trident
