// Shared-memory transport: one segment per (process group, host) holding a doorbell (futex word) per rank,
// each rank's pid for liveness checks, an abort flag with its reason, and single-producer single-consumer
// rings created on first use: a rank's first write to a peer carves that ring out of its own arena and
// publishes it in a connection table, where the peer finds it. The segment is sparse and not prefaulted:
// the host's memory grows with the rings in use (linearly in the ranks for patterns that talk to few
// peers; at most kBigRings large rings plus small ones per rank), not with every ordered pair.
//
// Waiting: a rank that finds nothing to do spins briefly, then sleeps on its doorbell futex; a writer or a
// reader that frees space rings the doorbell of the other side only when that side is asleep (no syscall
// on the fast path). Thread-safety: a ring has exactly one producer and one consumer thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trident/comm/transport/abort.h"
#include "trident/comm/transport/channel.h"
#include "trident/comm/types.h"

namespace trident {

class Store;

class ShmSegment {
 public:
  // Collective over the local members: `local_rank` of `local_size`; the first creates the segment and
  // publishes its name in `store` under `key`, the others open it, then it is unlinked (nothing leaks
  // when a process dies).
  static std::unique_ptr<ShmSegment> create_or_open(Store& store, const std::string& key, int local_rank,
                                                    int local_size, size_t ring_bytes, double timeout_s,
                                                    size_t window_bytes = 0);
  // `window_bytes`: a region of that many bytes after the rings, zeroed, for the collective layer's window
  // (comm/algorithms/shm_window.h lays it out); 0: none.
  ~ShmSegment();

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  size_t ring_bytes() const { return ring_bytes_; }  // capacity of a rank's large rings (its first peers')

  // The channel to a local peer. Its rings exist once used: the outgoing one from its first write, the
  // incoming one once the peer wrote (until then reads find nothing).
  std::unique_ptr<Channel> channel_to(int peer_local);
  // A ring's control block (RingCtl in shm.cc), data and capacity (a power of two); ctl == nullptr: none yet.
  struct Ring {
    void* ctl = nullptr;
    uint8_t* data = nullptr;
    size_t cap = 0;
  };
  Ring ring_to(int peer_local);    // this rank's ring to the peer, created (and published) when missing
  Ring ring_from(int peer_local);  // the peer's ring to this rank, or none while the peer has not written
  // The window region (`window_bytes` at create_or_open; nullptr when 0). Its layout belongs to its user.
  uint8_t* window_region() { return window_bytes_ ? base_ + window_off_ : nullptr; }
  size_t window_bytes() const { return window_bytes_; }

  // Doorbell of this rank.
  std::atomic<uint32_t>& bell(int local);
  std::atomic<uint32_t>& sleeping(int local);
  void ring(int local);  // wakes `local` if it is asleep
  // Sleeps until the bell moves from `seen` or timeout_ms passes.
  void sleep_on_bell(uint32_t seen, int timeout_ms);

  // Abort: first caller wins; its record is readable by all local ranks.
  void set_abort(const AbortRecord& record);
  bool aborted() const;
  AbortRecord abort_record() const;
  void wake_all();

  // pid/starttime of each local rank, published at open.
  int32_t pid(int local) const;
  uint64_t starttime(int local) const;

  struct Layout;

 private:
  ShmSegment() = default;
  Ring decode_ring(const Layout& lay, int src, uint64_t entry);
  static size_t ring_capacity(size_t ring_bytes);  // a power of two, at least 64 KiB
  uint8_t* base_ = nullptr;
  uint8_t* ranks_ = nullptr;  // the ranks' infos (doorbells, pids) in the segment
  size_t bytes_ = 0;
  int local_rank_ = 0;
  int local_size_ = 0;
  size_t ring_bytes_ = 0;
  size_t window_off_ = 0;
  size_t window_bytes_ = 0;
  std::mutex arena_mu_;     // this rank's arena: rings it created so far
  size_t arena_used_ = 0;
  int rings_opened_ = 0;
};


// /proc/<pid>/stat: whether pid is alive (not a zombie) with the given start time (0 = any).
bool process_alive(int32_t pid, uint64_t starttime);
uint64_t process_starttime(int32_t pid);

}  // namespace trident
