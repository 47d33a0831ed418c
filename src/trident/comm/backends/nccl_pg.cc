#include "trident/comm/backends/nccl_pg.h"

#include "trident/core/error.h"

#ifndef TRIDENT_HAVE_NCCL

namespace trident {

bool nccl_backend_built() { return false; }

std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store>, int, int, const GroupOptions&) {
  TRIDENT_THROW(Unsupported,
                "backend 'nccl' is not built into this trident (CMake found no nvcc or no NCCL); build on a machine "
                "with the CUDA toolkit and NCCL in /usr/local/cuda, or use --backend native");
}

}  // namespace trident

#else  // TRIDENT_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "trident/comm/collective.h"
#include "trident/comm/store/store.h"
#include "trident/core/env.h"
#include "trident/core/log.h"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(Seconds s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(s);
}

void cuda_check(cudaError_t rc, const char* call, const std::string& where) {
  if (rc != cudaSuccess)
    TRIDENT_THROW(NetworkError, "nccl backend: {}: CUDA call {} failed: {} ({})", where, call, cudaGetErrorString(rc),
                  cudaGetErrorName(rc));
}
#define TRIDENT_NCCL_CUDA(call, where) cuda_check((call), #call, (where))

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kFloat16: return ncclFloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  TRIDENT_THROW(InvalidArgument, "nccl backend: dtype {} has no NCCL type", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kProd: return ncclProd;
  }
  TRIDENT_THROW(InvalidArgument, "nccl backend: unknown reduce op");
}

// One enqueued call: its Work completes when `event` has completed on the device.
struct Pending {
  std::shared_ptr<Work> work;
  cudaEvent_t event = nullptr;
  Clock::time_point deadline;
  std::string what;  // "all_reduce(count=7, float32, sum) #12 in group 'world'"
  Seconds timeout{0};
};

class NcclProcessGroup : public ProcessGroup {
 public:
  // World group: the unique id travels through the store.
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& options)
      : ProcessGroup(rank, size, options.name, options.timeout.value_or(Seconds(env::timeout_seconds()))),
        store_(std::move(store)) {
    select_device();
    ncclUniqueId id{};
    const std::string key = fmt::format("nccl/{}/{}/id", name(), store_->add(fmt::format("nccl/{}/gen/{}", name(), rank), 1));
    if (rank == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId", "creating the unique id");
      store_->set(key, Bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
    } else {
      Bytes b = store_->get(key, timeout());
      TRIDENT_CHECK(b.size() == sizeof(id), StoreError,
                    "nccl backend: store key '{}' holds {} bytes, not an ncclUniqueId ({} bytes); another program "
                    "uses the same store prefix",
                    key, b.size(), sizeof(id));
      std::memcpy(&id, b.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    comm_ = comm;
    finish_nccl(rc, "ncclCommInitRankConfig", fmt::format("creating the communicator of group '{}'", name()),
                deadline_after(timeout()));
    start();
  }

  // Subgroup from ncclCommSplit (already complete).
  NcclProcessGroup(ncclComm_t comm, int rank, int size, std::string name, Seconds timeout, int device,
                   std::vector<int> globals)
      : ProcessGroup(rank, size, std::move(name), timeout), device_(device), comm_(comm), globals_(std::move(globals)) {
    TRIDENT_NCCL_CUDA(cudaSetDevice(device_), "creating a subgroup");
    start();
  }

  ~NcclProcessGroup() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Let enqueued calls finish (each has its own deadline, enforced by the watcher).
      idle_cv_.wait(lock, [&] { return pending_.empty(); });
      stop_ = true;
    }
    cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
    cudaSetDevice(device_);
    if (comm_ && !aborted_) {
      ncclResult_t rc = ncclCommFinalize(comm_);
      ncclResult_t st = rc;
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (st == ncclInProgress && Clock::now() < deadline) {
        ncclCommGetAsyncError(comm_, &st);
        if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (st == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string backend_name() const override { return "nccl"; }
  bool reads_host_memory() const override { return false; }
  bool reads_device_memory() const override { return true; }
  int global_rank(int r) const override { return globals_.empty() ? r : globals_.at(r); }

  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& ranks, const std::string& name) override {
    int index = -1;
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i] == rank()) index = static_cast<int>(i);
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_rank(r));
    return split_impl(index >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, index >= 0 ? index : 0,
                      name.empty() ? fmt::format("{}.g{}", this->name(), ++splits_) : name, std::move(globals));
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    return split_impl(color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                      fmt::format("{}.s{}c{}", name(), ++splits_, color), {});
  }

  void abort(const std::string& reason) override {
    fail(std::make_exception_ptr(NetworkError(fmt::format("nccl backend: group '{}' aborted: {}", name(), reason),
                                              rank(), -1, "abort")));
  }

 protected:
  std::shared_ptr<Work> post(const CollArgs& a, const CallOptions& opts, bool blocking) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) std::rethrow_exception(failed_);
    const long seq = ++seq_;
    Pending p;
    p.timeout = opts.timeout.value_or(timeout());
    p.deadline = deadline_after(p.timeout);
    p.what = fmt::format("{} #{} in group '{}' (rank {} of {})", describe(a), seq, name(), rank(), size());
    // Buffers a rank does not use (recv of reduce/gather and send of scatter off the root) are not checked.
    const BufferBytes used = buffer_bytes(a, rank(), size());
    if (used.send > 0) check_device_buffer(a.send, a, "send");
    if (used.recv > 0) check_device_buffer(a.recv, a, "recv");
    TRIDENT_NCCL_CUDA(cudaSetDevice(device_), p.what);
    enqueue(a, p);
    TRIDENT_NCCL_CUDA(cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming), p.what);
    TRIDENT_NCCL_CUDA(cudaEventRecord(p.event, stream_), p.what);
    p.work = std::make_shared<Work>(p.what);
    auto work = p.work;
    pending_.push_back(std::move(p));
    lock.unlock();
    cv_.notify_all();
    return work;
  }

 private:
  void select_device() {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
      cudaGetLastError();
      TRIDENT_THROW(NetworkError,
                    "nccl backend: no usable CUDA device on rank {} ({}); run with --backend native on machines "
                    "without GPUs",
                    rank(), rc != cudaSuccess ? cudaGetErrorString(rc) : "cudaGetDeviceCount = 0");
    }
    device_ = rank() % n;
    TRIDENT_NCCL_CUDA(cudaSetDevice(device_), "selecting the device");
  }

  void start() {
    const std::string where = fmt::format("setting up group '{}'", name());
    // A blocking stream: ordered with the legacy default stream (work queued there before a call runs
    // first, work queued there after a call waits for it), so cudaMemset/kernels on stream 0 need no sync.
    TRIDENT_NCCL_CUDA(cudaStreamCreate(&stream_), where);
    TRIDENT_NCCL_CUDA(cudaMalloc(&scratch_, 16), where);
    watcher_ = std::thread([this] { watch(); });
  }

  // A non-success result becomes NetworkError naming NCCL's result string and last error. In non-blocking
  // mode a call may answer ncclInProgress: poll the communicator until it settles or the deadline passes.
  void finish_nccl(ncclResult_t rc, const char* call, const std::string& where, Clock::time_point deadline) {
    if (rc == ncclInProgress) {
      while (true) {
        ncclResult_t st = ncclInProgress;
        ncclCommGetAsyncError(comm_, &st);
        if (st != ncclInProgress) {
          rc = st;
          break;
        }
        if (Clock::now() > deadline) {
          ncclCommAbort(comm_);
          aborted_ = true;
          TRIDENT_THROW(TimeoutError, "nccl backend: {}: {} did not complete before its deadline; the communicator "
                                      "was aborted (ncclCommAbort). Check that every rank reached this call",
                        where, call);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    check(rc, call, where);
  }

  void check(ncclResult_t rc, const char* call, const std::string& where) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    TRIDENT_THROW(NetworkError, "nccl backend: {}: {} failed: {} ({})", where, call, ncclGetErrorString(rc),
                  last && *last ? last : "no further detail from NCCL");
  }

  void check_device_buffer(const void* p, const CollArgs& a, const char* which) {
    if (!p) return;
    cudaPointerAttributes attr{};
    cudaError_t rc = cudaPointerGetAttributes(&attr, p);
    if (rc != cudaSuccess) cudaGetLastError();
    if (rc != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged))
      TRIDENT_THROW(InvalidArgument,
                    "nccl backend: {}: the {} buffer {} is host memory; NCCL needs device memory (cudaMalloc) — copy "
                    "it to the GPU or use --backend native for host buffers",
                    describe(a), which, p);
  }

  // NCCL before 2.29.7 drops the last elements of a one-rank ncclAvg (its oneRankReduce kernel splits
  // the range with floor division: NVIDIA/nccl#1950). The average of one rank is its sum, so a group of
  // one uses ncclSum (a plain copy) instead.
  ncclRedOp_t one_rank_safe(ReduceOp op) const {
    if (size() == 1 && op == ReduceOp::kAvg) return ncclSum;
    return nccl_op(op);
  }

  // Enqueues the NCCL calls of one collective on stream_ (mu_ held).
  void enqueue(const CollArgs& a, const Pending& p) {
    const ncclDataType_t dt = nccl_dtype(a.dtype);
    const size_t esz = dtype_size(a.dtype);
    const size_t n = a.count;
    auto at = [&](const void* base, size_t elems) {
      return static_cast<const char*>(base) + elems * esz;
    };
    auto atw = [&](void* base, size_t elems) { return static_cast<char*>(base) + elems * esz; };
    ncclResult_t rc = ncclSuccess;
    const char* call = "";
    auto grouped = [&](auto&& body) {
      call = "ncclGroupStart/ncclGroupEnd";
      check(ncclGroupStart(), "ncclGroupStart", p.what);
      ncclResult_t inner = body();
      ncclResult_t end = ncclGroupEnd();
      return inner != ncclSuccess && inner != ncclInProgress ? inner : end;
    };
    const int P = size();
    switch (a.op) {
      case OpKind::kBroadcast:
        call = "ncclBroadcast";
        rc = ncclBroadcast(a.recv, a.recv, n, dt, a.root, comm_, stream_);
        break;
      case OpKind::kReduce:
        call = "ncclReduce";
        rc = ncclReduce(a.send, a.recv, n, dt, one_rank_safe(a.redop), a.root, comm_, stream_);
        break;
      case OpKind::kAllReduce:
        call = "ncclAllReduce";
        rc = ncclAllReduce(a.send ? a.send : a.recv, a.recv, n, dt, one_rank_safe(a.redop), comm_, stream_);
        break;
      case OpKind::kAllGather:
        call = "ncclAllGather";
        rc = ncclAllGather(a.send, a.recv, n, dt, comm_, stream_);
        break;
      case OpKind::kReduceScatter:
        call = "ncclReduceScatter";
        rc = ncclReduceScatter(a.send, a.recv, n, dt, one_rank_safe(a.redop), comm_, stream_);
        break;
      case OpKind::kGather:
        rc = grouped([&] {
          ncclResult_t r = ncclSend(a.send, n, dt, a.root, comm_, stream_);
          if (rank() == a.root)
            for (int q = 0; q < P && r == ncclSuccess; ++q) r = ncclRecv(atw(a.recv, q * n), n, dt, q, comm_, stream_);
          return r;
        });
        break;
      case OpKind::kScatter:
        rc = grouped([&] {
          ncclResult_t r = ncclSuccess;
          if (rank() == a.root)
            for (int q = 0; q < P && r == ncclSuccess; ++q) r = ncclSend(at(a.send, q * n), n, dt, q, comm_, stream_);
          if (r == ncclSuccess) r = ncclRecv(a.recv, n, dt, a.root, comm_, stream_);
          return r;
        });
        break;
      case OpKind::kAllToAll:
        rc = grouped([&] {
          ncclResult_t r = ncclSuccess;
          for (int q = 0; q < P && r == ncclSuccess; ++q) {
            r = ncclSend(at(a.send, q * n), n, dt, q, comm_, stream_);
            if (r == ncclSuccess) r = ncclRecv(atw(a.recv, q * n), n, dt, q, comm_, stream_);
          }
          return r;
        });
        break;
      case OpKind::kAllGatherV:
        rc = grouped([&] {
          ncclResult_t r = ncclSuccess;
          size_t off = 0;
          for (int q = 0; q < P && r == ncclSuccess; ++q) {
            const size_t c = (*a.counts)[q];
            r = ncclBroadcast(q == rank() ? a.send : nullptr, atw(a.recv, off), c, dt, q, comm_, stream_);
            off += c;
          }
          return r;
        });
        break;
      case OpKind::kSend:
        call = "ncclSend";
        rc = ncclSend(a.send, n, dt, a.peer, comm_, stream_);
        break;
      case OpKind::kRecv:
        call = "ncclRecv";
        rc = ncclRecv(a.recv, n, dt, a.peer, comm_, stream_);
        break;
      case OpKind::kBarrier:
        call = "ncclAllReduce (barrier)";
        rc = ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
        break;
    }
    finish_nccl(rc, call, p.what, p.deadline);
  }

  std::shared_ptr<ProcessGroup> split_impl(int color, int key, std::string child_name, std::vector<int> globals) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) std::rethrow_exception(failed_);
    idle_cv_.wait(lock, [&] { return pending_.empty() || failed_; });
    if (failed_) std::rethrow_exception(failed_);
    TRIDENT_NCCL_CUDA(cudaSetDevice(device_), "ncclCommSplit");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // NCCL writes the child's handle (NULL for NCCL_SPLIT_NOCOLOR) from its own thread, possibly after this
    // call returns: the slot is therefore never freed (one pointer per split). Freeing it right after a
    // NOCOLOR split was followed by heap corruption ("malloc(): unaligned tcache chunk") on the H100.
    auto* slot = new ncclComm_t(nullptr);
    const std::string where = fmt::format("splitting group '{}' into '{}'", name(), child_name);
    finish_nccl(ncclCommSplit(comm_, color, key, slot, &config), "ncclCommSplit", where, deadline_after(timeout()));
    if (color == NCCL_SPLIT_NOCOLOR) return nullptr;
    // Non-blocking mode: NCCL stores the child's handle from its own thread when the split has progressed
    // far enough, and the child may still be initializing after that: wait for both, with a deadline.
    ncclResult_t st = ncclInProgress;
    const auto deadline = deadline_after(timeout());
    while (true) {
      ncclComm_t c = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
      if (c) {
        ncclCommGetAsyncError(c, &st);
        if (st != ncclInProgress) break;
      } else {
        ncclResult_t parent = ncclSuccess;
        ncclCommGetAsyncError(comm_, &parent);
        if (parent != ncclSuccess && parent != ncclInProgress) check(parent, "ncclCommSplit", where);
      }
      if (Clock::now() > deadline) {
        if (c) ncclCommAbort(c);
        TRIDENT_THROW(TimeoutError, "nccl backend: {}: the new communicator did not finish initializing before the "
                                    "deadline (did every rank of the group call split/new_group?)",
                      where);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ncclComm_t child = *slot;
    if (st != ncclSuccess) {
      ncclCommAbort(child);
      check(st, "ncclCommSplit", where);
    }
    int r = 0, n = 0;
    check(ncclCommUserRank(child, &r), "ncclCommUserRank", where);
    check(ncclCommCount(child, &n), "ncclCommCount", where);
    if (!globals.empty() && static_cast<int>(globals.size()) != n) globals.clear();
    return std::make_shared<NcclProcessGroup>(child, r, n, std::move(child_name), timeout(), device_,
                                              std::move(globals));
  }

  // Fails the group once: aborts the communicator and every pending Work (idempotent).
  void fail(std::exception_ptr e) {
    std::deque<Pending> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) failed_ = e;
      if (comm_ && !aborted_) {
        ncclCommAbort(comm_);
        aborted_ = true;
      }
      dropped.swap(pending_);
    }
    for (Pending& p : dropped) {
      p.work->finish(failed_);
      if (p.event) cudaEventDestroy(p.event);
    }
    idle_cv_.notify_all();
    cv_.notify_all();
  }

  // Watcher thread: completes Works in issue order as their events complete; enforces deadlines; turns
  // asynchronous NCCL errors into a failed group.
  void watch() {
    cudaSetDevice(device_);
    int idle_polls = 0;
    while (true) {
      Pending front;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        if (pending_.empty()) {
          if (stop_) return;
          continue;
        }
        front = pending_.front();
      }
      cudaError_t q = cudaEventQuery(front.event);
      if (q == cudaSuccess) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!pending_.empty() && pending_.front().event == front.event) {
          pending_.pop_front();
          lock.unlock();
          cudaEventDestroy(front.event);
          front.work->finish();
          idle_cv_.notify_all();
        }
        idle_polls = 0;
        continue;
      }
      if (q != cudaErrorNotReady) {
        fail(std::make_exception_ptr(NetworkError(
            fmt::format("nccl backend: {}: CUDA reported {} ({}) while it ran", front.what, cudaGetErrorString(q),
                        cudaGetErrorName(q)),
            rank(), -1, "nccl")));
        continue;
      }
      ncclResult_t st = ncclSuccess;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (comm_ && !aborted_) ncclCommGetAsyncError(comm_, &st);
      }
      if (st != ncclSuccess && st != ncclInProgress) {
        const char* last = ncclGetLastError(comm_);
        fail(std::make_exception_ptr(NetworkError(
            fmt::format("nccl backend: {}: NCCL reported {} ({}); the communicator was aborted", front.what,
                        ncclGetErrorString(st), last && *last ? last : "no further detail"),
            rank(), -1, "nccl")));
        continue;
      }
      if (Clock::now() > front.deadline) {
        fail(std::make_exception_ptr(TimeoutError(
            fmt::format("nccl backend: {} did not finish within {:.3f}s; the communicator was aborted "
                        "(ncclCommAbort) and the group fails every later call. Check that every rank issued it",
                        front.what, front.timeout.count()),
            rank(), "nccl")));
        continue;
      }
      // Spin briefly (collectives of small buffers finish in microseconds), then back off.
      if (++idle_polls < 2000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::shared_ptr<Store> store_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<int> globals_;
  std::atomic<int> splits_{0};

  std::mutex mu_;
  std::condition_variable cv_;       // watcher: new pending or stop
  std::condition_variable idle_cv_;  // pending_ drained
  std::deque<Pending> pending_;
  std::exception_ptr failed_;
  bool aborted_ = false;
  bool stop_ = false;
  long seq_ = 0;
  std::thread watcher_;
};

}  // namespace

bool nccl_backend_built() { return true; }

std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     const GroupOptions& options) {
  TRIDENT_CHECK(store, InvalidArgument, "nccl backend: a store is needed to exchange the NCCL unique id");
  TRIDENT_CHECK(rank >= 0 && rank < size, InvalidArgument, "nccl backend: rank {} is outside [0, {})", rank, size);
  auto pg = std::make_shared<NcclProcessGroup>(std::move(store), rank, size, options);
  log_debug("comm", "nccl backend: group '{}' rank {} of {} ready", pg->name(), rank, size);
  return pg;
}

}  // namespace trident

#endif  // TRIDENT_HAVE_NCCL
