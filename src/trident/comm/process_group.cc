#include "trident/comm/process_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "trident/comm/collective.h"
#include "trident/comm/device_memory.h"
#include "trident/comm/device_reads.h"
#include "trident/comm/flight_recorder.h"
#include "trident/comm/reduce.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/stamp_clock.h"
#include "trident/core/timeline.h"

namespace trident {

// ---- buffers in memory the backend cannot read: device memory on native/mpi, host memory on nccl ----
// Copies of one call's buffers in memory the backend reads: host copies of device buffers (native, mpi) or
// device copies of host buffers (nccl). Made (and filled) before the call; results copied back after it.
struct ProcessGroup::Staging {
  const DeviceMemory* dm = nullptr;
  bool to_device = false;  // the copies are device memory (of host buffers), else host memory
  // One temporary region per side; recv is null when the call works in place on `send`.
  struct Region {
    const DeviceMemory* dm = nullptr;
    bool device = false;
    std::unique_ptr<std::byte[]> host;
    void* dev = nullptr;
    Region() = default;
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;
    ~Region() {
      if (dev) dm->free(dev);
    }
    void* get() const { return device ? dev : static_cast<void*>(host.get()); }
  };
  std::unique_ptr<Region> send, recv;
  void* recv_orig = nullptr;  // where the results go back (null: nothing to copy back)
  size_t recv_bytes = 0;

  std::unique_ptr<Region> make(size_t bytes) const {
    auto r = std::make_unique<Region>();
    r->dm = dm;
    r->device = to_device;
    bytes = std::max<size_t>(bytes, 1);
    if (to_device) r->dev = dm->alloc(bytes);
    else r->host.reset(new std::byte[bytes]);
    return r;
  }
  // A copy from the caller's memory into a region, or back.
  void copy_in(void* region, const void* orig, size_t bytes) const {
    if (bytes == 0) return;
    if (to_device) dm->to_device(region, orig, bytes);
    else dm->to_host(region, orig, bytes);
  }
  void copy_back() const {
    if (recv_orig == nullptr || recv_bytes == 0) return;
    const void* from = (recv ? recv : send)->get();
    if (to_device) dm->to_host(recv_orig, from, recv_bytes);
    else dm->to_device(recv_orig, from, recv_bytes);
  }
};

std::unique_ptr<ProcessGroup::Staging> ProcessGroup::stage(CollArgs& a) const {
  const bool host_ok = reads_host_memory(), device_ok = reads_device_memory();
  if (host_ok && device_ok) return nullptr;
  const DeviceMemory* dm = device_memory();
  if (dm == nullptr) return nullptr;  // no device: every buffer is host memory (or the backend says why not)
  const auto [sb, rb] = buffer_bytes(a, rank_, size_);
  if (sb == 0 && rb == 0) return nullptr;  // nothing is read or written: the pointers are never used
  // A buffer needs a copy when it lies where the backend cannot read: in device memory for a host backend,
  // in host memory for a device one (a side this rank does not use needs none).
  auto needs = [&](const void* p, size_t bytes) {
    if (p == nullptr || bytes == 0) return false;
    if (dm->alloc == nullptr && !host_ok) return false;  // cannot make device copies: the backend reports it
    return dm->contains(p) ? !device_ok : !host_ok;
  };
  const bool in_place = a.send == a.recv;
  const bool send_moves = needs(a.send, in_place ? std::max(sb, rb) : sb);
  const bool recv_moves = in_place ? send_moves : needs(a.recv, rb);
  if (!send_moves && !recv_moves) return nullptr;
  auto st = std::make_unique<Staging>();
  st->dm = dm;
  st->to_device = !host_ok;
  if (in_place) {  // one copy serves both sides
    st->send = st->make(std::max(sb, rb));
    st->copy_in(st->send->get(), a.send, sb);
    st->recv_orig = a.recv;
    st->recv_bytes = rb;
    a.send = a.recv = st->send->get();
    return st;
  }
  if (send_moves) {
    st->send = st->make(sb);
    st->copy_in(st->send->get(), a.send, sb);
    a.send = st->send->get();
  }
  if (recv_moves) {
    st->recv = st->make(rb);
    st->recv_orig = a.recv;
    st->recv_bytes = rb;
    a.recv = st->recv->get();
  }
  return st;
}

// ---- the device path: ranks of one host read each other's device buffers (comm/device_memory.h, CUDA IPC)
// A rank's part of the handshake of one device-path call: whether it can take part, and its buffers' handles.
// The call itself rides along, so that ranks that issued different calls are told so before any rank reads
// a peer's buffer with its own idea of the sizes (the backend's fingerprint checks see only the handshake).
struct DeviceRecord {
  int32_t ok = 0;
  int32_t op = 0, dtype = 0, redop = 0, root = 0;
  int32_t pad = 0;
  uint64_t count = 0;   // this rank's count (all_gatherv: 0; its counts are in counts_hash)
  uint64_t counts_hash = 0;
  DeviceHandle send, recv;
};

DeviceRecord device_record_of(const CollArgs& a) {
  DeviceRecord r;
  r.op = static_cast<int32_t>(a.op);
  r.dtype = static_cast<int32_t>(a.dtype);
  const CollectiveInfo& info = collective_info(a.op);
  r.redop = info.reduces ? static_cast<int32_t>(a.redop) : 0;
  r.root = info.rooted ? a.root : 0;
  if (a.op == OpKind::kAllGatherV) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts
    for (size_t c : *a.counts) h = (h ^ c) * 1099511628211ull;
    r.counts_hash = h;
  } else {
    r.count = a.count;
  }
  return r;
}
bool same_call(const DeviceRecord& x, const DeviceRecord& y) {
  return x.op == y.op && x.dtype == y.dtype && x.redop == y.redop && x.root == y.root && x.count == y.count &&
         x.counts_hash == y.counts_hash;
}
std::string describe_record(const DeviceRecord& r) {
  CollArgs a;
  a.op = static_cast<OpKind>(r.op);
  a.dtype = static_cast<DType>(r.dtype);
  a.redop = static_cast<ReduceOp>(r.redop);
  a.root = r.root;
  a.count = r.count;
  if (a.op == OpKind::kAllGatherV)
    return fmt::format("all_gatherv({}, counts hash {:016x})", dtype_name(a.dtype), r.counts_hash);
  return describe(a);
}

bool ProcessGroup::device_path_applies(const CollArgs& a) const {
  if (size_ == 1 || reads_device_memory()) return false;
  if (!device_reads_support(a.op)) return false;
  const DeviceMemory* dm = device_memory();
  if (dm == nullptr || dm->export_handle == nullptr || dm->open_handle == nullptr || dm->reduce == nullptr ||
      dm->copy == nullptr || dm->synchronize == nullptr)
    return false;
  // Small calls stage (DeviceMemory::direct_min_bytes, or TRIDENT_CUDA_IPC_MIN_BYTES). The size is the
  // call's largest buffer, the same on every rank.
  const size_t bytes = size_bytes(a, size_);
  static const int64_t min_override =
      env::param_string("TRIDENT_CUDA_IPC_MIN_BYTES").empty() ? -1 : env::param_size("TRIDENT_CUDA_IPC_MIN_BYTES");
  const size_t min_bytes = min_override >= 0 ? static_cast<size_t>(min_override) : dm->direct_min_bytes;
  if (bytes == 0 || bytes < min_bytes) return false;
  // Every buffer this rank passes is device memory (ranks pass the same kinds: a rank with a host buffer here
  // while its peers pass device buffers is named by the group's mismatch check on the handshake, or, once
  // the group has a lane, by the deadline or mismatch check of the group call that rank waits in).
  // (all_gatherv: a rank that contributes nothing may pass no send buffer; its receive buffer stands in.)
  const void* send_buf = a.send != nullptr ? a.send : a.recv;
  if (!dm->contains(a.recv) || (send_buf != a.recv && !dm->contains(send_buf))) return false;
  static const bool enabled = env::param_bool("TRIDENT_CUDA_IPC");
  if (!enabled) return false;
  const TransportInfo t = transport_info();
  return t.tcp_peers == 0 && t.shm_peers == size_ - 1;  // every peer on this host
}

bool ProcessGroup::run_on_device(const CollArgs& a, const CallOptions& o) {
  if (!device_path_applies(a)) return false;
  const DeviceMemory* dm = device_memory();
  const void* send_buf = a.send != nullptr ? a.send : a.recv;

  // Handshake (host memory, blocking): after this rank's device work is done, so that when it returns every
  // rank's inputs are ready. A rank that cannot share its memory, or reduce this dtype, makes all stage.
  dm->synchronize();
  DeviceRecord mine = device_record_of(a);
  mine.ok = dm->export_handle(send_buf, &mine.send) && dm->export_handle(a.recv, &mine.recv) &&
            (!collective_info(a.op).reduces || dm->reduce(nullptr, nullptr, size_, 0, a.dtype, a.redop));
  std::vector<DeviceRecord> all(static_cast<size_t>(size_));
  all_gather(&mine, all.data(), sizeof(DeviceRecord), DType::kUInt8, o);
  // Every rank sees the same records, so every rank names the same two: rank 0 and the first that differs.
  for (int q = 1; q < size_; ++q) {
    if (same_call(all[0], all[static_cast<size_t>(q)])) continue;
    const std::string what = fmt::format(
        "collective mismatch in group '{}' on the device path: rank 0 issued {} but rank {} issued {}; every rank "
        "must issue the same collectives in the same order",
        name_, describe_record(all[0]), q, describe_record(all[static_cast<size_t>(q)]));
    abort(what);
    throw MismatchError(what, rank_, rank_ == 0 ? q : 0, op_name(a.op), -1, {0, q});
  }
  for (const auto& r : all)
    if (!r.ok) return false;

  // Every rank's buffers, mapped here (this rank's own as they are), released on every way out.
  struct Mapped {
    const DeviceMemory* dm;
    std::vector<void*> bases;
    ~Mapped() {
      for (void* b : bases) dm->close_handle(b);
    }
  } mapped{dm, {}};
  std::vector<const char*> send(static_cast<size_t>(size_));
  std::vector<char*> recv(static_cast<size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) {
      send[q] = static_cast<const char*>(send_buf);
      recv[q] = static_cast<char*>(a.recv);
      continue;
    }
    const DeviceRecord& r = all[static_cast<size_t>(q)];
    char* sb = static_cast<char*>(dm->open_handle(r.send));
    mapped.bases.push_back(sb);
    send[q] = sb + r.send.offset;
    if (std::memcmp(r.send.bytes, r.recv.bytes, sizeof r.send.bytes) == 0) {  // one allocation holds both
      recv[q] = sb + r.recv.offset;
    } else {
      char* rb = static_cast<char*>(dm->open_handle(r.recv));
      mapped.bases.push_back(rb);
      recv[q] = rb + r.recv.offset;
    }
  }
  // Each phase ends with this rank's device work done and every rank past the same point: the next phase
  // (or the caller, which may overwrite its buffers) starts only once peers stopped reading them.
  run_device_reads({.dm = dm,
                    .args = &a,
                    .rank = rank_,
                    .size = size_,
                    .send = std::move(send),
                    .recv = std::move(recv),
                    .phase_done = [&] {
                      dm->synchronize();
                      barrier(o);
                    }});
  return true;
}

namespace {
// The error of a call that failed on the device lane, of the same type, led by the call the user issued (the
// lane's own error names its handshake or barrier on the lane's group).
std::exception_ptr naming_the_call(std::exception_ptr e, const std::string& call, const std::string& group) {
  return copy_error(std::move(e), fmt::format("{} on the device path of group '{}' failed: ", call, group));
}
}  // namespace

// The device lane: this group's device-path calls, run in the order they were issued on a thread of their
// own, so that an async one returns at once and the caller goes on (a DDP bucket's all-reduce overlaps the
// rest of the backward, as on host buffers). The device path's handshake and phase barriers are collectives,
// and a group runs its collectives one at a time in issue order: on this group's own worker they would wait
// behind the call that needs them. So the lane runs them on a group of its own with the same ranks, made
// once every rank took the device path for the first time (the first call, run on the caller's thread, is
// where all of them know it). Calls on the lane group are blocking calls from the lane's thread: the device
// path, or, where the handshake says some rank cannot share its memory, staging through host memory.
struct ProcessGroup::DeviceLane {
  struct Item {
    CollArgs args;
    std::vector<size_t> counts;  // all_gatherv's, owned here (the caller's vector may be gone)
    CallOptions opts;
    std::shared_ptr<Work> work;
  };
  std::shared_ptr<ProcessGroup> group;
  std::string caller;  // the name of the group whose calls these are
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;  // guarded by mu
  bool stop = false;       // guarded by mu
  std::thread thread;

  DeviceLane(std::shared_ptr<ProcessGroup> g, std::string caller_name)
      : group(std::move(g)), caller(std::move(caller_name)) {
    group->is_lane_ = true;
    thread = std::thread([this] { loop(); });
  }
  // Calls already queued still run (the peers run them too), then the thread ends.
  ~DeviceLane() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  std::shared_ptr<Work> post(const CollArgs& a, const CallOptions& o, std::string description) {
    Item it{a, {}, o, std::make_shared<Work>(std::move(description))};
    if (a.counts != nullptr) it.counts = *a.counts;
    std::shared_ptr<Work> w = it.work;
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(it));
    }
    cv.notify_one();
    return w;
  }
  void loop() {
    for (;;) {
      Item it;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        it = std::move(queue.front());
        queue.pop_front();
      }
      if (it.args.counts != nullptr) it.args.counts = &it.counts;
      it.work->mark_started();
      std::exception_ptr error;
      try {
        group->run_recorded(it.args, it.opts);
      } catch (...) {
        error = naming_the_call(std::current_exception(), it.work->description(), caller);
      }
      it.work->finish(error);
    }
  }
};

std::shared_ptr<ProcessGroup::DeviceLane> ProcessGroup::device_lane() {
  std::lock_guard<std::mutex> lock(lane_mu_);
  return lane_;
}

void ProcessGroup::on_device_path_ran() {
  if (is_lane_) return;
  std::lock_guard<std::mutex> lock(lane_mu_);
  if (lane_) return;
  std::vector<int> everyone(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) everyone[static_cast<size_t>(r)] = r;
  lane_ = std::make_shared<DeviceLane>(make_group(everyone, "device-lane"), name_);
}

void ProcessGroup::abort_device_lane(const std::string& reason) {
  if (const std::shared_ptr<DeviceLane> lane = device_lane()) lane->group->abort(reason);
}
// ---- end device path

// The caller's Work of a staged async call: it completes once the results are back in the caller's memory
// (or with the call's error, or the copy's).
std::shared_ptr<Work> ProcessGroup::after_staging(std::shared_ptr<Work> inner, std::unique_ptr<Staging> staged) {
  auto outer = std::make_shared<Work>(inner->description());
  std::shared_ptr<Staging> st = std::move(staged);
  inner->on_finish([outer, st](Work& w) {
    std::exception_ptr e = w.error();
    if (!e) {
      try {
        st->copy_back();
      } catch (...) {
        e = std::current_exception();
      }
    }
    outer->mark_started(w.started_ns());
    outer->set_source_rank(w.source_rank());
    outer->finish(e);
  });
  return outer;
}
// ---- end device buffers

ProcessGroup::ProcessGroup(int rank, int size, std::string name, Seconds timeout)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_(timeout),
      flight_(flight_recorder::make_ring(name_, rank, size)) {}

std::shared_ptr<RegisteredBuffer> ProcessGroup::alloc_shared(size_t) { return nullptr; }

// ---- flight recorder: every call is recorded here, before the backend sees it, so every backend is covered
uint64_t ProcessGroup::record_enqueue(const CollArgs& a) {
  std::call_once(flight_described_, [&] {  // global_rank() and backend_name() are virtual: not in the ctor
    std::vector<int> ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = global_rank(r);
    flight_->describe(backend_name(), std::move(ranks));
  });
  return flight_->enqueue(a);
}

void ProcessGroup::record_started(const CollArgs& a, uint64_t seq, Algo algo) {
  if (flight_ && a.record) flight_->started(a.record, seq, algo, stamp_clock::now());
}

void ProcessGroup::run_recorded(CollArgs& a, const CallOptions& o) {
  if (device_path_applies(a)) {
    if (const std::shared_ptr<DeviceLane> lane = device_lane()) {  // after the lane's calls issued before it
      lane->post(a, o, describe(a))->wait();
      return;
    }
    if (run_on_device(a, o)) {
      on_device_path_ran();
      return;
    }
  }
  const std::unique_ptr<Staging> staged = stage(a);
  if (!flight_) {
    run_blocking(a, o);
  } else {
    a.record = record_enqueue(a);
    try {
      run_blocking(a, o);
    } catch (...) {
      flight_->finished(a.record, stamp_clock::now(), std::current_exception());
      throw;
    }
    flight_->finished(a.record, stamp_clock::now(), nullptr);
  }
  if (staged) staged->copy_back();
}
// ---- end flight recorder

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  if (ranks.empty()) TRIDENT_THROW(InvalidArgument, "new_group: the rank list is empty");
  std::vector<bool> seen(static_cast<size_t>(size_), false);
  for (int r : ranks) {
    if (r < 0 || r >= size_)
      TRIDENT_THROW(InvalidArgument, "new_group: rank {} is outside group '{}' of size {}", r, name_, size_);
    if (seen[static_cast<size_t>(r)]) TRIDENT_THROW(InvalidArgument, "new_group: rank {} is listed twice", r);
    seen[static_cast<size_t>(r)] = true;
  }
  return make_group(ranks, name);
}

void ProcessGroup::validate(const CollArgs& a) const {
  auto fail = [&](const std::string& why) {
    TRIDENT_THROW(InvalidArgument, "{} on rank {} of group '{}' ({} ranks): {}", describe(a), rank_, name_, size_, why);
  };
  const CollectiveInfo& info = collective_info(a.op);
  if (info.rooted && (a.root < 0 || a.root >= size_)) fail(fmt::format("root {} is outside [0, {})", a.root, size_));
  if (info.point_to_point) {
    if (a.peer == kAnySource && a.op == OpKind::kRecv) {
      if (size_ < 2) fail("a receive from any source needs another rank in the group");
      if (!supports_any_source())
        TRIDENT_THROW(Unsupported, "backend {}: {} on rank {} of group '{}': a receive from any source is not "
                      "supported; name the sending rank (the native backend receives from any source)",
                      backend_name(), describe(a), rank_, name_);
    } else if (a.peer < 0 || a.peer >= size_) {
      fail(fmt::format("peer {} is outside [0, {}){}", a.peer, size_,
                       a.op == OpKind::kRecv ? " (kAnySource receives from any rank)" : ""));
    }
    if (a.peer == rank_) fail("a rank cannot send to or receive from itself");
  }
  if (info.reduces && !reduce_supported(a.dtype, a.redop))
    fail(fmt::format("reduce op {} is not defined on {} (it supports data movement only: broadcast, gather, "
                     "scatter, all_gather, all_to_all, send/recv)",
                     reduce_op_name(a.redop), dtype_name(a.dtype)));
  if (a.op == OpKind::kAllGatherV && (!a.counts || a.counts->size() != static_cast<size_t>(size_)))
    fail(fmt::format("counts has {} entries; it needs one per rank ({})", a.counts ? a.counts->size() : 0, size_));
  // A side this rank reads or writes needs its buffer; an in-place call's one buffer is recv.
  const BufferBytes bytes = buffer_bytes(a, rank_, size_);
  auto need = [&](const void* p, const char* which, size_t nbytes) {
    if (p == nullptr && nbytes > 0) fail(fmt::format("{} buffer is null but count is {}", which, a.count));
  };
  if (info.in_place) {
    // (broadcast's one buffer is `buf` in the API, all_reduce's the receive buffer)
    need(a.recv, info.reduces ? "recv" : "the", std::max(bytes.send, bytes.recv));
  } else {
    need(a.send, "send", bytes.send);
    need(a.recv, "recv", bytes.recv);
  }
}

std::shared_ptr<Work> ProcessGroup::submit(CollArgs args, const CallOptions& opts, bool blocking) {
  validate(args);
  if (device_path_applies(args)) {
    if (const std::shared_ptr<DeviceLane> lane = device_lane()) return lane->post(args, opts, describe(args));
    // The group's first device-path call runs here, on this thread (every rank learns in its handshake
    // whether all can take the path); the Work it returns is done.
    const int64_t t0 = Timeline::now_ns();
    if (run_on_device(args, opts)) {
      on_device_path_ran();
      auto done = std::make_shared<Work>(describe(args));
      done->mark_started(t0);
      done->finish();
      return done;
    }
  }
  std::unique_ptr<Staging> staged = stage(args);
  std::shared_ptr<Work> work;
  if (!flight_) {
    work = post(args, opts, blocking);
  } else {
    args.record = record_enqueue(args);
    try {
      work = post(args, opts, blocking);
    } catch (...) {
      flight_->finished(args.record, stamp_clock::now(), std::current_exception());
      throw;
    }
    work->record_to(flight_, args.record);
  }
  return staged ? after_staging(std::move(work), std::move(staged)) : work;
}

#define TRIDENT_PG_ASYNC_AND_BLOCKING(NAME, PARAMS, ARGS, FILL)                       \
  std::shared_ptr<Work> ProcessGroup::NAME##_async PARAMS {                           \
    CollArgs a;                                                                       \
    FILL;                                                                             \
    return submit(a, o, false);                                                       \
  }                                                                                   \
  void ProcessGroup::NAME PARAMS {                                                    \
    CollArgs a;                                                                       \
    FILL;                                                                             \
    validate(a);                                                                      \
    run_recorded(a, o);                                                               \
  }

TRIDENT_PG_ASYNC_AND_BLOCKING(broadcast, (void* buf, size_t count, DType dtype, int root, const CallOptions& o), _,
                              (a.op = OpKind::kBroadcast, a.recv = buf, a.send = buf, a.count = count,
                               a.dtype = dtype, a.root = root))
TRIDENT_PG_ASYNC_AND_BLOCKING(reduce,
                              (const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
                               const CallOptions& o),
                              _,
                              (a.op = OpKind::kReduce, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype, a.redop = op, a.root = root))
TRIDENT_PG_ASYNC_AND_BLOCKING(all_reduce,
                              (const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               const CallOptions& o),
                              _,
                              (a.op = OpKind::kAllReduce, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype, a.redop = op))
TRIDENT_PG_ASYNC_AND_BLOCKING(gather,
                              (const void* send, void* recv, size_t count, DType dtype, int root, const CallOptions& o),
                              _,
                              (a.op = OpKind::kGather, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype, a.root = root))
TRIDENT_PG_ASYNC_AND_BLOCKING(scatter,
                              (const void* send, void* recv, size_t count, DType dtype, int root, const CallOptions& o),
                              _,
                              (a.op = OpKind::kScatter, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype, a.root = root))
TRIDENT_PG_ASYNC_AND_BLOCKING(all_gather,
                              (const void* send, void* recv, size_t count, DType dtype, const CallOptions& o), _,
                              (a.op = OpKind::kAllGather, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype))
TRIDENT_PG_ASYNC_AND_BLOCKING(all_gatherv,
                              (const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                               const CallOptions& o),
                              _,
                              (a.op = OpKind::kAllGatherV, a.send = send, a.recv = recv,
                               a.count = counts.size() == static_cast<size_t>(size()) ? counts[rank()] : 0,
                               a.counts = &counts, a.dtype = dtype))
TRIDENT_PG_ASYNC_AND_BLOCKING(reduce_scatter,
                              (const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                               const CallOptions& o),
                              _,
                              (a.op = OpKind::kReduceScatter, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype, a.redop = op))
TRIDENT_PG_ASYNC_AND_BLOCKING(all_to_all,
                              (const void* send, void* recv, size_t count, DType dtype, const CallOptions& o), _,
                              (a.op = OpKind::kAllToAll, a.send = send, a.recv = recv, a.count = count,
                               a.dtype = dtype))
TRIDENT_PG_ASYNC_AND_BLOCKING(send,
                              (const void* buf, size_t count, DType dtype, int peer, uint32_t tag,
                               const CallOptions& o),
                              _,
                              (a.op = OpKind::kSend, a.send = buf, a.count = count, a.dtype = dtype, a.peer = peer,
                               a.tag = tag))
TRIDENT_PG_ASYNC_AND_BLOCKING(recv,
                              (void* buf, size_t count, DType dtype, int peer, uint32_t tag, const CallOptions& o),
                              _,
                              (a.op = OpKind::kRecv, a.recv = buf, a.count = count, a.dtype = dtype, a.peer = peer,
                               a.tag = tag))
TRIDENT_PG_ASYNC_AND_BLOCKING(barrier, (const CallOptions& o), _, (a.op = OpKind::kBarrier))

#undef TRIDENT_PG_ASYNC_AND_BLOCKING

}  // namespace trident
