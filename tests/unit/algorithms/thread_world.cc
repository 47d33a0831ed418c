#include "thread_world.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "trident/comm/reduce.h"
#include "trident/core/error.h"

namespace trident::testing {
namespace {

struct Op {
  enum Kind { kSend, kRecv, kRecvReduce } kind;
  int owner = 0;
  int peer = 0;
  uint32_t step = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  const void* own = nullptr;  // recv_reduce: dst = own op incoming
  size_t bytes = 0;  // send: bytes; recv: bytes; recv_reduce: count * element size
  size_t count = 0;
  DType dtype = DType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  std::vector<unsigned char> snapshot;  // send: the data at post time
  size_t seq = 0;                       // index among this pair's messages (for error messages)
  bool done = false;
  bool waited = false;

  std::string describe() const {
    const char* k = kind == kSend ? "send to" : kind == kRecv ? "recv from" : "recv_reduce from";
    return fmt::format("{} rank {} (step {}, {} bytes, message #{} of the pair)", k, peer, step, bytes, seq);
  }
};

// Thrown by wait() once the run is aborted; not itself reported (the cause was).
struct Aborted : std::runtime_error {
  Aborted() : std::runtime_error("aborted") {}
};

struct Shared {
  explicit Shared(int n) : n(n), cvs(n), sends(n * n), recvs(n * n), sent_count(n * n, 0), recv_count(n * n, 0),
                           waiting(n), waiting_ops(n, nullptr), running(n) {}
  int n;
  std::mutex m;
  std::vector<std::condition_variable> cvs;  // one per rank: woken when one of its ops completes
  std::vector<std::deque<Op*>> sends, recvs;  // pending, by src * n + dst
  std::vector<size_t> sent_count, recv_count;
  std::vector<std::string> errors;
  bool abort = false;
  std::vector<std::string> waiting;  // per rank: what it waits for, "" when not blocked
  std::vector<const std::vector<Op*>*> waiting_ops;  // per rank: the ops of its blocked wait, or null
  int running;
  int blocked = 0;
  size_t messages = 0;

  void fail(std::string msg) {
    errors.push_back(std::move(msg));
    abort = true;
    for (auto& cv : cvs) cv.notify_all();
  }
  // Called with the lock held whenever a rank blocks or finishes.
  void check_deadlock() {
    if (abort || running == 0 || blocked < running) return;
    // A blocked rank whose ops have all completed is about to wake: no deadlock.
    for (const auto* ops : waiting_ops) {
      if (ops == nullptr) continue;
      bool all = true;
      for (const Op* op : *ops) all = all && op->done;
      if (all) return;
    }
    std::string msg = "deadlock: every live rank is blocked and nothing can complete:";
    for (int r = 0; r < n; ++r)
      if (!waiting[r].empty()) msg += fmt::format("\n  rank {} waits on {}", r, waiting[r]);
    fail(msg);
  }
  void transfer(Op& s, Op& r) {
    if (s.step != r.step) {
      return fail(fmt::format("step mismatch: message #{} from rank {} to rank {} has step {}, but rank {}'s "
                              "receive #{} from rank {} expects step {}",
                              s.seq, s.owner, r.owner, s.step, r.owner, r.seq, s.owner, r.step));
    }
    if (s.bytes != r.bytes) {
      return fail(fmt::format("size mismatch: rank {} sent {} bytes (step {}) to rank {}, which receives {} bytes{}",
                              s.owner, s.bytes, s.step, r.owner, r.bytes,
                              r.kind == Op::kRecvReduce ? fmt::format(" ({} x {})", r.count, dtype_name(r.dtype)) : ""));
    }
    try {
      if (r.kind == Op::kRecvReduce && r.own)
        reduce_into3(r.dst, r.own, s.snapshot.data(), r.count, r.dtype, r.redop);
      else if (r.kind == Op::kRecvReduce)
        reduce_into(r.dst, s.snapshot.data(), r.count, r.dtype, r.redop);
      else if (s.bytes != 0)
        std::memcpy(r.dst, s.snapshot.data(), s.bytes);
    } catch (const std::exception& e) {
      return fail(fmt::format("rank {} recv_reduce from rank {} (step {}) failed: {}", r.owner, s.owner, r.step, e.what()));
    }
    s.done = r.done = true;
    cvs[s.owner].notify_all();
    cvs[r.owner].notify_all();
  }
};

class ThreadContext final : public AlgoContext {
 public:
  ThreadContext(Shared& w, int rank, size_t chunk) : w_(w), rank_(rank), chunk_(chunk) {}
  ~ThreadContext() override {
    for (void* p : scratch_) std::free(p);
  }
  using AlgoContext::wait;

  int rank() const override { return rank_; }
  int size() const override { return w_.n; }
  size_t chunk_bytes() const override { return chunk_; }

  Request isend(int peer, uint32_t step, const void* data, size_t nbytes) override {
    auto op = make(Op::kSend, peer, step, nbytes);
    op->src = data;
    if (nbytes != 0) {
      if (data == nullptr) violation(fmt::format("rank {} isend of {} bytes from a null pointer", rank_, nbytes));
      op->snapshot.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + nbytes);
    }
    return post(std::move(op));
  }
  Request irecv(int peer, uint32_t step, void* data, size_t nbytes) override {
    auto op = make(Op::kRecv, peer, step, nbytes);
    if (nbytes != 0 && data == nullptr) violation(fmt::format("rank {} irecv of {} bytes into a null pointer", rank_, nbytes));
    op->dst = data;
    return post(std::move(op));
  }
  Request irecv_reduce(int peer, uint32_t step, void* dst, size_t count, DType dtype, ReduceOp op_kind,
                       const void* own = nullptr) override {
    auto op = make(Op::kRecvReduce, peer, step, count * dtype_size(dtype));
    if (count != 0 && dst == nullptr) violation(fmt::format("rank {} irecv_reduce of {} elements into null", rank_, count));
    op->dst = dst;
    op->own = own;
    op->count = count;
    op->dtype = dtype;
    op->redop = op_kind;
    return post(std::move(op));
  }

  void wait(std::span<const Request> reqs) override {
    std::unique_lock<std::mutex> lock(w_.m);
    std::vector<Op*> ops;
    for (Request r : reqs) {
      if (r.id < 0 || static_cast<size_t>(r.id) >= ops_.size()) {
        w_.fail(fmt::format("rank {} waited on unknown request id {}", rank_, r.id));
        throw Aborted();
      }
      ops.push_back(ops_[r.id].get());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      if (w_.abort) throw Aborted();
      bool all = true;
      for (Op* op : ops) all = all && op->done;
      if (all) break;
      std::string what;
      for (Op* op : ops)
        if (!op->done) what += (what.empty() ? "" : "; ") + op->describe();
      w_.waiting[rank_] = what;
      w_.waiting_ops[rank_] = &ops;
      ++w_.blocked;
      w_.check_deadlock();  // may abort the run; then do not sleep
      const bool timed_out = !w_.abort && w_.cvs[rank_].wait_until(lock, deadline) == std::cv_status::timeout;
      --w_.blocked;
      w_.waiting[rank_].clear();
      w_.waiting_ops[rank_] = nullptr;
      if (timed_out && !w_.abort) {
        w_.fail(fmt::format("rank {} waited 60 s on {}", rank_, what));
        throw Aborted();
      }
    }
    for (Op* op : ops) {
      op->waited = true;
      if (op->kind == Op::kSend && op->bytes != 0 && std::memcmp(op->snapshot.data(), op->src, op->bytes) != 0) {
        w_.fail(fmt::format("rank {} modified the buffer of its {} before the wait that completed it", rank_,
                            op->describe()));
        throw Aborted();
      }
    }
  }

  void* scratch(size_t nbytes, int slot) override {
    // One call per slot per collective (a real context may move the buffer on a second call).
    if (std::find(slots_.begin(), slots_.end(), slot) != slots_.end())
      violation(fmt::format("rank {} asked for scratch slot {} twice in one collective", rank_, slot));
    slots_.push_back(slot);
    // Fresh memory per call, filled with garbage: contents are undefined at entry.
    const size_t size = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size);
    std::memset(p, 0xA5 + slot, size);
    scratch_.push_back(p);
    return p;
  }

  // After the body returned: requests never waited on.
  void check_unwaited(std::vector<std::string>& errors) const {
    for (const auto& op : ops_)
      if (!op->waited) errors.push_back(fmt::format("rank {} returned without waiting on its {}", rank_, op->describe()));
  }

 private:
  std::unique_ptr<Op> make(Op::Kind kind, int peer, uint32_t step, size_t bytes) {
    auto op = std::make_unique<Op>();
    op->kind = kind;
    op->owner = rank_;
    op->peer = peer;
    op->step = step;
    op->bytes = bytes;
    if (peer < 0 || peer >= w_.n || peer == rank_)
      violation(fmt::format("rank {} posted a message with peer {} (world {}; sending to oneself is not allowed)",
                            rank_, peer, w_.n));
    return op;
  }
  void violation(const std::string& msg) {
    std::lock_guard<std::mutex> lock(w_.m);
    w_.fail(msg);
    throw Aborted();
  }
  Request post(std::unique_ptr<Op> op) {
    std::lock_guard<std::mutex> lock(w_.m);
    if (w_.abort) throw Aborted();
    Op* raw = op.get();
    const int id = static_cast<int>(ops_.size());
    ops_.push_back(std::move(op));
    if (raw->kind == Op::kSend) {
      const int pair = rank_ * w_.n + raw->peer;
      raw->seq = w_.sent_count[pair]++;
      ++w_.messages;
      auto& q = w_.recvs[pair];
      if (!q.empty()) {
        Op* r = q.front();
        q.pop_front();
        w_.transfer(*raw, *r);
      } else {
        w_.sends[pair].push_back(raw);
      }
    } else {
      const int pair = raw->peer * w_.n + rank_;
      raw->seq = w_.recv_count[pair]++;
      auto& q = w_.sends[pair];
      if (!q.empty()) {
        Op* s = q.front();
        q.pop_front();
        w_.transfer(*s, *raw);
      } else {
        w_.recvs[pair].push_back(raw);
      }
    }
    return Request{id};
  }

  Shared& w_;
  int rank_;
  size_t chunk_;
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<void*> scratch_;
  std::vector<int> slots_;
};

}  // namespace

std::string ThreadWorld::Result::summary() const {
  std::string s;
  for (const auto& e : errors) s += (s.empty() ? "" : "\n") + e;
  return s;
}

ThreadWorld::Result ThreadWorld::run(const std::function<void(AlgoContext&)>& body) {
  Shared w(size_);
  std::vector<std::unique_ptr<ThreadContext>> ctxs;
  for (int r = 0; r < size_; ++r) ctxs.push_back(std::make_unique<ThreadContext>(w, r, chunk_bytes_));
  auto rank_main = [&](int r) {
    try {
      body(*ctxs[r]);
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(w.m);
      w.fail(fmt::format("rank {} threw: {}", r, e.what()));
    }
    std::lock_guard<std::mutex> lock(w.m);
    --w.running;
    w.check_deadlock();
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < size_; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  for (auto& t : threads) t.join();

  Result res;
  res.errors = w.errors;
  res.messages = w.messages;
  if (!w.abort) {
    for (int a = 0; a < size_; ++a) {
      for (int b = 0; b < size_; ++b) {
        const int pair = a * size_ + b;
        if (!w.sends[pair].empty())
          res.errors.push_back(fmt::format("{} message(s) from rank {} to rank {} were never received (first: step {}, {} bytes)",
                                           w.sends[pair].size(), a, b, w.sends[pair].front()->step,
                                           w.sends[pair].front()->bytes));
        if (!w.recvs[pair].empty())
          res.errors.push_back(fmt::format("{} receive(s) posted by rank {} from rank {} were never matched (first: step {}, {} bytes)",
                                           w.recvs[pair].size(), b, a, w.recvs[pair].front()->step,
                                           w.recvs[pair].front()->bytes));
      }
    }
    for (const auto& c : ctxs) c->check_unwaited(res.errors);
  }
  return res;
}

}  // namespace trident::testing
