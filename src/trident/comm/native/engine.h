// Engine: runs the point-to-point traffic of one process group over its channels (shared memory and/or
// TCP): framing, tag matching (in order per peer and tag), unexpected-message buffering, fingerprint
// checks, waiting (spin, then sleep on the doorbell or poll), deadlines, peer liveness and abort.
//
// It implements AlgoContext, so algorithms run on it unchanged. Ownership: owned by one process group.
// Thread-safety: used by one thread at a time (the group's executing thread); abort() and wake() may be
// called from any thread. Every wait has the current collective's deadline; point-to-point calls run
// alongside collectives and each other, each with its own deadline (start_p2p).
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/native/frame.h"
#include "trident/comm/transport/channel.h"
#include "trident/comm/algorithms/shm_window.h"
#include "trident/comm/transport/shm.h"

namespace trident {

class Store;

struct PeerInfo {
  std::string host;
  int32_t pid = 0;
  uint64_t starttime = 0;
  int global_rank = 0;
  bool same_host = false;
};

class Engine final : public AlgoContext {
 public:
  using Clock = std::chrono::steady_clock;

  Engine(std::string group_name, int rank, int size, std::vector<PeerInfo> peers,
         std::vector<std::unique_ptr<Channel>> channels, std::unique_ptr<ShmSegment> shm,
         std::vector<int> local_index, std::shared_ptr<Store> store);
  ~Engine() override;

  // One operation at a time: begin, traffic, end. `seq` is the collective's sequence number.
  void begin(const CollArgs& args, Algo algo, uint64_t seq, Clock::time_point deadline);
  void end();
  // Records a failure (the group is then aborted on this rank) and returns the exception to report.
  std::exception_ptr fail(std::exception_ptr e);
  // Aborts the group on every rank: the record goes to the shared-memory segment and the store, and the
  // TCP connections are shut down, so every rank raises the error it describes.
  void abort(const AbortRecord& record);
  // An AbortRecord of `kind` reported by this rank in the current collective.
  AbortRecord record(AbortRecord::Kind kind, std::string message, int peer = -1, std::vector<int> ranks = {}) const;
  std::exception_ptr failure();

  // AlgoContext
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Request isend(int peer, uint32_t step, const void* data, size_t nbytes) override;
  Request irecv(int peer, uint32_t step, void* data, size_t nbytes) override;
  Request irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                       const void* own = nullptr) override;
  void wait(std::span<const Request> reqs) override;
  void* scratch(size_t nbytes, int slot) override;
  size_t chunk_bytes() const override { return chunk_bytes_; }  // TRIDENT_CHUNK_BYTES (0: by size)
  int host_of(int r) const override { return host_index_[r]; }  // from the peers' host identities
  ShmWindow* shm_window() override;  // shared-memory fast path (algorithms/shm_window.h), defined in engine.cc
  using AlgoContext::wait;

  // ---- point-to-point calls (user tags, outside the collective sequence), independent of each other ----
  // A send or receive is started here (a send's bytes begin to move at once) and then progressed by every
  // later progress of this engine: a collective's waits and idle_wait(). So a receive whose message has not
  // arrived holds back nothing but itself: a send started after it, to any peer, proceeds, and collectives
  // run while it is pending. Order: sends to one peer leave in start order (one stream per peer, shared
  // with collective messages); receives from one peer with one tag match that peer's sends with that tag in
  // order (MPI's non-overtaking rule). Each call has its own deadline. Returns a handle for p2p_done().
  // Throws the group's failure (the call is then not started).
  // A receive whose peer is kAnySource matches the first message with its tag from any rank (the earliest
  // arrived among those already here); it and the receives naming a peer are matched in posting order, and
  // per peer and tag still in sending order. p2p_source() names the rank it came from once done.
  static constexpr int kAnySource = -1;
  int start_p2p(const CollArgs& a, Clock::time_point deadline);
  bool p2p_done(int handle) const;
  int p2p_source(int handle) const;  // a done receive: the rank its message came from
  void release_p2p(int handle);  // a done call, or one abandoned after the group failed
  int p2p_pending() const { return p2p_pending_; }
  // With no collective running: progresses every peer and, when nothing moves, sleeps until a message
  // arrives, a peer makes room, wake() is called or 50 ms pass. Raises a failure (dead peer, mismatch) and
  // the expiry of a pending call's deadline (the group is then aborted, as for a collective).
  void idle_wait();
  // Raises the expiry of a pending point-to-point call whose deadline passed.
  void check_p2p_deadlines();
  // Makes a current or the next idle_wait() return (any thread).
  void wake();

  bool uses_tcp() const { return has_tcp_; }
  // The group has a shared-memory window (every rank on this host, no TCP peer): what the shm and cma
  // algorithms need; without it they fall back to message-passing algorithms, so the cost model skips them.
  bool has_shm_window() const;
  bool uses_shm() const { return has_shm_; }
  // Active peers reached over shared memory (shm = true) or over TCP.
  int peer_count(bool shm) const;
  // Per-peer transfer counters and the recent collectives' times (ProcessGroup::traffic). Any thread.
  GroupTraffic traffic() const;

 private:
  struct Req;
  struct Peer;
  struct Unexpected;
  // `slot` >= 0: the point-to-point call in that slot of p2p_ (its header from p2p_calls_[slot].args);
  // else a request of the current collective (in reqs_).
  Request post_send(int peer, uint8_t kind, uint32_t step, uint32_t tag, const void* data, size_t nbytes,
                    int slot = -1);
  Request post_recv(int peer, uint8_t kind, uint32_t step, uint32_t tag, void* dst, size_t nbytes, bool reduce,
                    DType dtype, ReduceOp op, const void* own = nullptr, int slot = -1);
  // Request ids: a collective's index in reqs_ (cleared by every begin()), or kP2PBit | its slot in p2p_
  // (point-to-point calls outlive collectives).
  static constexpr int kP2PBit = 1 << 30;
  Req& req(int id);
  // What this rank was doing with `peer` (for errors): the collective, else its pending point-to-point call.
  std::string activity(int peer) const;
  [[noreturn]] void raise_p2p_timeout(int slot);
  bool progress_all();
  std::vector<pollfd>& tcp_pollfds();
  std::vector<pollfd> pollfds_;
  bool waiting_on(int peer) const;
  // Progresses one peer; a broken channel is explained (dead peer, abort) and thrown, or, when this rank
  // does not need that peer, the channel is retired (returns -1).
  int progress_peer(int peer, bool tx, bool rx);
  bool progress_tx(int peer);
  bool progress_rx(int peer);
  void on_header(int peer);
  int store_request(const Req& r, int slot);
  bool matches(const Req& r, const MsgHeader& h) const;
  Request post_any_recv(uint32_t tag, void* dst, size_t nbytes, int slot);
  int take_match(int peer, const MsgHeader& h);
  void deliver_unexpected(Req& r, Unexpected& u);
  // Before the payload of an early message (no receive posted when its header arrived) is read: a
  // receive posted since takes it directly; else it is read into a buffer, or left in the channel (false).
  bool start_early_payload(int peer);
  // Payload buffers for early arrivals: delivered ones are kept (up to kSpareBytes) and reused, so an
  // early message lands in memory that is already faulted in.
  std::unique_ptr<uint8_t[]> take_buffer(size_t nbytes, size_t* capacity);
  void give_buffer(std::unique_ptr<uint8_t[]> buf, size_t capacity);
  void check_fingerprint(int peer, const MsgHeader& h);
  void check_size(const Req& r, const MsgHeader& h, int peer);
  void block_once(Clock::time_point deadline);
  void periodic_checks();
  [[noreturn]] void raise_timeout(std::span<const Request> reqs);
  // The ranks a timeout names: `missing` (whom this rank waited for), or across hosts the ranks at the end
  // of the timed-out ranks' pooled wait-for edges (engine.cc); `how` gets the chain when they differ.
  std::vector<int> pooled_cause(const std::vector<int>& missing, std::string* how);
  // " (on host H)" or " (on hosts H1, H2)": where `ranks` (group ranks) run, by their host identity
  // (TRIDENT_HOST_ID or the hostname), when the group spans several hosts; "" on one host. On a cluster the
  // host is what an operator checks first (its link, its power).
  std::string on_hosts(const std::vector<int>& ranks) const;
  [[noreturn]] void raise_abort_from_peer(int peer, const std::string& channel_error);
  // Aborts the group with `r` and throws it here (the same error every other rank raises).
  [[noreturn]] void fail_group(const AbortRecord& r);
  // Throws the record another rank left (in the segment or the store).
  [[noreturn]] void raise_recorded(AbortRecord r);
  // The record an aborting rank left in the store, waiting up to wait_s for it (0: only one already there).
  std::optional<AbortRecord> stored_abort(double wait_s);
  std::string who(int r) const;
  std::string describe_header(const MsgHeader& h) const;

  static constexpr size_t kSpareBytes = size_t{64} << 20;
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> spare_;  // capacity -> buffer
  size_t spare_bytes_ = 0;

  std::string name_;
  int rank_, size_;
  std::vector<PeerInfo> peers_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::unique_ptr<ShmSegment> shm_;
  std::unique_ptr<ShmWindow> window_;  // over shm_'s window region (destroyed before it)
  std::vector<int> local_index_;  // group rank -> index in the shm segment (-1: not local)
  std::vector<int> host_index_;   // group rank -> host number (by first appearance of its host identity)
  std::shared_ptr<Store> store_;
  bool has_tcp_ = false, has_shm_ = false;
  std::vector<int> active_peers_;
  std::vector<int> closed_;                  // peers whose connection closed while not needed
  std::vector<std::string> closed_reason_;

  std::vector<std::unique_ptr<Peer>> peer_state_;
  std::vector<Req> reqs_;
  // ---- point-to-point calls: slots reused through p2p_free_ ----
  struct P2PCall {
    CollArgs args;
    Clock::time_point deadline;
    bool used = false;
  };
  std::vector<Req> p2p_;
  std::vector<P2PCall> p2p_calls_;
  std::vector<int> p2p_free_;
  int p2p_pending_ = 0;                       // slots in use
  std::vector<int> any_posted_;               // any-source receives not yet matched, in posting order
  uint64_t post_order_ = 0;                   // numbers receives as posted (Req::order)
  uint64_t arrivals_ = 0;                     // numbers early messages as they arrive (Unexpected::arrival)
  int wake_fd_ = -1;                          // eventfd: wake() interrupts idle_wait's poll
  std::atomic<bool> wake_{false};             // wake() was called since idle_wait last returned
  bool idle_ = false;                         // in idle_wait (block_once polls wake_fd_, checks wake_)
  Clock::time_point idle_check_ = Clock::time_point::max();  // idle_wait's next periodic check
  // ---- end point-to-point calls ----
  CollArgs args_;
  Algo algo_ = Algo::kAuto;
  uint64_t fp_count_ = 0;
  uint64_t seq_ = 0;
  bool in_collective_ = false;
  uint64_t last_done_seq_ = 0;
  CollArgs last_done_args_;  // the collective of last_done_seq_ (named when a peer's call differs)
  Algo last_done_algo_ = Algo::kAuto;
  bool any_done_ = false;
  Clock::time_point deadline_;
  Clock::time_point next_check_;
  int spin_limit_ = 2000;
  int wait_kinds_ = 0;  // of the requests being waited: 1 = some on a TCP peer, 2 = some on a shm peer
  size_t chunk_bytes_ = 0;

  // ---- transfer counters (traffic()): written by the executing thread without a locked instruction,
  // read from any thread. Timing costs two coarse clock reads per collective and two precise ones per
  // message of at least PeerTraffic::kTimedBytes; smaller messages are only counted. ----
  struct Counters {
    std::atomic<uint64_t> tx_bytes{0}, rx_bytes{0}, rx_timed_bytes{0}, rx_busy_ns{0}, rx_wait_ns{0};
  };
  static void bump(std::atomic<uint64_t>& c, uint64_t v) {
    c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  std::unique_ptr<Counters[]> counters_;
  struct RecentSlot {
    std::atomic<uint64_t> seq{0}, ns{0};
  };
  RecentSlot recent_[GroupTraffic::kRecent];
  std::atomic<uint64_t> collectives_{0};
  uint64_t coll_t0_ns_ = 0;  // coarse clock at begin() of the current collective
  // ---- end transfer counters ----

  std::vector<std::vector<uint8_t>> scratch_;
  std::mutex fail_mu_;
  std::exception_ptr failure_;
  std::atomic<bool> has_failure_{false};  // failure_ is set (read without fail_mu_ on every call)
  std::atomic<bool> aborted_{false};
};

}  // namespace trident
