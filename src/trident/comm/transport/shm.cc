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

struct ShmSegment::Layout {
  size_t ranks_off, rings_ctl_off, data_off, window_off, total;
  int n;
  size_t ring_bytes;
  Layout(int n, size_t ring_bytes, size_t window_bytes = 0) : n(n), ring_bytes(ring_bytes) {
    ranks_off = round_up(sizeof(Header), kPage);
    rings_ctl_off = round_up(ranks_off + sizeof(RankInfo) * n, kPage);
    size_t pairs = static_cast<size_t>(n) * (n > 1 ? n - 1 : 0);
    data_off = round_up(rings_ctl_off + sizeof(RingCtl) * pairs, kPage);
    window_off = data_off + pairs * ring_bytes;
    total = window_off + round_up(window_bytes, kPage);
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

}  // namespace trident
