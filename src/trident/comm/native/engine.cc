#include "trident/comm/native/engine.h"

#include <linux/futex.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>

#include <fmt/ranges.h>

#include "trident/comm/reduce.h"
#include "trident/comm/store/store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {

namespace {
inline size_t round64(size_t n) { return (n + 63) & ~static_cast<size_t>(63); }
// CLOCK_MONOTONIC_COARSE: the last timer tick, a vDSO read without the TSC (collective times for the
// straggler check need milliseconds, not nanoseconds).
inline uint64_t coarse_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ULL + static_cast<uint64_t>(t.tv_nsec);
}
inline uint64_t precise_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

struct Engine::Req {
  bool is_send = false;
  bool done = false;
  int peer = -1;
  uint8_t kind = kKindColl;
  uint32_t step = 0;
  uint32_t tag = 0;
  // send
  const uint8_t* src = nullptr;
  MsgHeader hdr{};
  size_t off = 0;  // bytes of the frame written
  // recv
  uint8_t* dst = nullptr;
  size_t nbytes = 0;
  bool reduce = false;
  const uint8_t* own = nullptr;  // reduce: dst = own op incoming (else dst = dst op incoming)
  DType dtype = DType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  uint64_t posted_ns = 0;     // coarse clock when a timed receive was posted without its message (0: not waiting)
  uint64_t empty_mark = 0;    // the peer's empty_reads when it was posted
  uint64_t order = 0;         // point-to-point receives: posting order (a named and an any-source one compete)
  bool any_source = false;    // a point-to-point receive from any rank: `peer` is set when a message matches
};

struct Engine::Unexpected {
  MsgHeader hdr;
  uint64_t arrival = 0;             // order of arrival across peers (an any-source receive takes the earliest)
  std::unique_ptr<uint8_t[]> data;  // >= h.nbytes, not zero-filled; null until the payload is read
  size_t capacity = 0;              // of data
  bool complete = false;
};

struct Engine::Peer {
  std::deque<int> sendq;
  std::vector<int> posted;  // recv requests in posting order
  std::deque<std::unique_ptr<Unexpected>> unexpected;
  enum { kHeader, kPayload, kPad } rx = kHeader;
  uint8_t hdr_buf[64];
  size_t hdr_got = 0;
  MsgHeader cur{};
  int cur_req = -1;
  Unexpected* cur_unexp = nullptr;
  size_t got = 0;
  size_t pad_left = 0;
  uint64_t rx_t0_ns = 0;     // the current message's payload started (precise clock; 0: not timed)
  uint64_t empty_reads = 0;  // reads that found no header: a receive posted before one waited for its message
};

Engine::Engine(std::string group_name, int rank, int size, std::vector<PeerInfo> peers,
               std::vector<std::unique_ptr<Channel>> channels, std::unique_ptr<ShmSegment> shm,
               std::vector<int> local_index, std::shared_ptr<Store> store)
    : name_(std::move(group_name)), rank_(rank), size_(size), peers_(std::move(peers)),
      channels_(std::move(channels)), shm_(std::move(shm)), local_index_(std::move(local_index)),
      store_(std::move(store)) {
  if (shm_ && shm_->window_region()) window_ = std::make_unique<ShmWindow>(shm_.get());
  peer_state_.resize(size_);
  closed_reason_.resize(size_);
  for (int i = 0; i < size_; ++i) {
    int h = 0;
    while (h < i && peers_[h].host != peers_[i].host) ++h;
    host_index_.push_back(h == i ? (i == 0 ? 0 : 1 + *std::max_element(host_index_.begin(), host_index_.end()))
                                 : host_index_[h]);
  }
  for (int i = 0; i < size_; ++i) {
    peer_state_[i] = std::make_unique<Peer>();
    if (i != rank_ && channels_[i]) {
      active_peers_.push_back(i);
      if (channels_[i]->is_shm()) has_shm_ = true;
      else has_tcp_ = true;
    }
  }
  // Oversubscribed hosts (more local ranks than cores): spin less before sleeping. With TCP peers only,
  // hardly at all: each spin step is a recv() per peer, and the peer being waited for may need this core to
  // send (8 TCP ranks on 2 cores: half of the CPU went to recv() returning EAGAIN); poll() sleeps on every
  // socket at once.
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int local = 0;
  for (auto& p : peers_) local += p.same_host ? 1 : 0;
  // Emulated hosts (TRIDENT_HOST_ID: namespaces or fake hosts) are one machine: every rank shares its cores.
  if (!env::host_id().empty()) local = size_;
  spin_limit_ = env::short_spin(static_cast<unsigned>(local) > cores) ? (has_shm_ ? 64 : 2) : 4000;
  reqs_.reserve(64);
  chunk_bytes_ = static_cast<size_t>(env::chunk_bytes());
  counters_ = std::make_unique<Counters[]>(static_cast<size_t>(size_));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // -1: idle_wait's poll is woken by its 50 ms cap only
}

GroupTraffic Engine::traffic() const {
  GroupTraffic t;
  t.peers.resize(size_);
  for (int i = 0; i < size_; ++i) {
    PeerTraffic& p = t.peers[i];
    const Counters& c = counters_[i];
    p.global_rank = peers_[i].global_rank;
    p.host = peers_[i].host;
    p.tcp = i != rank_ && channels_[i] && !channels_[i]->is_shm();
    p.tx_bytes = c.tx_bytes.load(std::memory_order_relaxed);
    p.rx_bytes = c.rx_bytes.load(std::memory_order_relaxed);
    p.rx_timed_bytes = c.rx_timed_bytes.load(std::memory_order_relaxed);
    p.rx_busy_ns = c.rx_busy_ns.load(std::memory_order_relaxed);
    p.rx_wait_ns = c.rx_wait_ns.load(std::memory_order_relaxed);
    if (p.tcp) {
      // The kernel's busy time has the timer tick's resolution (a few ms): summed over a step's transfers
      // it is unbiased. Fields of kernels before 4.10 read zero (the size returned says which were filled).
      tcp_info ti{};
      socklen_t len = sizeof(ti);
      const int fd = channels_[i]->fd();
      if (fd >= 0 && ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
          len >= offsetof(tcp_info, tcpi_rwnd_limited) + sizeof(ti.tcpi_rwnd_limited)) {
        p.tx_acked_bytes = ti.tcpi_bytes_acked;
        const uint64_t busy_us = ti.tcpi_busy_time > ti.tcpi_rwnd_limited ? ti.tcpi_busy_time - ti.tcpi_rwnd_limited : 0;
        p.tx_busy_ns = busy_us * 1000;
      }
    }
  }
  t.collectives = collectives_.load(std::memory_order_acquire);
  for (const RecentSlot& slot : recent_) {
    // A slot being rewritten reads seq 0 or a different seq the second time: skipped.
    const uint64_t seq = slot.seq.load(std::memory_order_acquire);
    const uint64_t ns = slot.ns.load(std::memory_order_acquire);
    if (seq != 0 && slot.seq.load(std::memory_order_acquire) == seq) t.recent.push_back({seq, ns});
  }
  std::sort(t.recent.begin(), t.recent.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  return t;
}

Engine::~Engine() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

int Engine::peer_count(bool shm) const {
  int n = 0;
  for (int i : active_peers_) n += channels_[i]->is_shm() == shm ? 1 : 0;
  return n;
}

std::string Engine::who(int r) const {
  const auto& p = peers_[r];
  if (p.global_rank != r) return fmt::format("rank {} (global rank {}, pid {} on {})", r, p.global_rank, p.pid, p.host);
  return fmt::format("rank {} (pid {} on {})", r, p.pid, p.host);
}

std::exception_ptr Engine::failure() {
  if (!has_failure_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(fail_mu_);
  return failure_;
}

std::exception_ptr Engine::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(fail_mu_);
  if (!failure_) failure_ = e;
  has_failure_.store(true, std::memory_order_release);
  return failure_;
}

AbortRecord Engine::record(AbortRecord::Kind kind, std::string message, int peer, std::vector<int> ranks) const {
  AbortRecord r;
  r.kind = kind;
  r.reporter = rank_;
  r.peer = peer;
  r.ranks = std::move(ranks);
  if (in_collective_ || collective_info(args_.op).point_to_point) {
    r.op = op_name(args_.op);
    r.seq = static_cast<long>(seq_);
  }
  r.message = std::move(message);
  return r;
}

void Engine::abort(const AbortRecord& record) {
  if (aborted_.exchange(true)) return;
  const std::string encoded = record.encode();
  if (shm_) shm_->set_abort(record);
  if (store_) {
    try {
      store_->compare_set("abort", Bytes{}, Bytes(encoded.begin(), encoded.end()));
    } catch (const std::exception&) {
      // The store may be gone with the process that hosted it; peers still see the sockets close.
    }
  }
  for (int i : active_peers_)
    if (!channels_[i]->is_shm()) channels_[i]->shutdown();
}

void Engine::fail_group(const AbortRecord& r) {
  abort(r);
  r.raise(rank_);
}

std::optional<AbortRecord> Engine::stored_abort(double wait_s) {
  if (!store_) return std::nullopt;
  try {
    if (wait_s <= 0 && !store_->check({"abort"})) return std::nullopt;
    Bytes b = store_->get("abort", Seconds(wait_s > 0 ? wait_s : 1.0));
    return AbortRecord::decode(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  } catch (const std::exception&) {
    return std::nullopt;  // none within the wait, or the store is gone with the process that hosted it
  }
}

void Engine::raise_recorded(AbortRecord r) {
  if (r.op.empty() && in_collective_) {  // a record without a collective (e.g. an abort() call): ours
    r.op = op_name(args_.op);
    r.seq = static_cast<long>(seq_);
  }
  r.raise(rank_);
}

void Engine::begin(const CollArgs& args, Algo algo, uint64_t seq, Clock::time_point deadline) {
  if (auto f = failure()) std::rethrow_exception(f);
  if (shm_ && shm_->aborted()) raise_recorded(shm_->abort_record());
  args_ = args;
  algo_ = algo;
  // The fingerprint's count: all_gatherv's per-rank counts differ by design; their total must agree.
  fp_count_ = args.count;
  if (args.op == OpKind::kAllGatherV && args.counts) {
    fp_count_ = 0;
    for (size_t c : *args.counts) fp_count_ += c;
  }
  deadline_ = deadline;
  next_check_ = Clock::time_point::max();  // armed when this call first blocks (wait): no clock read here
  reqs_.clear();
  in_collective_ = args.op != OpKind::kSend && args.op != OpKind::kRecv;
  if (in_collective_) {
    seq_ = seq;
    coll_t0_ns_ = coarse_ns();
    // Messages of this collective that arrived early: check them now, before any data is used.
    for (int p : active_peers_)
      for (auto& u : peer_state_[p]->unexpected)
        if (u->hdr.kind == kKindColl && u->hdr.seq == seq_) check_fingerprint(p, u->hdr);
  }
}

void Engine::end() {
  for (auto& r : reqs_)
    if (!r.done)
      TRIDENT_THROW(Error, "internal: {} #{} in group '{}' returned with a request to rank {} still pending",
                    describe(args_), seq_, name_, r.peer);
  if (in_collective_) {
    RecentSlot& slot = recent_[seq_ % GroupTraffic::kRecent];
    slot.seq.store(0, std::memory_order_release);
    slot.ns.store(coarse_ns() - coll_t0_ns_, std::memory_order_release);
    slot.seq.store(seq_, std::memory_order_release);
    collectives_.store(collectives_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    last_done_seq_ = seq_;
    last_done_args_ = args_;
    last_done_args_.count = fp_count_;
    last_done_algo_ = algo_;
    any_done_ = true;
  }
  in_collective_ = false;
  reqs_.clear();
}

std::string Engine::describe_header(const MsgHeader& h) const { return describe_frame_header(h); }

void Engine::check_fingerprint(int peer, const MsgHeader& h) {
  bool same = h.op == static_cast<uint8_t>(args_.op) && h.dtype == static_cast<uint8_t>(args_.dtype) &&
              h.count == fp_count_ && h.algo == static_cast<uint8_t>(algo_);
  const CollectiveInfo& info = collective_info(args_.op);
  if (info.rooted) same = same && h.root == args_.root;
  if (info.reduces) same = same && h.redop == static_cast<uint8_t>(args_.redop);
  if (same) return;
  CollArgs shown = args_;
  shown.count = fp_count_;
  std::string mine = fmt::format("{} [algorithm {}]", describe(shown), algo_name(algo_));
  std::string msg = fmt::format(
      "collective mismatch in group '{}' at sequence number {}: {} issued {} but {} issued {}; every rank must "
      "issue the same collectives in the same order with the same count, dtype, op and root",
      name_, seq_, who(rank_), mine, who(peer), describe_header(h));
  fail_group(record(AbortRecord::Kind::kMismatch, msg, peer));
}

void Engine::check_size(const Req& r, const MsgHeader& h, int peer) {
  if (h.nbytes == r.nbytes) return;
  std::string msg;
  if (r.kind == kKindP2P)
    msg = fmt::format("recv of {} bytes with tag {} from {} in group '{}' matched a send of {} bytes: sizes differ",
                      r.nbytes, r.tag, who(peer), name_, h.nbytes);
  else
    msg = fmt::format("collective mismatch in group '{}' at sequence number {}: {} expected {} bytes at step {} of {} "
                      "but {} sent {} bytes for {}",
                      name_, seq_, who(rank_), r.nbytes, r.step, describe(args_), who(peer), h.nbytes,
                      describe_header(h));
  fail_group(record(AbortRecord::Kind::kMismatch, msg, peer));
}

Request Engine::post_send(int peer, uint8_t kind, uint32_t step, uint32_t tag, const void* data, size_t nbytes,
                          int slot) {
  if (peer < 0 || peer >= size_ || peer == rank_ || !channels_[peer])
    TRIDENT_THROW(InvalidArgument, "internal: send to rank {} which has no channel from rank {} in group '{}'", peer,
                  rank_, name_);
  if (!closed_reason_[peer].empty()) raise_abort_from_peer(peer, closed_reason_[peer]);
  Req r;
  r.is_send = true;
  r.peer = peer;
  r.kind = kind;
  r.step = step;
  r.tag = tag;
  r.src = static_cast<const uint8_t*>(data);
  r.nbytes = nbytes;
  MsgHeader& h = r.hdr;
  std::memset(&h, 0, sizeof h);
  const CollArgs& a = slot >= 0 ? p2p_calls_[slot].args : args_;
  h.magic = kMsgMagic;
  h.kind = kind;
  h.op = static_cast<uint8_t>(a.op);
  h.dtype = static_cast<uint8_t>(a.dtype);
  h.redop = static_cast<uint8_t>(a.redop);
  h.algo = static_cast<uint8_t>(slot >= 0 ? Algo::kAuto : algo_);
  h.root = a.root;
  h.step = step;
  h.tag = tag;
  h.src = rank_;
  h.seq = kind == kKindColl ? seq_ : 0;
  h.count = slot >= 0 ? a.count : fp_count_;
  h.nbytes = nbytes;
  const int id = store_request(r, slot);
  peer_state_[peer]->sendq.push_back(id);
  progress_peer(peer, true, false);
  return Request{id};
}

// Keeps request r: in point-to-point slot `slot` (id with kP2PBit) or, when slot < 0, in this call's list.
int Engine::store_request(const Req& r, int slot) {
  if (slot >= 0) {
    p2p_[slot] = r;
    return kP2PBit | slot;
  }
  reqs_.push_back(r);
  return static_cast<int>(reqs_.size()) - 1;
}

// Whether message h (from the request's peer) is what receive r waits for: a collective message of this
// call's sequence number and step, or a point-to-point message with r's tag.
bool Engine::matches(const Req& r, const MsgHeader& h) const {
  return r.kind == h.kind && (h.kind == kKindColl ? (h.seq == seq_ && h.step == r.step) : h.tag == r.tag);
}

Request Engine::post_recv(int peer, uint8_t kind, uint32_t step, uint32_t tag, void* dst, size_t nbytes, bool reduce,
                          DType dtype, ReduceOp op, const void* own, int slot) {
  if (peer == kAnySource && kind == kKindP2P && slot >= 0) return post_any_recv(tag, dst, nbytes, slot);
  if (peer < 0 || peer >= size_ || peer == rank_ || !channels_[peer])
    TRIDENT_THROW(InvalidArgument, "internal: recv from rank {} which has no channel to rank {} in group '{}'", peer,
                  rank_, name_);
  if (!closed_reason_[peer].empty() && peer_state_[peer]->unexpected.empty())
    raise_abort_from_peer(peer, closed_reason_[peer]);
  Req r;
  r.peer = peer;
  r.kind = kind;
  r.step = step;
  r.tag = tag;
  r.dst = static_cast<uint8_t*>(dst);
  r.nbytes = nbytes;
  r.reduce = reduce;
  r.own = static_cast<const uint8_t*>(own);
  r.dtype = dtype;
  r.op = op;
  r.order = ++post_order_;
  const int id = store_request(r, slot);
  Peer& ps = *peer_state_[peer];
  // An early arrival? Match in order.
  for (auto it = ps.unexpected.begin(); it != ps.unexpected.end(); ++it) {
    Unexpected& u = **it;
    if (!matches(req(id), u.hdr)) continue;
    if (!u.complete) break;  // still arriving: it will be delivered from the unexpected buffer when done
    deliver_unexpected(req(id), u);
    ps.unexpected.erase(it);
    return Request{id};
  }
  if (nbytes >= PeerTraffic::kTimedBytes) {
    req(id).posted_ns = coarse_ns();
    req(id).empty_mark = ps.empty_reads;
  }
  ps.posted.push_back(id);
  return Request{id};
}

// A receive from any rank: the earliest-arrived complete message with its tag that no earlier receive is
// owed (per peer, only the first early message with a key may be taken), else it waits in any_posted_
// and competes, by posting order, with the receives that name the peer (take_match).
Request Engine::post_any_recv(uint32_t tag, void* dst, size_t nbytes, int slot) {
  Req r;
  r.peer = kAnySource;
  r.any_source = true;
  r.kind = kKindP2P;
  r.tag = tag;
  r.dst = static_cast<uint8_t*>(dst);
  r.nbytes = nbytes;
  r.order = ++post_order_;
  const int id = store_request(r, slot);
  int best_peer = -1;
  Unexpected* best = nullptr;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    for (auto& u : peer_state_[p]->unexpected) {
      if (!matches(req(id), u->hdr)) continue;
      if (u->complete && (!best || u->arrival < best->arrival)) best = u.get(), best_peer = p;
      break;  // later messages with this key from p are owed to this one's receiver first
    }
  }
  if (best) {
    Req& q = req(id);
    q.peer = best_peer;
    deliver_unexpected(q, *best);
    auto& un = peer_state_[best_peer]->unexpected;
    for (auto it = un.begin(); it != un.end(); ++it)
      if (it->get() == best) {
        un.erase(it);
        break;
      }
    return Request{id};
  }
  any_posted_.push_back(id);
  return Request{id};
}

// The receive that message h from `peer` completes, taken off its list (-1: none): the first matching
// receive that names the peer or, for a point-to-point message, the first matching any-source receive,
// whichever was posted first. An any-source receive learns its peer here.
int Engine::take_match(int peer, const MsgHeader& h) {
  Peer& ps = *peer_state_[peer];
  size_t named = ps.posted.size();
  for (size_t i = 0; i < ps.posted.size(); ++i)
    if (matches(req(ps.posted[i]), h)) {
      named = i;
      break;
    }
  size_t any = any_posted_.size();
  if (h.kind == kKindP2P)
    for (size_t i = 0; i < any_posted_.size(); ++i)
      if (matches(req(any_posted_[i]), h)) {
        any = i;
        break;
      }
  const bool use_any = any < any_posted_.size() &&
                       (named == ps.posted.size() || req(any_posted_[any]).order < req(ps.posted[named]).order);
  if (use_any) {
    const int id = any_posted_[any];
    any_posted_.erase(any_posted_.begin() + static_cast<long>(any));
    req(id).peer = peer;
    return id;
  }
  if (named == ps.posted.size()) return -1;
  const int id = ps.posted[named];
  ps.posted.erase(ps.posted.begin() + static_cast<long>(named));
  return id;
}

void Engine::deliver_unexpected(Req& r, Unexpected& u) {
  check_size(r, u.hdr, r.peer);
  if (r.nbytes > 0) {
    const size_t count = r.nbytes / dtype_size(r.dtype);
    if (r.reduce && r.own) reduce_into3(r.dst, r.own, u.data.get(), count, r.dtype, r.op);
    else if (r.reduce) reduce_into(r.dst, u.data.get(), count, r.dtype, r.op);
    else std::memcpy(r.dst, u.data.get(), r.nbytes);
  }
  r.done = true;
  give_buffer(std::move(u.data), u.capacity);
}

namespace {
// Whether two messages of a peer share a key (they must then be delivered in order).
bool same_key(const MsgHeader& a, const MsgHeader& b) {
  return a.kind == b.kind && (a.kind == kKindColl ? (a.seq == b.seq && a.step == b.step) : a.tag == b.tag);
}
// Smaller payloads come from the heap without a fresh mapping: not worth keeping.
constexpr size_t kSpareMinBytes = size_t{64} << 10;
}  // namespace

// Flow control: an eager receiver that buffered every early message would let a sender that runs ahead
// (a broadcast root, a pipeline stage) grow this rank's memory without bound, each buffer a fresh mapping
// faulted in page by page (~10 us per 4 KiB on the development VM: a 1 MiB tree broadcast ran at
// 1.7 GB/s). So the payload of a message for a later collective stays in the channel, and the channel's
// capacity holds the sender back, unless this rank waits for something else from that peer (which may lie
// behind it: then it is buffered, as before).
bool Engine::start_early_payload(int peer) {
  Peer& ps = *peer_state_[peer];
  Unexpected* u = ps.cur_unexp;
  const MsgHeader& h = u->hdr;
  bool first = true;  // order per key: only the first early message with this key may be delivered
  for (auto& e : ps.unexpected) {
    if (e.get() == u) break;
    if (same_key(e->hdr, h)) first = false;
  }
  if (const int id = first ? take_match(peer, h) : -1; id >= 0) {
    check_size(req(id), h, peer);
    ps.cur_req = id;
    for (auto it = ps.unexpected.begin(); it != ps.unexpected.end(); ++it)
      if (it->get() == u) {
        ps.unexpected.erase(it);
        break;
      }
    ps.cur_unexp = nullptr;
    return true;
  }
  const bool later_collective = h.kind == kKindColl && (!in_collective_ || h.seq > seq_);
  if (later_collective && ps.posted.empty()) return false;
  u->data = take_buffer(h.nbytes, &u->capacity);
  return true;
}

std::unique_ptr<uint8_t[]> Engine::take_buffer(size_t nbytes, size_t* capacity) {
  if (nbytes >= kSpareMinBytes) {
    // The smallest kept buffer that fits, unless more than half of it would go unused.
    auto it = spare_.lower_bound(nbytes);
    if (it != spare_.end() && it->first / 2 <= nbytes) {
      *capacity = it->first;
      spare_bytes_ -= it->first;
      auto buf = std::move(it->second);
      spare_.erase(it);
      return buf;
    }
  }
  *capacity = nbytes;
  return std::unique_ptr<uint8_t[]>(new uint8_t[nbytes]);
}

void Engine::give_buffer(std::unique_ptr<uint8_t[]> buf, size_t capacity) {
  if (!buf || capacity < kSpareMinBytes || capacity > kSpareBytes) return;
  spare_bytes_ += capacity;
  spare_.emplace(capacity, std::move(buf));
  while (spare_bytes_ > kSpareBytes) {  // the smallest go first: the large ones cost the most to fault in
    spare_bytes_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
  }
}

Request Engine::isend(int peer, uint32_t step, const void* data, size_t nbytes) {
  return post_send(peer, kKindColl, step, 0, data, nbytes);
}
Request Engine::irecv(int peer, uint32_t step, void* data, size_t nbytes) {
  return post_recv(peer, kKindColl, step, 0, data, nbytes, false, DType::kUInt8, ReduceOp::kSum);
}
Request Engine::irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op,
                             const void* own) {
  return post_recv(peer, kKindColl, step, 0, dst, count * dtype_size(dtype), true, dtype, op, own);
}

// ---- point-to-point calls (start_p2p): slots of p2p_ that outlive collectives ----
Engine::Req& Engine::req(int id) { return (id & kP2PBit) ? p2p_[id & ~kP2PBit] : reqs_[id]; }

bool Engine::p2p_done(int handle) const { return p2p_[handle & ~kP2PBit].done; }

int Engine::p2p_source(int handle) const { return p2p_[handle & ~kP2PBit].peer; }

int Engine::start_p2p(const CollArgs& a, Clock::time_point deadline) {
  if (auto f = failure()) std::rethrow_exception(f);
  if (shm_ && shm_->aborted()) raise_recorded(shm_->abort_record());
  int slot;
  if (!p2p_free_.empty()) {
    slot = p2p_free_.back();
    p2p_free_.pop_back();
  } else {
    slot = static_cast<int>(p2p_.size());
    p2p_.emplace_back();
    p2p_calls_.emplace_back();
  }
  P2PCall& c = p2p_calls_[slot];
  c.args = a;
  c.args.counts = nullptr;
  c.deadline = deadline;
  c.used = true;
  ++p2p_pending_;
  const size_t nbytes = a.count * dtype_size(a.dtype);
  // (A throw below leaves the slot in use: the group has failed, and the slot may sit in a peer's queue.)
  Request r = a.op == OpKind::kSend
                  ? post_send(a.peer, kKindP2P, 0, a.tag, a.send, nbytes, slot)
                  : post_recv(a.peer, kKindP2P, 0, a.tag, a.recv, nbytes, false, DType::kUInt8, ReduceOp::kSum,
                              nullptr, slot);
  return r.id;
}

void Engine::release_p2p(int handle) {
  const int slot = handle & ~kP2PBit;
  if (!p2p_calls_[slot].used) return;
  // An any-source receive abandoned after a failure must not match a later call's message in this slot.
  if (auto it = std::find(any_posted_.begin(), any_posted_.end(), handle); it != any_posted_.end())
    any_posted_.erase(it);
  p2p_calls_[slot].used = false;
  --p2p_pending_;
  p2p_free_.push_back(slot);
}

void Engine::check_p2p_deadlines() {
  if (p2p_pending_ == 0) return;
  if (!any_posted_.empty() && active_peers_.empty()) {
    // Every peer closed its connection and nothing it sent matches: no message can come.
    const P2PCall& c = p2p_calls_[any_posted_.front() & ~kP2PBit];
    std::vector<int> others;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) others.push_back(r);
    fail_group(record(AbortRecord::Kind::kOther,
                      fmt::format("{} in group '{}' on rank {} cannot complete: every other rank closed its "
                                  "connection (Connection closed by peer) without sending a message with tag {}",
                                  describe(c.args), name_, rank_, c.args.tag),
                      -1, others));
  }
  const auto now = Clock::now();
  for (size_t s = 0; s < p2p_.size(); ++s)
    if (p2p_calls_[s].used && !p2p_[s].done && now >= p2p_calls_[s].deadline) raise_p2p_timeout(static_cast<int>(s));
}

[[noreturn]] void Engine::raise_p2p_timeout(int slot) {
  const P2PCall& c = p2p_calls_[slot];
  const Req& r = p2p_[slot];
  std::vector<int> missing;
  if (r.any_source) {
    for (int p = 0; p < size_; ++p)
      if (p != rank_) missing.push_back(p);
  } else if (!r.is_send) {
    missing.push_back(r.peer);
  }
  std::string detail = r.is_send      ? fmt::format("rank {} did not drain what was sent to it{}", r.peer,
                                                    on_hosts({r.peer}))
                       : r.any_source ? fmt::format("not heard from: rank(s) {} (a receive from any source)",
                                                    fmt::join(missing, ", "))
                                      : fmt::format("not heard from: rank(s) {}{}", r.peer, on_hosts(missing));
  std::string msg = fmt::format("{} in group '{}' timed out on rank {}; {}", describe(c.args), name_, rank_, detail);
  AbortRecord rec = record(AbortRecord::Kind::kTimeout, msg, -1, missing);
  rec.op = op_name(c.args.op);
  fail_group(rec);
}

std::string Engine::activity(int peer) const {
  if (in_collective_) return fmt::format("{} (sequence number {})", describe(args_), seq_);
  for (size_t s = 0; s < p2p_.size(); ++s)
    if (p2p_calls_[s].used && !p2p_[s].done && (p2p_[s].peer == peer || p2p_[s].any_source))
      return describe(p2p_calls_[s].args);
  return "point-to-point traffic";
}

void Engine::wake() {
  wake_.store(true, std::memory_order_seq_cst);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
  if (shm_ && local_index_[rank_] >= 0) shm_->ring(local_index_[rank_]);
}

void Engine::idle_wait() {
  if (auto f = failure()) std::rethrow_exception(f);
  if (shm_ && shm_->aborted()) raise_recorded(shm_->abort_record());
  auto done = [&] {
    wake_.store(false, std::memory_order_relaxed);
    if (wake_fd_ >= 0) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
    }
  };
  for (int spin = 0; spin < spin_limit_; ++spin) {
    if (wake_.load(std::memory_order_acquire) || progress_all()) return done();
    cpu_relax();
  }
  check_p2p_deadlines();
  // Sleep on what the pending calls need (as wait() does), at most until the earliest deadline.
  auto now = Clock::now();
  Clock::time_point until = now + std::chrono::milliseconds(50);
  wait_kinds_ = 0;
  for (size_t s = 0; s < p2p_.size(); ++s) {
    if (!p2p_calls_[s].used || p2p_[s].done) continue;
    const int peer = p2p_[s].peer;
    if (p2p_[s].any_source) wait_kinds_ |= (has_tcp_ ? 1 : 0) | (has_shm_ ? 2 : 0);
    else if (peer >= 0 && channels_[peer]) wait_kinds_ |= channels_[peer]->is_shm() ? 2 : 1;
    until = std::min(until, p2p_calls_[s].deadline);
  }
  idle_ = true;
  try {
    block_once(until);
  } catch (...) {
    idle_ = false;
    throw;
  }
  idle_ = false;
  now = Clock::now();
  if (idle_check_ == Clock::time_point::max()) {
    idle_check_ = now + std::chrono::milliseconds(200);
  } else if (now >= idle_check_) {
    idle_check_ = now + std::chrono::milliseconds(250);
    periodic_checks();
  }
  check_p2p_deadlines();
  done();
}
// ---- end point-to-point calls ----

void* Engine::scratch(size_t nbytes, int slot) {
  if (slot < 0) slot = 0;
  if (static_cast<size_t>(slot) >= scratch_.size()) scratch_.resize(slot + 1);
  auto& buf = scratch_[slot];
  if (buf.size() < nbytes + 64) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(nbytes + nbytes / 4 + 64);  // zero-filled: faulted in once, reused afterwards
  }
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - (addr & 63)) & 63);
}

bool Engine::progress_tx(int peer) {
  Peer& ps = *peer_state_[peer];
  Channel& ch = *channels_[peer];
  bool moved = false;
  while (!ps.sendq.empty()) {
    Req& r = req(ps.sendq.front());
    const size_t full = r.nbytes & ~static_cast<size_t>(63);
    const size_t frame = 64 + round64(r.nbytes);
    while (r.off < frame) {
      size_t k;
      if (r.off < 64) {
        k = ch.write_some(reinterpret_cast<const uint8_t*>(&r.hdr) + r.off, 64 - r.off);
      } else if (r.off < 64 + full) {
        k = ch.write_some(r.src + (r.off - 64), full - (r.off - 64));
      } else {
        uint8_t tail[64] = {};
        std::memcpy(tail, r.src + full, r.nbytes - full);
        size_t t = r.off - 64 - full;
        k = ch.write_some(tail + t, 64 - t);
      }
      if (k == 0) return moved;
      moved = true;
      r.off += k;
    }
    r.done = true;
    bump(counters_[peer].tx_bytes, r.nbytes);
    ps.sendq.pop_front();
  }
  return moved;
}

void Engine::on_header(int peer) {
  Peer& ps = *peer_state_[peer];
  std::memcpy(&ps.cur, ps.hdr_buf, 64);
  const MsgHeader& h = ps.cur;
  if (const std::string bad = frame_header_error(h); !bad.empty()) {
    std::string msg = fmt::format("group '{}': corrupt message header from {} ({}); the stream is out of sync",
                                  name_, who(peer), bad);
    fail_group(record(AbortRecord::Kind::kOther, msg, peer));
  }
  if (h.kind == kKindColl) {
    if (any_done_ && h.seq <= last_done_seq_) {
      // This rank finished that collective without this peer's message: the calls differed. Both are named
      // when it is the last one this rank completed (the usual case: a root's sends need no reply).
      std::string msg;
      if (h.seq == last_done_seq_)
        msg = fmt::format(
            "collective mismatch in group '{}' at sequence number {}: {} issued {} [algorithm {}] (and completed it) "
            "but {} issued {}; every rank must issue the same collectives in the same order with the same count, "
            "dtype, op and root",
            name_, h.seq, who(rank_), describe(last_done_args_), algo_name(last_done_algo_), who(peer),
            describe_header(h));
      else
        msg = fmt::format(
            "collective mismatch in group '{}': {} sent a message for {} at sequence number {}, which {} has already "
            "completed; the ranks disagree on that collective's count, algorithm or dtype",
            name_, who(peer), describe_header(h), h.seq, who(rank_));
      AbortRecord r = record(AbortRecord::Kind::kMismatch, msg, peer);
      r.seq = static_cast<long>(h.seq);
      r.op = op_name(static_cast<OpKind>(h.op));
      fail_group(r);
    }
    if (in_collective_ && h.seq == seq_) check_fingerprint(peer, h);
  }
  ps.got = 0;
  ps.cur_req = -1;
  ps.cur_unexp = nullptr;
  if (const int id = take_match(peer, h); id >= 0) {
    Req& r = req(id);
    check_size(r, h, peer);
    ps.cur_req = id;
    // Timed only when this rank was already waiting for it (a read found the channel empty after the
    // receive was posted): the payload then streams at the link's pace. A message that had arrived before
    // (sitting in the socket's or ring's buffer) would read at memory speed and overstate the link.
    if (h.nbytes >= PeerTraffic::kTimedBytes && r.posted_ns != 0 && ps.empty_reads > r.empty_mark) {
      ps.rx_t0_ns = precise_ns();
      bump(counters_[peer].rx_wait_ns, coarse_ns() - r.posted_ns);
    }
  }
  if (ps.cur_req < 0) {
    auto u = std::make_unique<Unexpected>();
    u->hdr = h;
    u->arrival = ++arrivals_;
    ps.cur_unexp = u.get();
    ps.unexpected.push_back(std::move(u));
  }
  ps.rx = Peer::kPayload;
}

bool Engine::progress_rx(int peer) {
  Peer& ps = *peer_state_[peer];
  Channel& ch = *channels_[peer];
  bool moved = false;
  for (;;) {
    if (ps.rx == Peer::kHeader) {
      size_t k = ch.read_some(ps.hdr_buf + ps.hdr_got, 64 - ps.hdr_got);
      if (k == 0) {
        ++ps.empty_reads;
        return moved;
      }
      moved = true;
      ps.hdr_got += k;
      if (ps.hdr_got < 64) continue;
      ps.hdr_got = 0;
      on_header(peer);
    }
    if (ps.rx == Peer::kPayload) {
      const size_t n = ps.cur.nbytes;
      if (ps.cur_req < 0 && !ps.cur_unexp->data && !start_early_payload(peer)) return moved;
      while (ps.got < n) {
        size_t k = 0;
        if (ps.cur_req >= 0) {
          Req& r = req(ps.cur_req);
          if (r.reduce) {
            auto span = ch.peek();
            const size_t es = dtype_size(r.dtype);
            size_t m = std::min(span.size(), n - ps.got) / es * es;
            if (m > 0) {
              if (r.own) reduce_into3(r.dst + ps.got, r.own + ps.got, span.data(), m / es, r.dtype, r.op);
              else reduce_into(r.dst + ps.got, span.data(), m / es, r.dtype, r.op);
              ch.consume(m);
            }
            k = m;
          } else {
            k = ch.read_some(r.dst + ps.got, n - ps.got);
          }
        } else {
          k = ch.read_some(ps.cur_unexp->data.get() + ps.got, n - ps.got);
        }
        if (k == 0) return moved;
        moved = true;
        ps.got += k;
      }
      ps.pad_left = frame_padding(n);
      ps.rx = Peer::kPad;
    }
    if (ps.rx == Peer::kPad) {
      while (ps.pad_left > 0) {
        uint8_t sink[64];
        size_t k = ch.read_some(sink, ps.pad_left);
        if (k == 0) return moved;
        moved = true;
        ps.pad_left -= k;
      }
      Counters& c = counters_[peer];
      bump(c.rx_bytes, ps.cur.nbytes);
      if (ps.rx_t0_ns != 0) {
        bump(c.rx_timed_bytes, ps.cur.nbytes);
        bump(c.rx_busy_ns, precise_ns() - ps.rx_t0_ns);
        ps.rx_t0_ns = 0;
      }
      if (ps.cur_req >= 0) {
        req(ps.cur_req).done = true;
      } else {
        ps.cur_unexp->complete = true;
        // A receive posted while this message was still arriving waits in `posted` (posting skips an
        // incomplete early message) or in any_posted_: match it now. Only the first early message with
        // this key may be delivered (order per key).
        const MsgHeader& h = ps.cur_unexp->hdr;
        bool earlier = false;
        for (auto& u : ps.unexpected) {
          if (u.get() == ps.cur_unexp) break;
          if (same_key(u->hdr, h)) earlier = true;
        }
        if (const int id = earlier ? -1 : take_match(peer, h); id >= 0) {
          deliver_unexpected(req(id), *ps.cur_unexp);
          for (auto it = ps.unexpected.begin(); it != ps.unexpected.end(); ++it)
            if (it->get() == ps.cur_unexp) {
              ps.unexpected.erase(it);
              break;
            }
        }
      }
      ps.cur_req = -1;
      ps.cur_unexp = nullptr;
      ps.rx = Peer::kHeader;
    }
  }
}

// The TCP sockets of the active peers to poll: readable always, writable when a send is queued. Reuses
// one vector (this is the waiting path).
std::vector<pollfd>& Engine::tcp_pollfds() {
  pollfds_.clear();
  for (int p : active_peers_) {
    int fd = channels_[p]->fd();
    if (fd < 0) continue;
    short ev = POLLIN;
    if (!peer_state_[p]->sendq.empty()) ev |= POLLOUT;
    pollfds_.push_back({fd, ev, 0});
  }
  if (idle_ && wake_fd_ >= 0) pollfds_.push_back({wake_fd_, POLLIN, 0});
  return pollfds_;
}

bool Engine::progress_all() {
  bool moved = false;
  for (size_t k = 0; k < active_peers_.size(); ++k) {
    int p = active_peers_[k];
    bool tx = !peer_state_[p]->sendq.empty();
    int r = progress_peer(p, tx, true);
    if (r < 0) return moved;  // active_peers_ changed under the loop
    moved |= r > 0;
  }
  return moved;
}

int Engine::progress_peer(int p, bool tx, bool rx) {
  bool moved = false;
  {
    try {
      if (tx) moved |= progress_tx(p);
      if (rx) moved |= progress_rx(p);
    } catch (const MismatchError&) {
      throw;
    } catch (const NetworkError& e) {
      if (e.rank >= 0) throw;  // already explained by this engine
      if (waiting_on(p)) raise_abort_from_peer(p, e.what());
      // A peer that finished and exited closes its end; that is an error only if the group was aborted
      // or if this rank still needs that peer (checked when a request to it is posted).
      if (auto r = stored_abort(0)) raise_recorded(std::move(*r));
      closed_.push_back(p);
      closed_reason_[p] = e.what();
      active_peers_.erase(std::find(active_peers_.begin(), active_peers_.end(), p));
      return -1;
    }
  }
  return moved ? 1 : 0;
}

bool Engine::waiting_on(int p) const {
  const Peer& ps = *peer_state_[p];
  return !ps.sendq.empty() || !ps.posted.empty() || ps.rx != Peer::kHeader || ps.hdr_got != 0;
}

[[noreturn]] void Engine::raise_abort_from_peer(int peer, const std::string& channel_error) {
  // Why did the connection break? A dead process, an abort with a recorded reason, or the network.
  if (shm_ && shm_->aborted()) raise_recorded(shm_->abort_record());
  // An aborting rank records its reason in the store before it closes its connections.
  if (auto r = stored_abort(0)) raise_recorded(std::move(*r));
  const PeerInfo& p = peers_[peer];
  if (p.same_host) {
    // Give a dying process a moment to become a zombie.
    for (int i = 0; i < 20 && process_alive(p.pid, p.starttime); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!process_alive(p.pid, p.starttime)) {
      std::string msg = fmt::format("{} died during {} in group '{}'", who(peer), activity(peer), name_);
      fail_group(record(AbortRecord::Kind::kPeerDied, msg, peer));
    }
  }
  if (auto r = stored_abort(1.0)) raise_recorded(std::move(*r));
  std::string msg = fmt::format("{} in group '{}' during {}: {}", who(rank_), name_, activity(peer), channel_error);
  fail_group(record(AbortRecord::Kind::kPeerDied, msg, peer));
}

void Engine::periodic_checks() {
  if (shm_ && shm_->aborted()) raise_recorded(shm_->abort_record());
  // ---- shared-memory fast path: a peer inside a window collective at this sequence number ----
  if (window_ && in_collective_) {
    ShmWindow::Fingerprint theirs;
    int p = window_->peer_at_seq(seq_, &theirs);
    if (p >= 0 && !has_tcp_ && static_cast<uint8_t>(algo_) != theirs.algo) {
      CollArgs shown = args_;
      shown.count = fp_count_;
      std::string msg = fmt::format(
          "collective mismatch in group '{}' at sequence number {}: {} issued {} [algorithm {}] but {} issued {}; "
          "every rank must issue the same collectives in the same order with the same count, dtype, op and root",
          name_, seq_, who(rank_), describe(shown), algo_name(algo_), who(p), ShmWindow::describe(theirs));
      fail_group(record(AbortRecord::Kind::kMismatch, msg, p));
    }
  }
  // ---- end shared-memory fast path ----
  for (int p : std::vector<int>(active_peers_)) {  // a copy: progress_peer may retire a peer
    const PeerInfo& info = peers_[p];
    // Only a shared-memory channel needs this check. A TCP peer's exit is not conclusive while its socket
    // is open: the kernel still delivers what the peer wrote before it exited (up to both socket buffers,
    // hundreds of KiB) and then the end of stream, or a reset if it was killed, which progress_rx raises
    // and raise_abort_from_peer names. Declaring death here raced with that delivery on a loaded machine.
    if (channels_[p] && !channels_[p]->is_shm()) continue;
    if (!info.same_host || !waiting_on(p) || process_alive(info.pid, info.starttime)) continue;
    // Gone. A peer that delivered everything this rank needs from it and then exited (it finished) is
    // not a dead peer: read what it left in the channel, then ask again (as the shm window does).
    int moved = 1;
    while (moved > 0 && waiting_on(p)) moved = progress_peer(p, !peer_state_[p]->sendq.empty(), true);
    if (moved >= 0 && waiting_on(p)) {
      std::string msg = fmt::format("{} died during {} in group '{}'", who(p), activity(p), name_);
      fail_group(record(AbortRecord::Kind::kPeerDied, msg, p));
    }
  }
}

// ---- shared-memory fast path (algorithms/shm_window.h, algorithms/shm_fast_path.cc) ----
bool Engine::has_shm_window() const {
  return shm_ && !has_tcp_ && window_ && shm_->local_size() == size_;
}

ShmWindow* Engine::shm_window() {
  if (!has_shm_window()) return nullptr;
  ShmWindow::Fingerprint fp;
  fp.seq = seq_;
  fp.count = fp_count_;
  fp.op = static_cast<uint8_t>(args_.op);
  fp.dtype = static_cast<uint8_t>(args_.dtype);
  fp.redop = static_cast<uint8_t>(args_.redop);
  fp.algo = static_cast<uint8_t>(algo_);
  fp.root = args_.root;
  if (!window_->has_identity()) {
    std::vector<int> globals;
    for (auto& p : peers_) globals.push_back(p.global_rank);
    window_->set_identity(name_, std::move(globals));
  }
  window_->begin(fp, deadline_, [this] { progress_all(); });
  return window_.get();
}
// ---- end shared-memory fast path ----

std::string Engine::on_hosts(const std::vector<int>& ranks) const {
  bool several = false;
  for (int h : host_index_) several = several || h != host_index_[rank_];
  if (!several || ranks.empty()) return {};
  std::vector<std::string> hosts;
  for (int r : ranks)
    if (std::find(hosts.begin(), hosts.end(), peers_[r].host) == hosts.end()) hosts.push_back(peers_[r].host);
  return fmt::format(" (on host{} {})", hosts.size() == 1 ? "" : "s", fmt::join(hosts, ", "));
}

// Whom a timed-out rank names. A rank waits on the peers its algorithm needs next, and across hosts those
// are often healthy ranks blocked in turn on the real cause (under the hierarchical all_reduce a rank waits
// on its host's leader, the leader on the other hosts' leaders, and only one of them on the silent rank).
// So each rank that times out in a collective publishes whom it waits for (store key waits/<seq>/<rank>),
// then follows the published edges from its own: the ranks reached that never publish (unreachable, dead,
// stopped, or not in this collective) are the cause, as c10d's monitoredBarrier reasons. Ranks reached
// time out within moments of each other (they entered the collective together), so it waits for their
// edges at most kWaitsGrace (2 s, or half the call's timeout when shorter); a record another rank stored
// meanwhile ends the wait (every rank then raises the same record). Groups on one host keep the direct
// answer: process liveness names the dead there. The walk reads at most kWaitsMaxReads ranks' edges (a
// ring's chain at thousands of ranks would load the store with ranks squared reads); past that, or without
// a store, the direct answer stands.
namespace {
constexpr auto kWaitsGrace = std::chrono::seconds(2);  // at most half the call's own timeout
constexpr auto kWaitsPoll = std::chrono::milliseconds(100);
constexpr size_t kWaitsMaxReads = 64;

std::string encode_ranks(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }
std::vector<int> decode_ranks(const Bytes& b) {
  std::vector<int> out;
  int v = 0;
  bool any = false;
  for (uint8_t c : b) {
    if (c >= '0' && c <= '9') {
      v = v * 10 + (c - '0');
      any = true;
    } else if (c == ',') {
      if (any) out.push_back(v);
      v = 0;
      any = false;
    }
  }
  if (any) out.push_back(v);
  return out;
}
}  // namespace

std::vector<int> Engine::pooled_cause(const std::vector<int>& missing, std::string* how) {
  bool several_hosts = false;
  for (int h : host_index_) several_hosts = several_hosts || h != host_index_[rank_];
  if (!store_ || missing.empty() || !in_collective_ || !several_hosts) return missing;
  const std::string prefix = fmt::format("waits/{}/", seq_);
  // Store calls fail where the store is unreachable from here (this rank's link is the one cut): then the
  // direct answer.
  try {
    const std::string mine = encode_ranks(missing);
    store_->set(prefix + std::to_string(rank_), Bytes(mine.begin(), mine.end()));
  } catch (const std::exception&) {
    return missing;
  }
  {
    std::vector<std::optional<std::vector<int>>> edges(static_cast<size_t>(size_));
    edges[static_cast<size_t>(rank_)] = missing;
    std::vector<int> parent(static_cast<size_t>(size_), -1);
    size_t reads = 0;
    // The call's timeout, from its start (coarse CLOCK_MONOTONIC, steady_clock's clock) to its deadline.
    const auto timeout = deadline_.time_since_epoch() - std::chrono::nanoseconds(coll_t0_ns_);
    const auto until = Clock::now() + std::min<Clock::duration>(
                                          std::chrono::duration_cast<Clock::duration>(kWaitsGrace),
                                          std::max<Clock::duration>(Clock::duration::zero(), timeout / 2));
    for (;;) {
      // Walk from this rank over the edges known so far; read the edges of ranks reached but not yet known.
      std::vector<int> unknown, order{rank_};
      std::vector<bool> seen(static_cast<size_t>(size_), false);
      seen[static_cast<size_t>(rank_)] = true;
      std::fill(parent.begin(), parent.end(), -1);
      for (size_t i = 0; i < order.size(); ++i) {
        const int r = order[i];
        if (!edges[static_cast<size_t>(r)]) {
          unknown.push_back(r);
          continue;
        }
        for (int q : *edges[static_cast<size_t>(r)]) {
          if (q < 0 || q >= size_ || seen[static_cast<size_t>(q)]) continue;
          seen[static_cast<size_t>(q)] = true;
          parent[static_cast<size_t>(q)] = r;
          order.push_back(q);
        }
      }
      for (int r : unknown) {
        if (reads >= kWaitsMaxReads) return missing;
        const std::string key = prefix + std::to_string(r);
        try {
          if (!store_->check({key})) continue;
          edges[static_cast<size_t>(r)] = decode_ranks(store_->get(key, Seconds(1)));
        } catch (const std::exception&) {
          return missing;
        }
        ++reads;
      }
      bool grew = false;
      for (int r : unknown) grew = grew || edges[static_cast<size_t>(r)].has_value();
      if (grew) continue;  // walk again over the new edges before waiting
      if (unknown.empty()) return missing;  // everyone reached is waiting too (a cycle): the direct answer
      if (Clock::now() >= until) {
        std::sort(unknown.begin(), unknown.end());
        if (unknown != missing) {
          // How this rank's wait leads to each silent rank: "rank 0 waits for rank 2, rank 2 for rank 5".
          std::vector<std::string> steps;
          for (int r : unknown) {
            std::vector<int> path{r};
            while (parent[static_cast<size_t>(path.back())] >= 0) path.push_back(parent[static_cast<size_t>(path.back())]);
            std::reverse(path.begin(), path.end());
            std::vector<std::string> hops;
            for (size_t i = 0; i + 1 < path.size(); ++i)
              hops.push_back(i == 0 ? fmt::format("rank {} waits for rank {}", path[i], path[i + 1])
                                    : fmt::format("rank {} for rank {}", path[i], path[i + 1]));
            steps.push_back(fmt::format("{}", fmt::join(hops, ", ")));
          }
          *how = fmt::format("; the timed-out ranks' waits, pooled: {}", fmt::join(steps, "; "));
        }
        return unknown;
      }
      if (auto stored = stored_abort(0)) {  // another rank decided first: pass its record on and raise it
        abort(*stored);
        raise_recorded(*stored);
      }
      std::this_thread::sleep_for(kWaitsPoll);
    }
  }
}

[[noreturn]] void Engine::raise_timeout(std::span<const Request> reqs) {
  std::vector<int> missing, stuck;
  for (auto& q : reqs) {
    const Req& r = req(q.id);
    if (r.done) continue;
    auto& v = r.is_send ? stuck : missing;
    if (std::find(v.begin(), v.end(), r.peer) == v.end()) v.push_back(r.peer);
  }
  std::sort(missing.begin(), missing.end());
  std::sort(stuck.begin(), stuck.end());
  std::string detail, how;
  if (!missing.empty()) {
    missing = pooled_cause(missing, &how);
    detail = fmt::format("not heard from: rank(s) {}{}{}", fmt::join(missing, ", "), on_hosts(missing), how);
  } else {
    detail = fmt::format("rank(s) {} did not drain what was sent to them{}", fmt::join(stuck, ", "), on_hosts(stuck));
  }
  std::string msg = fmt::format("{} (sequence number {}) in group '{}' timed out on rank {}; {}",
                                in_collective_ ? describe(args_) : describe(args_), seq_, name_, rank_, detail);
  fail_group(record(AbortRecord::Kind::kTimeout, msg, -1, missing));
}

void Engine::block_once(Clock::time_point deadline) {
  auto now = Clock::now();
  int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
  ms = std::clamp(ms, 0, 50);
  // Shared memory and TCP peers both (ranks on several hosts): sleep on what the waited requests need.
  // Only TCP peers: poll their sockets; only shared-memory peers: sleep on the doorbell; both: a
  // non-blocking poll, then the doorbell for at most kMixedSleepUs (no one wakes a poll for a
  // shared-memory message, nor the doorbell for a TCP one).
  if (has_tcp_ && has_shm_ && wait_kinds_ != 0) {
    constexpr long kMixedSleepUs = 100;
    const bool need_tcp = (wait_kinds_ & 1) != 0, need_shm = (wait_kinds_ & 2) != 0;
    if (need_tcp || !need_shm) {
      std::vector<pollfd>& fds = tcp_pollfds();
      if (poll(fds.data(), fds.size(), need_shm ? 0 : ms) != 0 || !need_shm) return;
    }
    int me = local_index_[rank_];
    uint32_t seen = shm_->bell(me).load(std::memory_order_acquire);
    shm_->sleeping(me).store(1, std::memory_order_seq_cst);
    bool moved = progress_all();
    if (!moved && !(shm_->aborted()) && !(idle_ && wake_.load(std::memory_order_seq_cst))) {
      const long us = need_tcp ? kMixedSleepUs : static_cast<long>(ms) * 1000;
      timespec ts{us / 1000000, (us % 1000000) * 1000L};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&shm_->bell(me)), FUTEX_WAIT, seen, &ts, nullptr, 0);
    }
    shm_->sleeping(me).store(0, std::memory_order_relaxed);
    return;
  }
  if (has_tcp_) {
    std::vector<pollfd>& fds = tcp_pollfds();
    poll(fds.data(), fds.size(), has_shm_ ? std::min(ms, 1) : ms);
    return;
  }
  if (has_shm_) {
    int me = local_index_[rank_];
    uint32_t seen = shm_->bell(me).load(std::memory_order_acquire);
    shm_->sleeping(me).store(1, std::memory_order_seq_cst);
    bool moved = progress_all();
    if (!moved && !(shm_->aborted()) && !(idle_ && wake_.load(std::memory_order_seq_cst)))
      shm_->sleep_on_bell(seen, ms);
    shm_->sleeping(me).store(0, std::memory_order_relaxed);
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void Engine::wait(std::span<const Request> reqs) {
  auto all_done = [&] {
    for (auto& q : reqs)
      if (!req(q.id).done) return false;
    return true;
  };
  int idle = 0;
  for (;;) {
    if (all_done()) return;
    if (progress_all()) {
      idle = 0;
      continue;
    }
    if (++idle < spin_limit_) {
      cpu_relax();
      continue;
    }
    wait_kinds_ = 0;
    for (auto& q : reqs) {
      const Req& rq = req(q.id);
      if (!rq.done && rq.peer >= 0 && channels_[rq.peer]) wait_kinds_ |= channels_[rq.peer]->is_shm() ? 2 : 1;
    }
    block_once(deadline_);
    if (all_done()) return;
    auto now = Clock::now();
    if (next_check_ == Clock::time_point::max()) {
      next_check_ = now + std::chrono::milliseconds(200);  // the first periodic check, 200 ms after first blocking
    } else if (now >= next_check_) {
      next_check_ = now + std::chrono::milliseconds(250);
      periodic_checks();
    }
    if (now >= deadline_) raise_timeout(reqs);
    idle = spin_limit_ / 2;
  }
}

}  // namespace trident
