// ShmBuffer: memory that trident allocates in a shared mapping (a memfd) so that the other ranks on this
// host can map it too, and registered collectives (algorithms/shm_cma.cc) then read and write it in place
// with ordinary loads and stores: no copy through a window, no kernel copy. A gradient bucket, an
// all-gather output, any buffer that is reused across collectives, can live in one.
//
// Ownership: the ShmBuffer owns its mapping and descriptor; destroying it unmaps it here. A peer that
// mapped it keeps its own mapping (and so the memory) until that peer's cache drops it (at most
// kPeerMappings per process, least recently used first) or the peer exits.
// Blocking: allocate() faults every page in (MAP_POPULATE) so that no collective pays for first touches;
// a peer's mapping (map_peer) is not populated: it maps the pages it touches, once (minor faults).
// Memory: the pages are shared, but each process's RSS counts the pages it has mapped (the kernel's PSS and
// cgroup accounting count them once): a rank's RSS includes the parts of its peers' buffers it touched.
// Thread-safety: allocate, lookup and map_peer may be called from any thread (one mutex).
// Timeouts: none (local system calls).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trident/comm/process_group.h"

namespace trident {

class ShmBuffer : public RegisteredBuffer {
 public:
  // Throws NetworkError (naming the size and errno) when memfd_create/ftruncate/mmap fail.
  static std::unique_ptr<ShmBuffer> allocate(size_t bytes);
  ~ShmBuffer() override;
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  void* data() const override { return base_; }
  size_t size() const override { return bytes_; }

  // Where [p, p + n) lies, if inside a live ShmBuffer of this process: its descriptor, its inode, a
  // number no other buffer of this process had (inodes are reused), the buffer's size and p's offset in it.
  struct Registration {
    int fd = -1;
    uint64_t ino = 0;
    uint64_t id = 0;
    uint64_t size = 0;
    uint64_t offset = 0;
  };
  static bool lookup(const void* p, size_t n, Registration* out);

  // Maps the buffer `r` of process `pid` (same user; through /proc/<pid>/fd) read-write into this
  // process, cached by (pid, id). Returns its base address, or nullptr if it cannot be mapped (the
  // descriptor is gone or is another file now, /proc is not readable): callers then take another path.
  static uint8_t* map_peer(pid_t pid, const Registration& r);
  static constexpr int kPeerMappings = 32;

 private:
  ShmBuffer() = default;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  uint64_t ino_ = 0, id_ = 0;
};

}  // namespace trident
