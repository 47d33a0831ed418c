// trident as a torch.distributed backend: a c10d::ProcessGroup (torch 1.13's third-party backend API) whose
// collectives run on a trident ProcessGroup (src/trident/comm/process_group.h), plus the two store adapters
// that let torch and trident rendezvous through one store. Python: trident_torch (python/trident_torch).
//
// Ownership: torch holds the ProcessGroupTrident (c10::intrusive_ptr); it owns its trident group and one
// worker thread, which runs the group's calls in issue order (so every rank issues trident collectives in
// the order the user issued them) and ends when the group is destroyed. With TRIDENT_TORCH_INLINE=1 a
// collective issued while the group is idle runs on its caller's thread instead (no hand-off, no overlap).
// Sends and receives are only started by the worker (in issue order); trident's group completes them, on its
// own thread, under the native engine's rules (sends and receives never wait behind each other), so
// batch_isend_irecv completes in any order of its operations; a receive without src matches any rank.
// Thread-safety: every method may be called from any thread (calls are queued under a mutex).
// Blocking: each call returns a Work at once; its wait() blocks until the call finished and rethrows its
// error; getFuture() completes (value: the output tensors, as DDP's comm hooks expect) or fails with it.
// Timeouts: a call's deadline is its options' timeout, else the group's (init_process_group(timeout=...),
// default 30 min); trident's dead-peer detection fails a call within seconds whatever the deadline.
// Errors: trident's typed errors (PeerDiedError, MismatchError, TimeoutError, InvalidArgument) reach Python as
// RuntimeError with the rank, the group and the collective in the message, and c10d's words for the condition
// ("Timed out", "Rank N failed - Connection closed by peer"); what this backend cannot do (CUDA tensors,
// bitwise reduce ops, several tensors per call, sparse tensors other than all_reduce SUM) raises RuntimeError
// naming it.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

#include <pybind11/chrono.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/comm/store/store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

namespace trident_torch {

using trident::Bytes;
using trident::DType;
using trident::Seconds;

// ---- stores ----

// A torch c10d::Store seen as a trident Store: the process group rendezvouses through the store torch's
// init_process_group made (env://, tcp:// or file://, already prefixed per group), so a torch user needs
// nothing beyond what gloo needs (MASTER_ADDR/MASTER_PORT or an init_method), and every group torch creates
// gets its own namespace for free. The alternative, trident's own rendezvous from the environment, would work
// only with env:// and would need a second port beside torch's store.
class TorchStore final : public trident::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {
    timeout_ = std::chrono::duration_cast<Seconds>(s_->getTimeout());
  }
  void set(const std::string& key, const Bytes& value) override { s_->set(key, value); }
  Bytes get(const std::string& key, std::optional<Seconds> timeout) override {
    wait({key}, timeout);
    return s_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return s_->compareSet(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) override {
    auto t = std::chrono::duration_cast<std::chrono::milliseconds>(timeout.value_or(timeout_));
    try {
      s_->wait(keys, t);
    } catch (const std::exception& e) {
      TRIDENT_THROW(trident::TimeoutError, "torch store: waiting for {} key(s) (first '{}'): {}", keys.size(),
                    keys.empty() ? "" : keys[0], e.what());
    }
  }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }
  bool delete_key(const std::string& key) override { return s_->deleteKey(key); }
  int64_t num_keys() override { return s_->getNumKeys(); }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

// A trident Store seen as a torch c10d::Store: under `trident launch` the launcher hosts trident's store on
// MASTER_PORT, so torch's env:// handler rendezvouses through it (trident_torch/__init__.py) instead of trying
// to host a TCPStore of its own on the same port.
class TridentStore final : public c10d::Store {
 public:
  TridentStore(std::shared_ptr<trident::Store> s, std::chrono::milliseconds timeout) : s_(std::move(s)) {
    setTimeout(timeout);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { s_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return s_->compare_set(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override { return s_->get(key, secs(timeout_)); }
  int64_t add(const std::string& key, int64_t value) override { return s_->add(key, value); }
  bool deleteKey(const std::string& key) override { return s_->delete_key(key); }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }
  int64_t getNumKeys() override { return s_->num_keys(); }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys, secs(timeout_)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    s_->wait(keys, secs(timeout));
  }

 private:
  static Seconds secs(std::chrono::milliseconds t) { return std::chrono::duration_cast<Seconds>(t); }
  std::shared_ptr<trident::Store> s_;
};

c10::intrusive_ptr<c10d::Store> connect_trident_store(std::chrono::milliseconds timeout) {
  trident::RendezvousInfo info = trident::rendezvous_from_env();
  auto store = trident::connect_store(info, std::chrono::duration_cast<Seconds>(timeout));
  return c10::make_intrusive<TridentStore>(std::move(store), timeout);
}

// ---- dtypes ----

// trident's element type for a torch dtype, if trident has it.
std::optional<DType> trident_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    default: return std::nullopt;
  }
}

// A buffer as trident sees it. Data movement works on any dtype: one trident has (so a mismatch error names
// it) or else the raw bytes.
struct Buf {
  void* ptr;
  size_t count;
  DType dtype;
};
Buf moved(const at::Tensor& t) {
  if (auto d = trident_dtype(t.scalar_type())) return {t.data_ptr(), static_cast<size_t>(t.numel()), *d};
  return {t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size(), DType::kUInt8};
}

// Reductions: trident reduces float32/64, bfloat16, float16, int32, int64. int8, uint8 and bool reduce in
// int32 and convert back (wrapping as torch's own integer arithmetic does; bool: sum/max = or, min/prod = and).
at::ScalarType reduce_type(at::ScalarType t) {
  switch (t) {
    case at::kChar:
    case at::kByte:
    case at::kBool: return at::kInt;
    default: return t;
  }
}

trident::ReduceOp reduce_op(const c10d::ReduceOp& op, at::ScalarType t) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return trident::ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT: return trident::ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return trident::ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return trident::ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(t), "trident backend: ReduceOp.AVG needs a floating-point tensor, got ", t,
                  " (use SUM and divide)");
      return trident::ReduceOp::kAvg;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(false, "trident backend: bitwise reduce ops (BAND, BOR, BXOR) are not supported; "
                         "SUM, AVG, PRODUCT, MIN and MAX are");
    default:
      TORCH_CHECK(false, "trident backend: reduce op ", static_cast<int>(op.op_),
                  " (PREMUL_SUM or unknown) is not supported; SUM, AVG, PRODUCT, MIN and MAX are");
  }
}

// ---- work ----

// A queued call's handle. The group's worker runs it and calls complete(); wait() and the future follow.
class TridentWork final : public c10d::Work {
 public:
  TridentWork(int rank, c10d::OpType type, const char* title, std::string what)
      : c10d::Work(rank, type, title),
        what_(std::move(what)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ && !exception_;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return exception_;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive's sender (recv/irecv without src: the rank whose message matched).
  int sourceRank() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(source_rank_ >= 0, "trident backend: sourceRank() is known only for a completed receive; wait() first");
    return source_rank_;
  }
  void set_source_rank(int r) {
    std::lock_guard<std::mutex> lock(mutex_);
    source_rank_ = r;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      TORCH_CHECK(false, "trident backend, rank ", rank_, ": Timed out waiting ", timeout.count(), "ms for ", what_,
                  " (Work.wait's timeout; the call itself keeps running until its own deadline)");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  // Called once by the worker: records the outputs or the error, wakes waiters, completes the future.
  void complete(std::vector<at::Tensor> outputs, std::exception_ptr error) {
    outputs_ = std::move(outputs);
    finish(error);  // c10d::Work: sets completed_ / exception_ under mutex_, notifies cv_
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::string what_;
  int source_rank_ = -1;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- the process group ----

class ProcessGroupTrident final : public c10d::ProcessGroup {
 public:
  ProcessGroupTrident(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout)
      : c10d::ProcessGroup(rank, size) {
    trident::GroupOptions o;
    o.timeout = std::chrono::duration_cast<Seconds>(timeout);
    o.name = "torch";
    try {
      pg_ = trident::new_process_group(std::make_shared<TorchStore>(store), rank, size, o);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "trident backend: rank ", rank, " of ", size, " could not create its process group: ",
                  e.what());
    }
    worker_ = std::thread([this] { run_worker(); });
  }

  ~ProcessGroupTrident() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    // The worker drops the last references to tensors Python created, which takes the GIL: join without it
    // (torch destroys groups from Python, with the GIL held).
    // trident's group completes sends and receives on its own thread, which may hold their tensors last: it
    // is ended (pg_ reset) without the GIL as well.
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;
      worker_.join();
      pg_.reset();
    } else {
      worker_.join();
      pg_.reset();
    }
  }

  const std::string getBackendName() const override { return "trident"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    at::Tensor t = single(tensors, "broadcast");
    int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::BROADCAST, "broadcast", opts.timeout, {t}, [=, this](const trident::CallOptions& co) {
      at::Tensor c = t.contiguous();
      Buf b = moved(c);
      pg_->broadcast(b.ptr, b.count, b.dtype, root, co);
      copy_back(t, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].layout() == at::kSparse) return sparse_allreduce(tensors[0], opts);
    at::Tensor t = single(tensors, "allreduce");
    trident::ReduceOp op = reduce_op(opts.reduceOp, t.scalar_type());
    return enqueue(c10d::OpType::ALLREDUCE, "all_reduce", opts.timeout, {t}, [=, this](const trident::CallOptions& co) {
      at::Tensor c = reduce_view(t);
      pg_->all_reduce(c.data_ptr(), c.numel(), *trident_dtype(c.scalar_type()), op, co);
      copy_back(t, c);
    });
  }

  // all_reduce of a sparse COO tensor, as gloo does it: every rank's coalesced indices and values are
  // gathered (all_gatherv: ranks hold different numbers of nonzeros) and summed into a coalesced result, which
  // replaces the tensor's contents. Only SUM (gloo's only sparse reduction); every rank passes the same sizes,
  // sparse and dense dimensions and dtype (checked: the error names the ranks that differ).
  static constexpr int kSparseMaxDims = 16;
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts) {
    TORCH_CHECK(t.device().is_cpu(), "trident backend: all_reduce got a sparse tensor on ", t.device(),
                "; trident's torch backend reduces sparse tensors on the CPU");
    TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM, "trident backend: all_reduce of a sparse tensor supports ",
                "ReduceOp.SUM only (as gloo), got ", reduce_op_name(opts.reduceOp),
                "; reduce its dense form (t.to_dense()) for other ops");
    TORCH_CHECK(t.dim() <= kSparseMaxDims, "trident backend: all_reduce of a sparse tensor of ", t.dim(),
                " dimensions; at most ", kSparseMaxDims, " are supported");
    return enqueue(c10d::OpType::ALLREDUCE, "all_reduce (sparse)", opts.timeout, {t},
                   [=, this](const trident::CallOptions& co) {
                     const int n = getSize();
                     at::Tensor in = t.coalesce();
                     // Metadata, one fixed-size row per rank: nnz, sparse dims, dense dims, dtype, ndim, sizes.
                     constexpr int kMeta = 5 + kSparseMaxDims;
                     std::vector<int64_t> mine(kMeta, -1);
                     mine[0] = in._nnz();
                     mine[1] = in.sparse_dim();
                     mine[2] = in.dense_dim();
                     mine[3] = static_cast<int64_t>(in.scalar_type());
                     mine[4] = in.dim();
                     for (int64_t d = 0; d < in.dim(); ++d) mine[5 + d] = in.size(d);
                     std::vector<int64_t> meta(static_cast<size_t>(kMeta) * n);
                     pg_->all_gather(mine.data(), meta.data(), kMeta, DType::kInt64, co);
                     auto shape = [&](int r) {
                       const int64_t* m = &meta[static_cast<size_t>(r) * kMeta];
                       std::string d = "[";
                       for (int64_t i = 0; i < m[4]; ++i) d += (i ? ", " : "") + std::to_string(m[5 + i]);
                       return fmt::format("{}] with {} sparse and {} dense dimensions of {}", d, m[1], m[2],
                                          c10::toString(static_cast<at::ScalarType>(m[3])));
                     };
                     for (int r = 0; r < n; ++r)
                       TORCH_CHECK(std::equal(mine.begin() + 1, mine.end(), meta.begin() + r * kMeta + 1),
                                   "trident backend: all_reduce of a sparse tensor: rank ", r, " passed sizes ",
                                   shape(r), " but rank ", getRank(), " passed ", shape(getRank()),
                                   "; every rank must pass the same sizes, layout and dtype");
                     const int64_t sd = in.sparse_dim();
                     at::Tensor idx = in._indices().contiguous(), val = in._values().contiguous();
                     // values are [nnz, dense sizes...]: one row per nonzero
                     int64_t row_bytes = static_cast<int64_t>(val.element_size());
                     for (int64_t d = 1; d < val.dim(); ++d) row_bytes *= val.size(d);
                     std::vector<size_t> idx_counts, val_counts;
                     int64_t total = 0;
                     for (int r = 0; r < n; ++r) {
                       const int64_t nnz = meta[static_cast<size_t>(r) * kMeta];
                       idx_counts.push_back(static_cast<size_t>(sd * nnz));
                       val_counts.push_back(static_cast<size_t>(row_bytes * nnz));
                       total += nnz;
                     }
                     std::vector<int64_t> val_shape = val.sizes().vec();
                     val_shape[0] = total;
                     at::Tensor all_idx = at::empty({sd * total}, idx.options());
                     at::Tensor all_val = at::empty(val_shape, val.options());
                     pg_->all_gatherv(idx.data_ptr(), all_idx.data_ptr(), idx_counts, DType::kInt64, co);
                     pg_->all_gatherv(val.data_ptr(), all_val.data_ptr(), val_counts, DType::kUInt8, co);
                     // Rank r's block of indices is [sd, nnz_r]: lay the blocks side by side.
                     std::vector<at::Tensor> blocks;
                     int64_t off = 0;
                     for (int r = 0; r < n; ++r) {
                       const int64_t nnz = meta[static_cast<size_t>(r) * kMeta];
                       blocks.push_back(all_idx.narrow(0, off, sd * nnz).view({sd, nnz}));
                       off += sd * nnz;
                     }
                     at::Tensor sum = at::sparse_coo_tensor(at::cat(blocks, 1), all_val, in.sizes(), in.options())
                                          .coalesce();
                     const_cast<at::Tensor&>(t).copy_(sum);
                   });
  }
  static std::string reduce_op_name(const c10d::ReduceOp& op) {
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return "SUM";
      case c10d::ReduceOp::AVG: return "AVG";
      case c10d::ReduceOp::PRODUCT: return "PRODUCT";
      case c10d::ReduceOp::MIN: return "MIN";
      case c10d::ReduceOp::MAX: return "MAX";
      case c10d::ReduceOp::BAND: return "BAND";
      case c10d::ReduceOp::BOR: return "BOR";
      case c10d::ReduceOp::BXOR: return "BXOR";
      default: return "PREMUL_SUM";
    }
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "trident backend: allreduce_coalesced needs at least one tensor");
    for (auto& t : tensors) {
      check_cpu(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "trident backend: allreduce_coalesced needs tensors of one dtype");
    }
    trident::ReduceOp op = reduce_op(opts.reduceOp, tensors[0].scalar_type());
    std::vector<at::Tensor> ts = tensors;
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", opts.timeout, ts,
                   [=, this](const trident::CallOptions& co) {
                     std::vector<at::Tensor> flat_in;
                     for (auto& t : ts) flat_in.push_back(t.reshape({-1}).to(reduce_type(t.scalar_type())));
                     at::Tensor flat = at::cat(flat_in);
                     pg_->all_reduce(flat.data_ptr(), flat.numel(), *trident_dtype(flat.scalar_type()), op, co);
                     int64_t off = 0;
                     for (auto& t : ts) {
                       t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
                       off += t.numel();
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    at::Tensor t = single(tensors, "reduce");
    trident::ReduceOp op = reduce_op(opts.reduceOp, t.scalar_type());
    int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::REDUCE, "reduce", opts.timeout, {t}, [=, this](const trident::CallOptions& co) {
      at::Tensor c = reduce_view(t);
      pg_->reduce(c.data_ptr(), c.data_ptr(), c.numel(), *trident_dtype(c.scalar_type()), op, root, co);
      if (getRank() == root) copy_back(t, c);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override {
    at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "trident backend: allgather takes one output list (one tensor per call)");
    std::vector<at::Tensor> outs = outputs[0];
    TORCH_CHECK(static_cast<int>(outs.size()) == getSize(), "trident backend: allgather needs ", getSize(),
                " output tensors, got ", outs.size());
    for (auto& o : outs) {
      check_cpu(o, "allgather");
      TORCH_CHECK(o.scalar_type() == in.scalar_type(), "trident backend: allgather output dtype ", o.scalar_type(),
                  " differs from the input's ", in.scalar_type());
    }
    return enqueue(c10d::OpType::ALLGATHER, "all_gather", opts.timeout, outs, [=, this](const trident::CallOptions& co) {
      at::Tensor c = in.contiguous();
      // Outputs may differ in size (torch allows it): then all_gatherv with every rank's count.
      bool equal = true;
      std::vector<size_t> counts;
      for (auto& o : outs) {
        counts.push_back(moved(o).count);
        equal = equal && o.numel() == c.numel();
      }
      at::Tensor flat = at::empty({total(outs)}, in.options());
      Buf s = moved(c), r = moved(flat);
      if (equal) {
        pg_->all_gather(s.ptr, r.ptr, s.count, s.dtype, co);
      } else {
        pg_->all_gatherv(s.ptr, r.ptr, counts, s.dtype, co);
      }
      unpack(flat, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_whole(output, input, "all_gather_into_tensor", "output");
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", opts.timeout, {out},
                   [=, this](const trident::CallOptions& co) {
                     at::Tensor c = in.contiguous(), o = out.contiguous();
                     Buf s = moved(c), r = moved(o);
                     pg_->all_gather(s.ptr, r.ptr, s.count, s.dtype, co);
                     copy_back(out, o);
                   });
  }

  // all_gather_coalesced: outputs[r][i] receives rank r's inputs[i]. One all_gather of every input's bytes
  // packed together (so tensors of different dtypes travel in one call), then unpacked; every rank must pass
  // the same sizes, as with gloo (trident's fingerprint check names the rank whose total differs).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    const int n = getSize();
    TORCH_CHECK(!inputs.empty(), "trident backend: all_gather_coalesced needs at least one input tensor");
    TORCH_CHECK(static_cast<int>(outputs.size()) == n, "trident backend: all_gather_coalesced needs ", n,
                " output lists (one per rank), got ", outputs.size());
    for (auto& t : inputs) check_cpu(t, "all_gather_coalesced");
    for (int r = 0; r < n; ++r) {
      TORCH_CHECK(outputs[r].size() == inputs.size(), "trident backend: all_gather_coalesced output list ", r,
                  " holds ", outputs[r].size(), " tensors; it needs one per input (", inputs.size(), ")");
      for (size_t i = 0; i < inputs.size(); ++i) {
        const at::Tensor& o = outputs[r][i];
        check_cpu(o, "all_gather_coalesced");
        TORCH_CHECK(o.numel() == inputs[i].numel() && o.scalar_type() == inputs[i].scalar_type(),
                    "trident backend: all_gather_coalesced output [", r, "][", i, "] must have ", inputs[i].numel(),
                    " elements of ", inputs[i].scalar_type(), " like input ", i, ", got ", o.numel(), " of ",
                    o.scalar_type());
      }
    }
    std::vector<at::Tensor> ins = inputs, outs;
    for (auto& l : outputs) outs.insert(outs.end(), l.begin(), l.end());
    return enqueue(c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", opts.timeout, outs,
                   [=, this](const trident::CallOptions& co) {
                     at::Tensor flat = pack_bytes(ins);
                     at::Tensor all = at::empty({flat.numel() * n}, flat.options());
                     pg_->all_gather(flat.data_ptr(), all.data_ptr(), flat.numel(), DType::kUInt8, co);
                     std::vector<at::Tensor> one(ins.size());
                     for (int r = 0; r < n; ++r) {
                       for (size_t i = 0; i < ins.size(); ++i) one[i] = outs[r * ins.size() + i];
                       unpack_bytes(all.narrow(0, r * flat.numel(), flat.numel()), one);
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    at::Tensor in = single(inputs, "gather");
    int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs = per_rank(outputs, in, getRank() == root, "gather", "output");
    return enqueue(c10d::OpType::GATHER, "gather", opts.timeout, outs, [=, this](const trident::CallOptions& co) {
      at::Tensor c = in.contiguous();
      Buf s = moved(c);
      at::Tensor flat;
      void* recv = nullptr;
      if (getRank() == root) {
        flat = at::empty({in.numel() * getSize()}, in.options());
        recv = flat.data_ptr();
      }
      pg_->gather(s.ptr, recv, s.count, s.dtype, root, co);
      if (getRank() == root) unpack(flat, outs);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    at::Tensor out = single(outputs, "scatter");
    int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> ins = per_rank(inputs, out, getRank() == root, "scatter", "input");
    return enqueue(c10d::OpType::SCATTER, "scatter", opts.timeout, {out}, [=, this](const trident::CallOptions& co) {
      at::Tensor flat;
      const void* send = nullptr;
      if (getRank() == root) {
        flat = pack(ins);
        send = flat.data_ptr();
      }
      at::Tensor o = out.contiguous();
      Buf r = moved(o);
      pg_->scatter(send, r.ptr, r.count, r.dtype, root, co);
      copy_back(out, o);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out = single(outputs, "reduce_scatter");
    std::vector<at::Tensor> ins = per_rank(inputs, out, true, "reduce_scatter", "input");
    trident::ReduceOp op = reduce_op(opts.reduceOp, out.scalar_type());
    return enqueue(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", opts.timeout, {out},
                   [=, this](const trident::CallOptions& co) {
                     at::Tensor flat = pack(ins).to(reduce_type(out.scalar_type()));
                     at::Tensor o = at::empty({out.numel()}, flat.options());
                     pg_->reduce_scatter(flat.data_ptr(), o.data_ptr(), o.numel(), *trident_dtype(o.scalar_type()),
                                         op, co);
                     out.copy_(o.view(out.sizes()));
                   });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_whole(input, output, "reduce_scatter_tensor", "input");
    trident::ReduceOp op = reduce_op(opts.reduceOp, output.scalar_type());
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", opts.timeout, {out},
                   [=, this](const trident::CallOptions& co) {
                     at::Tensor c = reduce_view(in);
                     at::Tensor o = reduce_type(out.scalar_type()) == out.scalar_type() && out.is_contiguous()
                                        ? out
                                        : at::empty({out.numel()}, c.options());
                     pg_->reduce_scatter(c.data_ptr(), o.data_ptr(), out.numel(), *trident_dtype(c.scalar_type()),
                                         op, co);
                     if (!o.is_same(out)) out.copy_(o.view(out.sizes()));
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_cpu(input, "alltoall_base");
    check_cpu(output, "alltoall_base");
    TORCH_CHECK(input.scalar_type() == output.scalar_type(), "trident backend: all_to_all_single needs one dtype");
    const int n = getSize();
    auto splits = [&](std::vector<int64_t> s, const at::Tensor& t, const char* which) {
      int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      if (s.empty()) {
        TORCH_CHECK(rows % n == 0, "trident backend: all_to_all_single without ", which, " splits needs dim 0 (",
                    rows, ") divisible by the world size ", n);
        s.assign(n, rows / n);
      }
      TORCH_CHECK(static_cast<int>(s.size()) == n, "trident backend: ", which, " splits need ", n, " entries");
      int64_t sum = 0;
      for (int64_t v : s) sum += v;
      TORCH_CHECK(sum == rows, "trident backend: ", which, " splits sum to ", sum, " but dim 0 is ", rows);
      int64_t row = rows == 0 ? 0 : t.numel() / rows;
      for (auto& v : s) v *= row;  // in elements
      return s;
    };
    std::vector<int64_t> in_split = splits(input_splits, input, "input"), out_split = splits(output_splits, output, "output");
    at::Tensor in = input, out = output;
    return enqueue(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", opts.timeout, {out},
                   [=, this](const trident::CallOptions& co) { all_to_all_v(in, out, in_split, out_split, co); });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const int n = getSize();
    TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
                "trident backend: all_to_all needs ", n, " input and ", n, " output tensors");
    std::vector<int64_t> in_split, out_split;
    for (int i = 0; i < n; ++i) {
      check_cpu(inputs[i], "alltoall");
      check_cpu(outputs[i], "alltoall");
      TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                      outputs[i].scalar_type() == inputs[0].scalar_type(),
                  "trident backend: all_to_all needs one dtype");
      in_split.push_back(inputs[i].numel());
      out_split.push_back(outputs[i].numel());
    }
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return enqueue(c10d::OpType::ALLTOALL, "all_to_all", opts.timeout, outs, [=, this](const trident::CallOptions& co) {
      at::Tensor in = pack(ins);
      at::Tensor out = at::empty({total(outs)}, in.options());
      all_to_all_v(in, out, in_split, out_split, co);
      unpack(out, outs);
    });
  }

  // Sends and receives are started on trident's group in issue order and finish when their message moved:
  // the worker does not wait for them, so the native engine's rules apply as they are (independent send and
  // receive lanes; per peer and tag, messages match in the order sent), and batch_isend_irecv completes in any
  // order of its operations. isend/irecv/batch_isend_irecv's Works are these.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    at::Tensor t = single(tensors, "send");
    check_peer(dst, "send", "dst");
    return enqueue_p2p(c10d::OpType::SEND, "send", {}, [=, this](const trident::CallOptions& co) -> P2PStart {
      at::Tensor c = t.contiguous();  // kept alive by the completion until the bytes left
      Buf b = moved(c);
      return {pg_->send_async(b.ptr, b.count, b.dtype, dst, checked_tag(tag), co), [c] {}};
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    at::Tensor t = single(tensors, "recv");
    check_peer(src, "recv", "src");
    return start_recv(t, src, tag, c10d::OpType::RECV, "recv");
  }

  // recv/irecv without src: the first message with the tag from any rank; Work._source_rank() names it.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    at::Tensor t = single(tensors, "recv (any source)");
    return start_recv(t, trident::kAnySource, tag, c10d::OpType::RECVANYSOURCE, "recv from any source");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return enqueue(c10d::OpType::BARRIER, "barrier", opts.timeout, {},
                   [=, this](const trident::CallOptions& co) { pg_->barrier(co); });
  }

  // Sequence numbers: trident numbers every call of a group itself and checks them across ranks (a mismatch
  // is an error naming what each rank issued); torch only asks gloo and NCCL for theirs.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return calls_; }

 private:
  using Body = std::function<void(const trident::CallOptions&)>;
  // A send or receive started on trident's group: its Work, and what runs once it succeeded (copying a
  // received message into the user's tensor; holding a send's contiguous copy until then).
  struct P2PStart {
    std::shared_ptr<trident::Work> work;
    std::function<void()> then;
  };
  using P2PBody = std::function<P2PStart(const trident::CallOptions&)>;

  struct Task {
    c10::intrusive_ptr<TridentWork> work;
    std::vector<at::Tensor> outputs;
    trident::CallOptions options;
    std::string what;
    Body body;     // a collective: runs to completion on the worker
    P2PBody p2p;   // a send or receive: started by the worker, completed by trident's group (run)
  };

  void check_peer(int peer, const char* op, const char* arg) const {
    TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "trident backend: ", op, " ", arg, "=", peer,
                " on rank ", getRank(), " must name another rank of the group, in [0, ", getSize(), ")");
  }
  static uint32_t checked_tag(int tag) {
    TORCH_CHECK(tag >= 0, "trident backend: tag ", tag, " is negative; tags are integers >= 0");
    return static_cast<uint32_t>(tag);
  }
  c10::intrusive_ptr<c10d::Work> start_recv(const at::Tensor& t, int src, int tag, c10d::OpType type, const char* what) {
    const uint32_t utag = checked_tag(tag);
    return enqueue_p2p(type, what, {t}, [=, this](const trident::CallOptions& co) -> P2PStart {
      at::Tensor c = t.contiguous();
      Buf b = moved(c);
      return {pg_->recv_async(b.ptr, b.count, b.dtype, src, utag, co), [t, c] { copy_back(t, c); }};
    });
  }

  static void check_cpu(const at::Tensor& t, const char* op) {
    TORCH_CHECK(t.device().is_cpu(), "trident backend: ", op, " got a tensor on ", t.device(),
                "; trident's torch backend runs collectives on CPU tensors (use nccl for CUDA tensors)");
    TORCH_CHECK(t.layout() != at::kSparse, "trident backend: ", op, " does not take sparse tensors; of the "
                "collectives only all_reduce (ReduceOp.SUM) does, as with gloo: pass t.to_dense()");
    TORCH_CHECK(t.layout() == at::kStrided, "trident backend: ", op, " needs dense (strided) tensors, got layout ",
                t.layout());
  }
  static at::Tensor single(std::vector<at::Tensor>& ts, const char* op) {
    TORCH_CHECK(ts.size() == 1, "trident backend: ", op, " takes one tensor per call, got ", ts.size());
    check_cpu(ts[0], op);
    return ts[0];
  }
  // The one-tensor-per-rank list of a call (gather's outputs and scatter's inputs at the root, reduce_scatter's
  // inputs): world_size CPU tensors with `like`'s size and dtype where `here`, nothing elsewhere.
  std::vector<at::Tensor> per_rank(std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& like, bool here,
                                   const char* op, const char* which) const {
    if (!here) {
      TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "trident backend: ", op, " takes ",
                  which, " tensors only at the root");
      return {};
    }
    TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == getSize(), "trident backend: ", op,
                " needs one list of ", getSize(), " ", which, " tensors");
    for (auto& t : lists[0]) {
      check_cpu(t, op);
      TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "trident backend: ", op, " ",
                  which, " tensors must have ", like.numel(), " elements of ", like.scalar_type(), ", got ",
                  t.numel(), " of ", t.scalar_type());
    }
    return lists[0];
  }
  // The single-tensor forms (all_gather_into_tensor, reduce_scatter_tensor): `whole` holds world_size x
  // `part`'s elements, in `part`'s dtype, both CPU tensors.
  void check_whole(const at::Tensor& whole, const at::Tensor& part, const char* op, const char* which) const {
    check_cpu(whole, op);
    check_cpu(part, op);
    TORCH_CHECK(whole.numel() == part.numel() * getSize() && whole.scalar_type() == part.scalar_type(),
                "trident backend: ", op, " needs an ", which, " of world_size x ", part.numel(), " = ",
                part.numel() * getSize(), " elements of ", part.scalar_type(), ", got ", whole.numel(), " of ",
                whole.scalar_type());
  }
  // The tensor a reduction runs on: contiguous, in a dtype trident reduces (a copy when t is neither).
  static at::Tensor reduce_view(const at::Tensor& t) {
    at::ScalarType rt = reduce_type(t.scalar_type());
    TORCH_CHECK(trident_dtype(rt).has_value(), "trident backend: cannot reduce ", t.scalar_type(),
                " tensors; trident reduces float32, float64, bfloat16, float16, int32, int64 (int8, uint8 and "
                "bool through int32)");
    return t.contiguous().to(rt);
  }
  // Writes a computed result back into the user's tensor when it was computed in a copy.
  static void copy_back(const at::Tensor& user, const at::Tensor& result) {
    if (!result.is_same(user)) user.copy_(result.view(user.sizes()));
  }
  static int64_t total(const std::vector<at::Tensor>& ts) {
    int64_t n = 0;
    for (auto& t : ts) n += t.numel();
    return n;
  }
  static at::Tensor pack(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
  }
  // Tensors of any dtypes as one flat uint8 tensor of their bytes, and back.
  static at::Tensor pack_bytes(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(t.contiguous().reshape({-1}).view(at::kByte));
    return at::cat(flat);
  }
  static void unpack_bytes(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
    int64_t off = 0;
    for (auto& t : ts) {
      int64_t nb = t.numel() * static_cast<int64_t>(t.element_size());
      // Bytes into a contiguous tensor viewed as bytes (a view of the flat bytes as t's dtype could be
      // misaligned when dtypes are mixed).
      at::Tensor c = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
      c.reshape({-1}).view(at::kByte).copy_(flat.narrow(0, off, nb));
      copy_back(t, c);
      off += nb;
    }
  }
  static void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
    int64_t off = 0;
    for (auto& t : ts) {
      const_cast<at::Tensor&>(t).copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }

  // all_to_all with per-peer element counts: trident's all_to_all moves equal blocks, so uneven splits pad
  // every block to the largest one any rank sends (agreed by an all_reduce(max)), then compact.
  void all_to_all_v(const at::Tensor& input, const at::Tensor& output, const std::vector<int64_t>& in_split,
                    const std::vector<int64_t>& out_split, const trident::CallOptions& co) {
    const int n = getSize();
    at::Tensor in = input.contiguous().reshape({-1});
    bool equal = true;
    int64_t block = 0;
    for (int i = 0; i < n; ++i) {
      equal = equal && in_split[i] == in_split[0] && out_split[i] == in_split[0];
      block = std::max({block, in_split[i], out_split[i]});
    }
    // Every rank must take the same path: agree on the largest block and on whether any rank is uneven.
    int64_t agree[2] = {block, equal ? 0 : 1};
    pg_->all_reduce(agree, 2, DType::kInt64, trident::ReduceOp::kMax, co);
    block = agree[0];
    const bool padded = agree[1] != 0;
    if (!padded) {
      at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
      Buf s = moved(in), r = moved(out);
      pg_->all_to_all(s.ptr, r.ptr, s.count / std::max(1, n), s.dtype, co);
      copy_back(output, out);
      return;
    }
    at::Tensor send = at::zeros({block * n}, in.options()), recv = at::empty({block * n}, in.options());
    int64_t off = 0;
    for (int i = 0; i < n; ++i) {
      send.narrow(0, i * block, in_split[i]).copy_(in.narrow(0, off, in_split[i]));
      off += in_split[i];
    }
    Buf s = moved(send), r = moved(recv);
    pg_->all_to_all(s.ptr, r.ptr, s.count / n, s.dtype, co);
    std::vector<at::Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(recv.narrow(0, i * block, out_split[i]));
    output.copy_(at::cat(parts).view(output.sizes()));
  }

  c10::intrusive_ptr<c10d::Work> enqueue_p2p(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs,
                                             P2PBody start) {
    return enqueue(type, what, c10d::kUnsetTimeout, std::move(outputs), nullptr, std::move(start));
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* what, std::chrono::milliseconds timeout,
                                         std::vector<at::Tensor> outputs, Body body, P2PBody p2p = nullptr) {
    auto work = c10::make_intrusive<TridentWork>(getRank(), type, nullptr,
                                                 std::string(what) + " on group '" + pg_->name() + "'");
    Task task{work, std::move(outputs), {}, what, std::move(body), std::move(p2p)};
    if (timeout != c10d::kUnsetTimeout) task.options.timeout = std::chrono::duration_cast<Seconds>(timeout);
    // Inline (TRIDENT_TORCH_INLINE=1): a collective issued while nothing is queued or running runs here, on
    // the caller's thread, and returns completed; point-to-point calls always go to the worker (an isend
    // must not block the recv its caller issues next).
    const bool point_to_point = static_cast<bool>(task.p2p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      if (!inline_ || point_to_point || busy_ || !queue_.empty()) {
        queue_.push_back(std::move(task));
        cv_.notify_one();
        return work;
      }
      busy_ = true;
    }
    {
      std::optional<pybind11::gil_scoped_release> no_gil;
      if (PyGILState_Check()) no_gil.emplace();
      run(task);
    }
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (!queue_.empty()) cv_.notify_one();
    return work;
  }

  // One message with the backend, the rank and the call, whatever threw (trident's errors name the group, the
  // sequence number and the peer, in c10d's words too; torch's checks name the argument).
  static std::exception_ptr failed(int rank, int size, const std::string& what, const std::exception& e) {
    return std::make_exception_ptr(
        std::runtime_error(fmt::format("trident backend, rank {} of {}: {} failed: {}", rank, size, what, e.what())));
  }

  // Runs one call and completes its Work (never throws: the error goes to the Work and its future). A send
  // or receive is only started here; trident's group completes it (on its own thread) when the message moved.
  void run(Task& task) {
    std::exception_ptr error;
    if (task.p2p) {
      P2PStart started;
      try {
        started = task.p2p(task.options);
      } catch (const std::exception& e) {
        task.work->complete({}, failed(getRank(), getSize(), task.what, e));
        return;
      }
      started.work->on_finish([work = task.work, outputs = std::move(task.outputs), then = std::move(started.then),
                               what = task.what, rank = getRank(), size = getSize()](trident::Work& w) mutable {
        std::exception_ptr error;
        try {
          if (std::exception_ptr e = w.error()) std::rethrow_exception(e);
          then();
        } catch (const std::exception& e) {
          error = failed(rank, size, what, e);
        }
        work->set_source_rank(w.source_rank());
        work->complete(error ? std::vector<at::Tensor>{} : std::move(outputs), error);
      });
      return;
    }
    try {
      task.body(task.options);
    } catch (const std::exception& e) {
      error = failed(getRank(), getSize(), task.what, e);
    }
    task.work->complete(error ? std::vector<at::Tensor>{} : std::move(task.outputs), error);
  }

  void run_worker() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !busy_); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      run(task);
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
  }

  std::shared_ptr<trident::ProcessGroup> pg_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a call runs (on the worker, or inline on its caller)
  const bool inline_ = trident::env::param_bool("TRIDENT_TORCH_INLINE");
  uint64_t calls_ = 0;
  std::thread worker_;
};

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                            int size, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupTrident>(store, rank, size, timeout);
}

}  // namespace trident_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "trident's torch.distributed backend (see trident_torch)";
  m.def("create_process_group", &trident_torch::create_process_group, py::arg("store"), py::arg("rank"),
        py::arg("world_size"), py::arg("timeout"),
        "The c10d ProcessGroup over trident that torch.distributed creates for backend 'trident'.");
  m.def("connect_trident_store", &trident_torch::connect_trident_store, py::arg("timeout"),
        "A c10d Store over the store `trident launch` hosts (TRIDENT_STORE_HOSTED=1), from the environment.");
}
