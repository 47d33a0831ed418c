#include "trident/comm/process_group.h"

#include "trident/comm/flight_recorder.h"
#include "trident/comm/reduce.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"

namespace trident {

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
  if (flight_ && a.record) flight_->started(a.record, seq, algo, Timeline::now_ns());
}

void ProcessGroup::run_recorded(CollArgs& a, const CallOptions& o) {
  if (!flight_) return run_blocking(a, o);
  a.record = record_enqueue(a);
  try {
    run_blocking(a, o);
  } catch (...) {
    flight_->finished(a.record, Timeline::now_ns(), std::current_exception());
    throw;
  }
  flight_->finished(a.record, Timeline::now_ns(), nullptr);
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
  const bool rooted = a.op == OpKind::kBroadcast || a.op == OpKind::kReduce || a.op == OpKind::kGather ||
                      a.op == OpKind::kScatter;
  if (rooted && (a.root < 0 || a.root >= size_)) fail(fmt::format("root {} is outside [0, {})", a.root, size_));
  if ((a.op == OpKind::kSend || a.op == OpKind::kRecv)) {
    if (a.peer < 0 || a.peer >= size_) fail(fmt::format("peer {} is outside [0, {})", a.peer, size_));
    if (a.peer == rank_) fail("a rank cannot send to or receive from itself");
  }
  const bool reduces = a.op == OpKind::kReduce || a.op == OpKind::kAllReduce || a.op == OpKind::kReduceScatter;
  if (reduces && !reduce_supported(a.dtype, a.redop))
    fail(fmt::format("reduce op {} is not defined on {} (it supports data movement only: broadcast, gather, "
                     "scatter, all_gather, all_to_all, send/recv)",
                     reduce_op_name(a.redop), dtype_name(a.dtype)));
  size_t n = a.count;
  auto need = [&](const void* p, const char* which) {
    if (p == nullptr && n > 0) fail(fmt::format("{} buffer is null but count is {}", which, a.count));
  };
  switch (a.op) {
    case OpKind::kBroadcast: need(a.recv, "the"); break;
    case OpKind::kReduce:
      need(a.send, "send");
      if (rank_ == a.root) need(a.recv, "recv");
      break;
    case OpKind::kAllReduce: need(a.recv, "recv"); break;
    case OpKind::kGather:
      need(a.send, "send");
      if (rank_ == a.root) need(a.recv, "recv");
      break;
    case OpKind::kScatter:
      need(a.recv, "recv");
      if (rank_ == a.root) need(a.send, "send");
      break;
    case OpKind::kAllGatherV: {
      if (!a.counts || a.counts->size() != static_cast<size_t>(size_))
        fail(fmt::format("counts has {} entries; it needs one per rank ({})", a.counts ? a.counts->size() : 0, size_));
      n = (*a.counts)[rank_];
      need(a.send, "send");
      size_t total = 0;
      for (size_t c : *a.counts) total += c;
      n = total;
      need(a.recv, "recv");
      break;
    }
    case OpKind::kSend: need(a.send, "send"); break;
    case OpKind::kRecv: need(a.recv, "recv"); break;
    case OpKind::kBarrier: break;
    default:
      need(a.send, "send");
      need(a.recv, "recv");
  }
}

std::shared_ptr<Work> ProcessGroup::submit(CollArgs args, const CallOptions& opts, bool blocking) {
  validate(args);
  if (!flight_) return post(args, opts, blocking);
  args.record = record_enqueue(args);
  std::shared_ptr<Work> work;
  try {
    work = post(args, opts, blocking);
  } catch (...) {
    flight_->finished(args.record, Timeline::now_ns(), std::current_exception());
    throw;
  }
  work->record_to(flight_, args.record);
  return work;
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
