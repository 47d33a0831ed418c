#include "trident/comm/transport/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#include <list>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "trident/core/error.h"

namespace trident {
namespace {

struct Live {
  uintptr_t base;
  size_t bytes;
  int fd;
  uint64_t ino, id;
};

uint64_t next_id() {
  static std::atomic<uint64_t> n{(static_cast<uint64_t>(getpid()) << 40) ^ static_cast<uint64_t>(time(nullptr))};
  return ++n;
}

struct PeerMap {
  pid_t pid;
  uint64_t id;
  uint8_t* base;
  size_t bytes;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<Live>& live() {
  static std::vector<Live> v;
  return v;
}
std::list<PeerMap>& peer_maps() {  // most recently used first
  static std::list<PeerMap> l;
  return l;
}

}  // namespace

std::unique_ptr<ShmBuffer> ShmBuffer::allocate(size_t bytes) {
  TRIDENT_CHECK(bytes > 0, InvalidArgument, "ShmBuffer::allocate: size 0; ask for at least one byte");
  const long page = sysconf(_SC_PAGESIZE);
  const size_t mapped = (bytes + page - 1) / page * page;
  int fd = memfd_create("trident-shm-buffer", MFD_CLOEXEC);
  TRIDENT_SYSCHECK(fd, fmt::format("memfd_create for a {}-byte shared buffer", bytes));
  if (ftruncate(fd, static_cast<off_t>(mapped)) < 0) {
    const int e = errno;
    close(fd);
    TRIDENT_THROW(IoError, "ftruncate of a {}-byte shared buffer: {} (is /dev/shm or memory full?)", mapped,
                  detail::errno_string(e));
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(fd);
    TRIDENT_THROW(IoError, "mmap of a {}-byte shared buffer: {}", mapped, detail::errno_string(e));
  }
  struct stat st {};
  fstat(fd, &st);
  std::unique_ptr<ShmBuffer> b(new ShmBuffer());
  b->base_ = p;
  b->bytes_ = mapped;
  b->fd_ = fd;
  b->ino_ = static_cast<uint64_t>(st.st_ino);
  b->id_ = next_id();
  std::lock_guard<std::mutex> lock(mu());
  live().push_back({reinterpret_cast<uintptr_t>(p), mapped, fd, b->ino_, b->id_});
  return b;
}

ShmBuffer::~ShmBuffer() {
  {
    std::lock_guard<std::mutex> lock(mu());
    auto& v = live();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].base == reinterpret_cast<uintptr_t>(base_)) {
        v.erase(v.begin() + static_cast<long>(i));
        break;
      }
  }
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

bool ShmBuffer::lookup(const void* p, size_t n, Registration* out) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu());
  for (const Live& l : live())
    if (a >= l.base && a + n <= l.base + l.bytes) {
      *out = {l.fd, l.ino, l.id, l.bytes, a - l.base};
      return true;
    }
  return false;
}

uint8_t* ShmBuffer::map_peer(pid_t pid, const Registration& r) {
  std::lock_guard<std::mutex> lock(mu());
  auto& maps = peer_maps();
  for (auto it = maps.begin(); it != maps.end(); ++it)
    if (it->pid == pid && it->id == r.id && it->bytes >= r.size) {
      maps.splice(maps.begin(), maps, it);
      return it->base;
    }
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, r.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != r.ino || static_cast<uint64_t>(st.st_size) < r.size) {
    close(fd);  // the descriptor now names another file: the peer freed that buffer
    return nullptr;
  }
  // Not populated: a peer maps the pages it touches (its block of an all-reduce), once per mapping, so its
  // RSS counts those and not the owner's whole buffer (and no page the owner released is filled again).
  void* p = mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  maps.push_front({pid, r.id, static_cast<uint8_t*>(p), r.size});
  while (static_cast<int>(maps.size()) > kPeerMappings) {
    munmap(maps.back().base, maps.back().bytes);
    maps.pop_back();
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace trident
