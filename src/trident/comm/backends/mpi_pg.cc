#include "trident/comm/backends/mpi_pg.h"

#include "trident/core/error.h"

#ifndef TRIDENT_HAVE_MPI

namespace trident {

bool mpi_backend_built() { return false; }

std::shared_ptr<ProcessGroup> new_mpi_world_group(const GroupOptions&) {
  TRIDENT_THROW(Unsupported,
                "backend 'mpi' is not built into this trident (CMake found no MPI); install libopenmpi-dev and "
                "rebuild, or use --backend native");
}

std::shared_ptr<ProcessGroup> new_mpi_process_group(int, int, const GroupOptions& options) {
  return new_mpi_world_group(options);
}

}  // namespace trident

#else  // TRIDENT_HAVE_MPI

// C bindings only (no libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "trident/comm/collective.h"
#include "trident/comm/reduce.h"
#include "trident/core/env.h"
#include "trident/core/log.h"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

// ---- process-wide MPI state ----

struct Runtime {
  bool we_initialized = false;  // trident called MPI_Init_thread (and so finalizes at exit)
  bool multiple = false;        // MPI_THREAD_MULTIPLE: no serialization needed
  int provided = MPI_THREAD_SINGLE;
  std::mutex mu;                // serializes every MPI call when !multiple
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype fp16 = MPI_DATATYPE_NULL;
  MPI_Op ops[2][4] = {};        // [bf16, fp16][sum, max, min, prod]
  int tag_ub = 32767;
  // Requests of failed calls that MPI could not cancel (their memory is leaked on purpose). At exit,
  // MPI_Finalize runs only if every one of them has completed meanwhile: it could hang on one that has not.
  std::mutex abandoned_mu;
  std::vector<MPI_Request*> abandoned;
};

void abandon(Runtime& rt, MPI_Request* req) {
  std::lock_guard<std::mutex> lock(rt.abandoned_mu);
  rt.abandoned.push_back(req);
}

Runtime* g_runtime = nullptr;
std::once_flag g_once;

// Holds the serialization mutex for one MPI call when MPI is not thread-multiple.
class MpiLock {
 public:
  explicit MpiLock(Runtime& rt) : lock_(rt.mu, std::defer_lock) {
    if (!rt.multiple) lock_.lock();
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING + 1] = {};
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

// Wraps an MPI call at its call site: serialized when needed, a failing return code becomes NetworkError.
#define TRIDENT_MPI(rt, call, what)                                                                          \
  do {                                                                                                       \
    int trident_mpi_rc_;                                                                                     \
    {                                                                                                        \
      MpiLock trident_mpi_lock_(rt);                                                                         \
      trident_mpi_rc_ = (call);                                                                              \
    }                                                                                                        \
    if (trident_mpi_rc_ != MPI_SUCCESS)                                                                      \
      TRIDENT_THROW(NetworkError, "{}: {} failed: {}", what, #call, mpi_error_string(trident_mpi_rc_));     \
  } while (0)

// User-defined reductions for the 2-byte floats: widen to float32, combine, round (trident's kernels).
template <DType T, ReduceOp Op>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<size_t>(*len), T, Op);
}

void finalize_at_exit() {
  Runtime* rt = g_runtime;
  if (!rt || !rt->we_initialized) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  size_t still_pending = 0;
  {
    // Give requests whose peers joined late a moment to complete (up to 1 s), then decide.
    std::lock_guard<std::mutex> lock(rt->abandoned_mu);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    do {
      still_pending = 0;
      for (MPI_Request* req : rt->abandoned) {
        int flag = 0;
        if (*req != MPI_REQUEST_NULL && (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag))
          ++still_pending;
      }
      if (still_pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (still_pending > 0 && Clock::now() < deadline);
  }
  if (still_pending > 0) {
    // A collective that never completed is still posted; MPI_Finalize could wait for it forever.
    log_warn("mpi backend: skipping MPI_Finalize at exit: {} request(s) of failed calls are still pending and MPI "
             "cannot cancel them (mpirun may report that this process exited without finalizing)",
             still_pending);
    return;
  }
  for (auto& row : rt->ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  if (rt->bf16 != MPI_DATATYPE_NULL) MPI_Type_free(&rt->bf16);
  if (rt->fp16 != MPI_DATATYPE_NULL) MPI_Type_free(&rt->fp16);
  MPI_Finalize();
}

void init_runtime() {
  auto* rt = new Runtime();  // lives until exit: MPI handles must outlive every group
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    TRIDENT_THROW(Unsupported, "backend mpi: MPI was already finalized in this process; create MPI groups before "
                               "MPI_Finalize");
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &rt->provided);
    if (rc != MPI_SUCCESS)
      TRIDENT_THROW(NetworkError, "backend mpi: MPI_Init_thread failed: {} (start the ranks with mpirun)",
                    mpi_error_string(rc));
    rt->we_initialized = true;
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&rt->provided);
  }
  // TRIDENT_MPI_SERIALIZE=1 takes the serialized path even when MPI is thread-multiple (tests, debugging).
  rt->multiple = rt->provided >= MPI_THREAD_MULTIPLE && !env::mpi_serialize();
  if (rt->provided < MPI_THREAD_SERIALIZED)
    log_warn("mpi backend: MPI provides only {}; trident calls MPI from its worker threads too (serialized "
             "through one mutex), which such an MPI does not promise to support",
             thread_level_name(rt->provided));
  log_debug("comm", "mpi backend: MPI {} by {}; thread level {}: {}", initialized ? "already initialised" : "initialised",
            initialized ? "the application" : "trident", thread_level_name(rt->provided),
            rt->multiple ? "MPI calls run concurrently"
                         : "every MPI call is serialized through one mutex (thread level, or TRIDENT_MPI_SERIALIZE=1)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  MPI_Type_contiguous(1, MPI_UINT16_T, &rt->bf16);
  MPI_Type_commit(&rt->bf16);
  MPI_Type_contiguous(1, MPI_UINT16_T, &rt->fp16);
  MPI_Type_commit(&rt->fp16);
  MPI_Op_create(&user_reduce<DType::kBFloat16, ReduceOp::kSum>, 1, &rt->ops[0][0]);
  MPI_Op_create(&user_reduce<DType::kBFloat16, ReduceOp::kMax>, 1, &rt->ops[0][1]);
  MPI_Op_create(&user_reduce<DType::kBFloat16, ReduceOp::kMin>, 1, &rt->ops[0][2]);
  MPI_Op_create(&user_reduce<DType::kBFloat16, ReduceOp::kProd>, 1, &rt->ops[0][3]);
  MPI_Op_create(&user_reduce<DType::kFloat16, ReduceOp::kSum>, 1, &rt->ops[1][0]);
  MPI_Op_create(&user_reduce<DType::kFloat16, ReduceOp::kMax>, 1, &rt->ops[1][1]);
  MPI_Op_create(&user_reduce<DType::kFloat16, ReduceOp::kMin>, 1, &rt->ops[1][2]);
  MPI_Op_create(&user_reduce<DType::kFloat16, ReduceOp::kProd>, 1, &rt->ops[1][3]);
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &flag);
  if (flag && attr) rt->tag_ub = *static_cast<int*>(attr);
  g_runtime = rt;
}

Runtime& runtime() {
  std::call_once(g_once, init_runtime);
  return *g_runtime;
}

MPI_Datatype mpi_type(Runtime& rt, DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kBFloat16: return rt.bf16;
    case DType::kFloat16: return rt.fp16;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
  }
  TRIDENT_THROW(InvalidArgument, "backend mpi: unknown dtype {}", static_cast<int>(t));
}

// avg reduces as sum; the group divides by its size afterwards (as the native backend does).
MPI_Op mpi_op(Runtime& rt, DType t, ReduceOp op) {
  int k = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: k = 0; break;
    case ReduceOp::kMax: k = 1; break;
    case ReduceOp::kMin: k = 2; break;
    case ReduceOp::kProd: k = 3; break;
  }
  if (t == DType::kBFloat16) return rt.ops[0][k];
  if (t == DType::kFloat16) return rt.ops[1][k];
  static const MPI_Op kBuiltin[4] = {MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD};
  return kBuiltin[k];
}

int to_int(size_t n, const CollArgs& a, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    TRIDENT_THROW(InvalidArgument,
                  "backend mpi: {}: {} is {} elements, more than MPI's int count ({}); split the call into pieces "
                  "or use --backend native",
                  describe(a), what, n, INT_MAX);
  return static_cast<int>(n);
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  if (!a || !b || an == 0 || bn == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

Seconds resolve_timeout(const GroupOptions& o) { return o.timeout.value_or(Seconds(env::timeout_seconds())); }

// ---- the group ----

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of `comm`.
  MpiProcessGroup(MPI_Comm comm, int rank, int size, const GroupOptions& options)
      : ProcessGroup(rank, size, options.name, resolve_timeout(options)), rt_(runtime()), comm_(comm),
        options_(options) {
    MPI_Group mine, world;
    TRIDENT_MPI(rt_, MPI_Comm_group(comm_, &mine), "backend mpi");
    TRIDENT_MPI(rt_, MPI_Comm_group(MPI_COMM_WORLD, &world), "backend mpi");
    std::vector<int> local(size);
    for (int r = 0; r < size; ++r) local[r] = r;
    global_ranks_.assign(size, -1);
    TRIDENT_MPI(rt_, MPI_Group_translate_ranks(mine, size, local.data(), world, global_ranks_.data()), "backend mpi");
    TRIDENT_MPI(rt_, MPI_Group_free(&mine), "backend mpi");
    TRIDENT_MPI(rt_, MPI_Group_free(&world), "backend mpi");
    TRIDENT_MPI(rt_, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "backend mpi");
    std::string n = options.name.substr(0, MPI_MAX_OBJECT_NAME - 1);
    TRIDENT_MPI(rt_, MPI_Comm_set_name(comm_, n.c_str()), "backend mpi");
    if (rank == 0 && options.name == "world")
      log_info("process group '{}': {} ranks, backend mpi ({})", options.name, size,
               rt_.multiple ? "MPI_THREAD_MULTIPLE" : "MPI calls serialized");
    else
      log_debug("comm", "process group '{}' rank {} of {}: backend mpi", options.name, rank, size);
  }

  ~MpiProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    std::lock_guard<std::mutex> lock(mu_);
    if (!finalized && !failed_ && comm_ != MPI_COMM_NULL) {
      MpiLock l(rt_);
      MPI_Comm_free(&comm_);
    }
  }

  std::string backend_name() const override { return "mpi"; }
  int global_rank(int r) const override { return global_ranks_[r]; }

  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& ranks, const std::string& name) override {
    int k = ++subgroup_counter_;
    std::string n = fmt::format("{}.{}", this->name(), name.empty() ? fmt::format("g{}", k) : name);
    // Every rank arrives (with a deadline) before the blocking MPI_Comm_create, which then returns promptly.
    barrier();
    MPI_Comm sub = MPI_COMM_NULL;
    {
      std::lock_guard<std::mutex> lock(mu_);  // in issue order with the other calls on this group
      throw_if_failed_locked("new_group");
      MPI_Group parent, members;
      TRIDENT_MPI(rt_, MPI_Comm_group(comm_, &parent), "new_group");
      TRIDENT_MPI(rt_, MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &members), "new_group");
      TRIDENT_MPI(rt_, MPI_Comm_create(comm_, members, &sub), "new_group");
      TRIDENT_MPI(rt_, MPI_Group_free(&members), "new_group");
      TRIDENT_MPI(rt_, MPI_Group_free(&parent), "new_group");
    }
    return wrap(sub, n);
  }

  std::shared_ptr<ProcessGroup> split(int color, int key) override {
    int k = ++subgroup_counter_;
    barrier();
    MPI_Comm sub = MPI_COMM_NULL;
    {
      std::lock_guard<std::mutex> lock(mu_);
      throw_if_failed_locked("split");
      TRIDENT_MPI(rt_, MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "split");
    }
    return wrap(sub, fmt::format("{}.s{}c{}", name(), k, color));
  }

  void abort(const std::string& reason) override {
    auto e = std::make_exception_ptr(NetworkError(
        fmt::format("group '{}' (backend mpi) aborted on rank {}: {}", name(), rank(), reason), rank()));
    std::unique_lock<std::mutex> lock(mu_);
    fail_locked(e);
    if (!driving_) drain_failed_locked(lock);
    cv_.notify_all();
  }

 protected:
  std::shared_ptr<Work> post(const CollArgs& args, const CallOptions& opts, bool blocking) override {
    auto op = std::make_unique<Op>();
    op->args = args;
    if (args.counts) {
      op->counts = *args.counts;
      op->args.counts = &op->counts;
    }
    Seconds t = opts.timeout.value_or(timeout());
    op->timeout = t;
    op->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(t);
    op->work = std::make_shared<Work>(fmt::format("{} in group '{}'", describe(args), name()));
    prepare(*op);  // argument checks that throw InvalidArgument to the caller before anything is posted
    auto work = op->work;
    std::unique_lock<std::mutex> lock(mu_);
    const bool collective = !collective_info(args.op).point_to_point;
    op->seq = collective ? next_seq_++ : 0;
    if (failed_) {
      auto e = failed_;
      lock.unlock();
      work->finish(e);
      return work;
    }
    if (log_debug_enabled("comm"))
      log_debug("comm", "group '{}' rank {}: seq {} {} -> MPI", name(), rank(), op->seq, describe(args));
    try {
      if (collective && check_) check_same_collective_locked(*op);
      start(*op);  // posted under mu_: MPI sees this group's calls in issue order
    } catch (...) {
      auto e = std::current_exception();
      fail_locked(e);
      if (!driving_) drain_failed_locked(lock);
      lock.unlock();
      work->finish(e);
      return work;
    }
    pending_.push_back(std::move(op));
    if (blocking && !driving_) {
      driving_ = true;
      lock.unlock();
      drive(work.get());
      lock.lock();
      driving_ = false;
      lock.unlock();
      cv_.notify_all();
      return work;
    }
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    lock.unlock();
    cv_.notify_all();
    return work;
  }

 private:
  struct Op;
  // TRIDENT_MPI_CHECK=1: the native backend's fingerprint check, done the only way MPI allows: every rank
  // all-gathers (seq, op, dtype, reduction, root, count) of its next collective before posting it, under
  // the call's deadline, and a difference raises MismatchError naming the first rank that differs and
  // both calls (MPI would hang, fail with a truncation or, worse, combine the wrong buffers). Costs one
  // small blocking all-gather per collective, also for async calls: a debugging aid, as PyTorch's
  // TORCH_DISTRIBUTED_DEBUG=DETAIL.
  struct Fingerprint {
    uint64_t seq = 0, count = 0;
    int32_t op = 0, dtype = 0, redop = 0, root = 0;
  };
  static_assert(sizeof(Fingerprint) == 32);
  struct Check {  // lives on the heap: a timed-out request is abandoned with its buffers
    Fingerprint mine;
    std::vector<Fingerprint> all;
    MPI_Request req = MPI_REQUEST_NULL;
  };

  void check_same_collective_locked(const Op& op) {
    auto c = std::make_unique<Check>();
    const CollArgs& a = op.args;
    c->mine.seq = op.seq;
    c->mine.count = a.count;
    if (a.counts) c->mine.count = std::accumulate(a.counts->begin(), a.counts->end(), uint64_t{0});
    c->mine.op = static_cast<int32_t>(a.op);
    c->mine.dtype = static_cast<int32_t>(a.dtype);
    c->mine.redop = static_cast<int32_t>(a.redop);
    c->mine.root = a.root;
    c->all.resize(static_cast<size_t>(size()));
    const std::string what = fmt::format("{} (seq {}) in group '{}': TRIDENT_MPI_CHECK", describe(a), op.seq, name());
    TRIDENT_MPI(rt_, MPI_Iallgather(&c->mine, sizeof(Fingerprint), MPI_BYTE, c->all.data(), sizeof(Fingerprint),
                                    MPI_BYTE, comm_, &c->req),
                what);
    for (int idle = 0;; ++idle) {
      int flag = 0;
      TRIDENT_MPI(rt_, MPI_Test(&c->req, &flag, MPI_STATUS_IGNORE), what);
      if (flag) break;
      if (Clock::now() >= op.deadline) {
        abandon(rt_, &c.release()->req);
        throw TimeoutError(
            fmt::format("{}: not every rank reached this collective within {:.3g} s (rank {}); group '{}' is now "
                        "failed: check that every rank issues the same collectives in the same order",
                        what, op.timeout.count(), rank(), name()),
            rank(), op_name(a.op), static_cast<long>(op.seq));
      }
      if (idle > 64) std::this_thread::sleep_for(std::chrono::microseconds(idle > 4096 ? 50 : 0));
    }
    for (int r = 0; r < size(); ++r) {
      const Fingerprint& f = c->all[static_cast<size_t>(r)];
      if (std::memcmp(&f, &c->mine, sizeof f) == 0) continue;
      const std::string theirs = describe(fingerprint_args(f.op, f.dtype, f.redop, f.root, f.count));
      throw MismatchError(
          fmt::format("collective mismatch in group '{}' (backend mpi, TRIDENT_MPI_CHECK): rank {} issued {} as its "
                      "collective #{}, rank {} issued {} as its collective #{}; every rank must issue the same "
                      "collectives in the same order with the same count, dtype, reduction and root",
                      name(), rank(), describe(a), op.seq, r, theirs, f.seq),
          rank(), r, op_name(a.op), static_cast<long>(op.seq));
    }
  }

  struct Op {
    CollArgs args;
    std::vector<size_t> counts;
    std::vector<int> icounts, displs;  // all_gatherv, read by MPI until completion
    std::vector<uint8_t> tmp;          // a copy of an aliased send buffer
    const void* sendbuf = nullptr;     // as passed to MPI (may be MPI_IN_PLACE or tmp)
    int n = 0;                         // count as MPI's int
    bool copy_after = false;           // scatter at root with recv aliasing send: copy root's block out
    MPI_Request req = MPI_REQUEST_NULL;
    bool mpi_done = false;
    uint64_t seq = 0;
    Seconds timeout{0};
    Clock::time_point deadline;
    std::shared_ptr<Work> work;
  };

  std::shared_ptr<ProcessGroup> wrap(MPI_Comm sub, const std::string& n) {
    if (sub == MPI_COMM_NULL) return nullptr;
    int r = 0, s = 0;
    TRIDENT_MPI(rt_, MPI_Comm_rank(sub, &r), "backend mpi");
    TRIDENT_MPI(rt_, MPI_Comm_size(sub, &s), "backend mpi");
    GroupOptions o = options_;
    o.name = n;
    o.timeout = timeout();
    return std::make_shared<MpiProcessGroup>(sub, r, s, o);
  }

  void throw_if_failed_locked(const char* what) {
    if (failed_) {
      try {
        std::rethrow_exception(failed_);
      } catch (const std::exception& e) {
        TRIDENT_THROW(NetworkError, "{} on group '{}' (backend mpi): the group failed earlier: {}", what, name(),
                      e.what());
      }
    }
  }

  // Checks what MPI cannot take (int counts, tag range) before a sequence number is spent.
  void prepare(Op& op) {
    const CollArgs& a = op.args;
    const int sz = size();
    const CollectiveInfo& info = collective_info(a.op);
    if (a.op == OpKind::kAllGatherV) {  // MPI's per-rank counts and displacements
      size_t total = 0;
      for (size_t c : op.counts) {
        op.icounts.push_back(to_int(c, a, "a rank's count"));
        op.displs.push_back(to_int(total, a, "a displacement"));
        total += c;
      }
      to_int(total, a, "the total count");
      op.n = op.icounts[rank()];
      return;
    }
    // A buffer of one block per rank must fit MPI's int count too.
    if (info.size == Extent::kCountTimesWorld && a.count > 0 &&
        a.count > static_cast<size_t>(INT_MAX) / static_cast<size_t>(sz))
      to_int(a.count * static_cast<size_t>(sz), a, "count x size");
    if (info.point_to_point && a.tag > static_cast<uint32_t>(rt_.tag_ub))
      TRIDENT_THROW(InvalidArgument, "backend mpi: {}: tag {} is above this MPI's largest tag (MPI_TAG_UB = {})",
                    describe(a), a.tag, rt_.tag_ub);
    op.n = to_int(a.count, a, "count");
  }

  // Posts the non-blocking MPI call. Called under mu_.
  void start(Op& op) {
    const CollArgs& a = op.args;
    const size_t es = dtype_size(a.dtype);
    const int n = op.n, sz = size(), me = rank();
    MPI_Datatype T = mpi_type(rt_, a.dtype);
    auto* recv = static_cast<uint8_t*>(a.recv);
    const std::string what = fmt::format("{} (seq {}) in group '{}' (backend mpi)", describe(a), op.seq, name());
    // Gather-like: the rank's own block belongs at recv + off; an aliased send moves there and goes IN_PLACE.
    auto in_place_block = [&](size_t off_elems, size_t recv_elems) -> const void* {
      if (n > 0 && overlaps(a.send, a.count * es, recv, recv_elems * es)) {
        std::memmove(recv + off_elems * es, a.send, a.count * es);
        return MPI_IN_PLACE;
      }
      return a.send;
    };
    switch (a.op) {
      case OpKind::kBroadcast:
        TRIDENT_MPI(rt_, MPI_Ibcast(a.recv, n, T, a.root, comm_, &op.req), what);
        break;
      case OpKind::kReduce: {
        const void* s = (me == a.root && a.send == a.recv && n > 0) ? MPI_IN_PLACE : a.send;
        TRIDENT_MPI(rt_, MPI_Ireduce(s, a.recv, n, T, mpi_op(rt_, a.dtype, a.redop), a.root, comm_, &op.req), what);
        break;
      }
      case OpKind::kAllReduce: {
        const void* s = (a.send == a.recv || a.send == nullptr) ? MPI_IN_PLACE : a.send;
        TRIDENT_MPI(rt_, MPI_Iallreduce(s, a.recv, n, T, mpi_op(rt_, a.dtype, a.redop), comm_, &op.req), what);
        break;
      }
      case OpKind::kGather: {
        const void* s = me == a.root ? in_place_block(static_cast<size_t>(me) * a.count, a.count * sz) : a.send;
        TRIDENT_MPI(rt_, MPI_Igather(s, n, T, a.recv, n, T, a.root, comm_, &op.req), what);
        break;
      }
      case OpKind::kScatter: {
        void* r = a.recv;
        if (me == a.root && n > 0 && overlaps(a.recv, a.count * es, a.send, a.count * sz * es)) {
          r = MPI_IN_PLACE;  // the root's block stays in send; copied out once MPI is done with send
          op.copy_after = a.recv != static_cast<const uint8_t*>(a.send) + static_cast<size_t>(me) * a.count * es;
        }
        TRIDENT_MPI(rt_, MPI_Iscatter(a.send, n, T, r, n, T, a.root, comm_, &op.req), what);
        break;
      }
      case OpKind::kAllGather: {
        const void* s = in_place_block(static_cast<size_t>(me) * a.count, a.count * sz);
        TRIDENT_MPI(rt_, MPI_Iallgather(s, n, T, a.recv, n, T, comm_, &op.req), what);
        break;
      }
      case OpKind::kAllGatherV: {
        size_t total = static_cast<size_t>(op.displs.back()) + static_cast<size_t>(op.icounts.back());
        const void* s = in_place_block(static_cast<size_t>(op.displs[me]), total);
        TRIDENT_MPI(rt_, MPI_Iallgatherv(s, n, T, a.recv, op.icounts.data(), op.displs.data(), T, comm_, &op.req),
                    what);
        break;
      }
      case OpKind::kReduceScatter: {
        const void* s = a.send;
        if (a.send == a.recv && n > 0) {
          s = MPI_IN_PLACE;  // input in recv[count*size], result in its first block
        } else if (overlaps(a.send, a.count * sz * es, a.recv, a.count * es)) {
          op.tmp.assign(static_cast<const uint8_t*>(a.send), static_cast<const uint8_t*>(a.send) + a.count * sz * es);
          s = op.tmp.data();
        }
        TRIDENT_MPI(rt_, MPI_Ireduce_scatter_block(s, a.recv, n, T, mpi_op(rt_, a.dtype, a.redop), comm_, &op.req),
                    what);
        break;
      }
      case OpKind::kAllToAll: {
        const void* s = a.send;
        if (overlaps(a.send, a.count * sz * es, a.recv, a.count * sz * es)) {
          op.tmp.assign(static_cast<const uint8_t*>(a.send), static_cast<const uint8_t*>(a.send) + a.count * sz * es);
          s = op.tmp.data();
        }
        TRIDENT_MPI(rt_, MPI_Ialltoall(s, n, T, a.recv, n, T, comm_, &op.req), what);
        break;
      }
      case OpKind::kSend:
        TRIDENT_MPI(rt_, MPI_Isend(a.send, n, T, a.peer, static_cast<int>(a.tag), comm_, &op.req), what);
        break;
      case OpKind::kRecv:
        TRIDENT_MPI(rt_, MPI_Irecv(a.recv, n, T, a.peer, static_cast<int>(a.tag), comm_, &op.req), what);
        break;
      case OpKind::kBarrier:
        TRIDENT_MPI(rt_, MPI_Ibarrier(comm_, &op.req), what);
        break;
    }
  }

  // After MPI completed the request: the parts MPI does not do.
  void complete(Op& op) {
    const CollArgs& a = op.args;
    const size_t es = dtype_size(a.dtype);
    if (op.copy_after)
      std::memmove(a.recv, static_cast<const uint8_t*>(a.send) + static_cast<size_t>(rank()) * a.count * es,
                   a.count * es);
    if (a.redop == ReduceOp::kAvg && size() > 1 && a.count > 0) {
      // Every rank that receives a reduction's result (a reduce's root only) divides it.
      if (collective_info(a.op).reduces && buffer_bytes(a, rank(), size()).recv > 0)
        scale_divide(a.recv, a.count, a.dtype, size());
    }
  }

  // Records the group's first error. Under mu_.
  void fail_locked(std::exception_ptr e) {
    if (!failed_) failed_ = e;
  }

  // Fails every pending op with the group's error. Their MPI requests may still be active and read their
  // buffers (tmp, counts): the ops are deliberately leaked. Under mu_ (held by `lock`), with no driver.
  void drain_failed_locked(std::unique_lock<std::mutex>&) {
    if (pending_.empty()) return;
    std::vector<std::shared_ptr<Work>> works;
    while (!pending_.empty()) {
      Op* op = pending_.front().release();
      pending_.pop_front();
      works.push_back(op->work);
      if (op->mpi_done) delete op;
      else abandon(rt_, &op->req);  // leaked on purpose: MPI may still use its buffers
    }
    for (auto& w : works) w->finish(failed_);
  }

  // Polls the pending requests with MPI_Test and completes their Works (collectives in issue order, sends
  // and receives when finished), until `until` has finished (or, with null, until nothing is pending).
  // The caller holds the driver role (driving_).
  void drive(const Work* until) {
    std::vector<Op*> ops;
    auto last_progress = Clock::now();
    int idle = 0;
    for (;;) {
      ops.clear();
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (failed_) {
          drain_failed_locked(lock);
          return;
        }
        if (pending_.empty()) return;
        for (auto& p : pending_) ops.push_back(p.get());
      }
      bool progressed = false;
      for (Op* op : ops) {
        if (op->mpi_done) continue;
        int flag = 0;
        int rc;
        {
          MpiLock l(rt_);
          rc = MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
        }
        if (rc != MPI_SUCCESS) {
          auto e = std::make_exception_ptr(NetworkError(
              fmt::format("{} (seq {}) in group '{}' (backend mpi) failed on rank {}: MPI_Test: {}",
                          describe(op->args), op->seq, name(), rank(), mpi_error_string(rc)),
              rank(), -1, op_name(op->args.op), static_cast<long>(op->seq)));
          fail_and_drain(e);
          return;
        }
        if (flag) op->mpi_done = progressed = true;
      }
      // Complete what MPI finished: collectives in issue order (one waits for every earlier collective),
      // sends and receives as soon as they finished (a send's Work does not wait for an earlier receive
      // whose message has not arrived; MPI progresses every posted request meanwhile).
      bool reached = false;
      for (;;) {
        std::unique_ptr<Op> head;
        {
          std::lock_guard<std::mutex> lock(mu_);
          bool earlier_collective = false;  // an earlier collective is still running
          for (auto it = pending_.begin(); it != pending_.end(); ++it) {
            const bool p2p = collective_info((*it)->args.op).point_to_point;
            if ((*it)->mpi_done && (p2p || !earlier_collective)) {
              head = std::move(*it);
              pending_.erase(it);
              break;
            }
            if (!(*it)->mpi_done && !p2p) earlier_collective = true;
          }
          if (!head) break;
        }
        std::exception_ptr err;
        try {
          complete(*head);
        } catch (...) {
          err = std::current_exception();
        }
        head->work->finish(err);
        if (head->work.get() == until) reached = true;
        if (err) {
          fail_and_drain(err);
          return;
        }
      }
      if (reached) return;
      const auto now = Clock::now();
      if (progressed) {
        last_progress = now;
        idle = 0;
        continue;
      }
      for (Op* op : ops) {
        if (op->mpi_done || now < op->deadline) continue;
        const CollArgs& a = op->args;
        std::string peer = collective_info(a.op).point_to_point
                               ? fmt::format(" (peer {})", a.peer)
                               : std::string();
        auto e = std::make_exception_ptr(TimeoutError(
            fmt::format("{}{} (seq {}) in group '{}' (backend mpi, {} ranks) timed out after {:.3g} s on rank {}; MPI "
                        "cannot cancel a posted collective, so group '{}' is now failed and every later call on it "
                        "fails at once: check that every rank issues the same collectives in the same order, raise "
                        "the timeout (CallOptions::timeout, GroupOptions::timeout or TRIDENT_TIMEOUT), and restart "
                        "the job",
                        describe(a), peer, op->seq, name(), size(), op->timeout.count(), rank(), name()),
            rank(), op_name(a.op), static_cast<long>(op->seq)));
        fail_and_drain(e);
        return;
      }
      // Spin briefly, then yield (ranks may share cores), then sleep a little on long waits.
      if (++idle < 64) continue;
      if (now - last_progress < std::chrono::milliseconds(2)) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void fail_and_drain(std::exception_ptr e) {
    std::unique_lock<std::mutex> lock(mu_);
    fail_locked(e);
    drain_failed_locked(lock);
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return (stop_ && pending_.empty()) || (!pending_.empty() && !driving_); });
      if (pending_.empty() && stop_) return;
      if (pending_.empty() || driving_) continue;
      driving_ = true;
      lock.unlock();
      drive(nullptr);
      lock.lock();
      driving_ = false;
      cv_.notify_all();
    }
  }

  Runtime& rt_;
  MPI_Comm comm_;
  const bool check_ = env::mpi_check();
  GroupOptions options_;
  std::vector<int> global_ranks_;
  int subgroup_counter_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Op>> pending_;
  bool driving_ = false;  // one thread polls the FIFO at a time (a blocking caller or the worker)
  bool stop_ = false;
  std::exception_ptr failed_;
  uint64_t next_seq_ = 1;
  std::thread worker_;
};

// MPI_Comm_idup of MPI_COMM_WORLD, polled against the deadline (nothing waits forever).
MPI_Comm dup_world(Runtime& rt, Seconds timeout) {
  auto* comm = new MPI_Comm(MPI_COMM_NULL);  // heap: MPI writes them even after an abandoned wait
  auto* req = new MPI_Request(MPI_REQUEST_NULL);
  TRIDENT_MPI(rt, MPI_Comm_idup(MPI_COMM_WORLD, comm, req), "backend mpi: creating the world group");
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  for (int i = 0;; ++i) {
    int flag = 0;
    TRIDENT_MPI(rt, MPI_Test(req, &flag, MPI_STATUS_IGNORE), "backend mpi: creating the world group");
    if (flag) {
      MPI_Comm c = *comm;
      delete comm;
      delete req;
      return c;
    }
    if (Clock::now() > deadline) {
      abandon(rt, req);
      TRIDENT_THROW(TimeoutError,
                    "backend mpi: creating the world group (MPI_Comm_idup of MPI_COMM_WORLD) timed out after {:.3g} s: "
                    "not every rank started it; check that all ranks were launched by the same mpirun",
                    timeout.count());
    }
    if (i > 64) sched_yield();
  }
}

}  // namespace

bool mpi_backend_built() { return true; }

std::shared_ptr<ProcessGroup> new_mpi_world_group(const GroupOptions& options) {
  Runtime& rt = runtime();
  int rank = 0, size = 0;
  TRIDENT_MPI(rt, MPI_Comm_rank(MPI_COMM_WORLD, &rank), "backend mpi");
  TRIDENT_MPI(rt, MPI_Comm_size(MPI_COMM_WORLD, &size), "backend mpi");
  MPI_Comm comm = dup_world(rt, resolve_timeout(options));
  return std::make_shared<MpiProcessGroup>(comm, rank, size, options);
}

std::shared_ptr<ProcessGroup> new_mpi_process_group(int rank, int size, const GroupOptions& options) {
  Runtime& rt = runtime();
  int mpi_rank = 0, mpi_size = 0;
  TRIDENT_MPI(rt, MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "backend mpi");
  TRIDENT_MPI(rt, MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "backend mpi");
  if (rank != mpi_rank || size != mpi_size)
    TRIDENT_THROW(InvalidArgument,
                  "backend mpi takes rank and size from MPI (this process is rank {} of {} in MPI_COMM_WORLD) but "
                  "was asked for rank {} of {}; start every rank with mpirun and use init_process_group with "
                  "backend mpi",
                  mpi_rank, mpi_size, rank, size);
  return new_mpi_world_group(options);
}

}  // namespace trident

#endif  // TRIDENT_HAVE_MPI
