#include "trident/comm/native/native_pg.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include <fmt/ranges.h>

#include "trident/comm/algorithms/hierarchical.h"
#include "trident/comm/flight_recorder.h"
#include "trident/comm/reduce.h"
#include "trident/comm/store/store.h"
#include "trident/comm/transport/shm.h"
#include "trident/comm/transport/shm_buffer.h"
#include "trident/comm/transport/tcp.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {

namespace {

// TRIDENT_HOST_ID, else TRIDENT_HOSTNAME, else the hostname. Emulated hosts (network namespaces share
// the hostname; tests fake hosts in one namespace) set TRIDENT_HOST_ID so each is a host of its own: its
// ranks share memory, and ranks on other hosts are reached over TCP.
std::string host_identity() {
  std::string h = env::host_id();
  if (h.empty()) h = env::hostname_override();
  if (!h.empty()) return h;
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

Seconds resolve_timeout(const GroupOptions& o) { return o.timeout.value_or(Seconds(env::timeout_seconds())); }

// A call's deadline: its start + its timeout. The start is read from CLOCK_MONOTONIC_COARSE (the same
// clock as steady_clock's CLOCK_MONOTONIC, at the last timer tick): a vDSO read without the TSC, 10-30 ns
// on the development VM against 100-150 ns for CLOCK_MONOTONIC, which is a third of a small all-reduce.
// One tick is added, so a deadline is never earlier than with the precise clock and at most one tick
// (1-4 ms) later.
Engine::Clock::time_point call_deadline(Seconds timeout) {
  static const std::chrono::nanoseconds tick = [] {
    timespec r{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) return std::chrono::nanoseconds(-1);
    return std::chrono::nanoseconds(r.tv_sec * 1000000000LL + r.tv_nsec);
  }();
  const auto t = std::chrono::duration_cast<Engine::Clock::duration>(timeout);
  timespec now{};
  if (tick.count() < 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0) return Engine::Clock::now() + t;
  const auto start = std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec) + tick;
  return Engine::Clock::time_point(std::chrono::duration_cast<Engine::Clock::duration>(start)) + t;
}

}  // namespace

NativeProcessGroup::NativeProcessGroup(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& options,
                                       std::vector<int> global_ranks)
    : ProcessGroup(rank, size, options.name, resolve_timeout(options)), base_store_(std::move(store)),
      options_(options), global_ranks_(std::move(global_ranks)) {
  if (size < 1) TRIDENT_THROW(InvalidArgument, "process group '{}': size {} must be at least 1", options.name, size);
  if (rank < 0 || rank >= size)
    TRIDENT_THROW(InvalidArgument, "process group '{}': rank {} is outside [0, {})", options.name, rank, size);
  if (global_ranks_.empty())
    for (int i = 0; i < size; ++i) global_ranks_.push_back(i);
  const double timeout_s = timeout().count();
  const Seconds t = timeout();
  // A missing or corrupt TRIDENT_TUNING_FILE fails here, before this rank waits on any peer.
  std::shared_ptr<const TuningTable> tuning_table = tuning_from_env();

  // A fresh namespace per creation of a group with this name (a job may rebuild its groups).
  int64_t ticket = base_store_->add("pg_gen/" + options.name, 1);
  int64_t generation = (ticket - 1) / size;
  std::string ns = fmt::format("pg/{}/{}", options.name, generation);
  store_ = std::make_shared<PrefixStore>(ns, base_store_);

  // Who is where.
  std::string host = host_identity();
  store_->set_string(fmt::format("info/{}", rank),
                     fmt::format("{}\t{}\t{}\t{}", host, getpid(), process_starttime(getpid()), global_ranks_[rank]));
  std::vector<PeerInfo> peers(size);
  for (int r = 0; r < size; ++r) {
    std::string v = store_->get_string(fmt::format("info/{}", r), t);
    std::istringstream in(v);
    std::string h, pid, st, gr;
    std::getline(in, h, '\t');
    std::getline(in, pid, '\t');
    std::getline(in, st, '\t');
    std::getline(in, gr, '\t');
    peers[r].host = h;
    peers[r].pid = std::atoi(pid.c_str());
    peers[r].starttime = std::strtoull(st.c_str(), nullptr, 10);
    peers[r].global_rank = std::atoi(gr.c_str());
    peers[r].same_host = h == host;
  }

  std::string transport = options.transport.empty() ? env::transport() : options.transport;
  if (transport != "auto" && transport != "shm" && transport != "tcp")
    TRIDENT_THROW(InvalidArgument, "process group '{}': transport '{}' is not one of auto, shm, tcp", options.name,
                  transport);
  std::vector<bool> use_shm(size, false), use_tcp(size, false);
  std::vector<int> local_index(size, -1);
  int local_count = 0;
  std::set<std::string> hosts;
  for (int r = 0; r < size; ++r) {
    hosts.insert(peers[r].host);
    if (peers[r].same_host && transport != "tcp") {
      use_shm[r] = true;
      local_index[r] = local_count++;
    }
  }
  if (transport == "shm" && hosts.size() > 1)
    TRIDENT_THROW(InvalidArgument,
                  "process group '{}': TRIDENT_TRANSPORT=shm but its ranks are on {} hosts; shared memory works only "
                  "within a host (use auto or tcp)",
                  options.name, hosts.size());
  for (int r = 0; r < size; ++r) use_tcp[r] = r != rank && !use_shm[r];

  std::unique_ptr<ShmSegment> seg;
  if (local_count >= 2) {
    size_t ring = static_cast<size_t>(env::shm_ring_bytes());
    if (ring == 0) ring = local_count <= 4 ? (4 << 20) : (1 << 20);  // more local peers: smaller rings each
    seg = ShmSegment::create_or_open(*store_, "shm/" + host, local_index[rank], local_count, ring, timeout_s,
                                     ShmWindow::region_bytes(local_count, ShmWindow::default_stage_bytes(local_count)));
  }
  std::vector<std::unique_ptr<Channel>> channels =
      connect_tcp_mesh(*store_, rank, size, use_tcp, fnv1a(ns), timeout_s);
  for (int r = 0; r < size; ++r)
    if (r != rank && use_shm[r]) channels[r] = seg->channel_to(local_index[r]);

  engine_ = std::make_unique<Engine>(options.name, rank, size, peers, std::move(channels), std::move(seg), local_index,
                                     store_);
  // Cost-model links: inside a host shared memory (or TCP when TRIDENT_TRANSPORT=tcp), across hosts TCP.
  const LinkCost shm_link{1.5e-6, 1.0 / 6e9, 1.0 / 10e9}, tcp_link{25e-6, 1.0 / 2e9, 1.0 / 10e9};
  intra_link_ = transport == "tcp" ? tcp_link : shm_link;
  inter_link_ = tcp_link;
  layout_ = host_layout(*engine_);
  // Measured choices, when TRIDENT_TUNING_FILE covers this group. The group's transport kind is derived
  // from what every rank knows (hosts and the requested transport), so every rank decides alike.
  if (const auto& table = tuning_table; table && size > 1) {
    std::string kind = transport == "tcp" || hosts.size() == static_cast<size_t>(size) ? "tcp"
                       : hosts.size() == 1                                                ? "shm"
                                                                                          : "shm+tcp";
    if (table->covers(kind, size)) tuning_ = table;
    else warn_tuning_not_covered(*table, env::tuning_file(), kind, size);
  }
  debug_comm_ = log_debug_enabled("comm");
  transport_info_.shm_peers = engine_->peer_count(true);
  transport_info_.tcp_peers = engine_->peer_count(false);
  transport_info_.hosts = layout_.hosts();
  transport_info_.summary = fmt::format("{} ranks on {}; transport {}: {} shm peers, {} tcp peers", size,
                                        layout_.describe(), transport, transport_info_.shm_peers,
                                        transport_info_.tcp_peers);
  if (rank == 0 && options.name == "world") log_info("process group '{}': {}", options.name, transport_info_.summary);
  else log_debug("comm", "process group '{}' rank {}: {}", options.name, rank, transport_info_.summary);
  // SIGTERM in a program with a handler of its own: calls blocked here return (flight_recorder.h).
  termination_hook_ = flight_recorder::add_termination_hook([this] { abort("this process received SIGTERM"); });
}

NativeProcessGroup::~NativeProcessGroup() {
  flight_recorder::remove_termination_hook(termination_hook_);
  bool poke;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    poke = idle_;
  }
  if (poke) engine_->wake();
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Algo NativeProcessGroup::choose_algorithm(const CollArgs& a, Algo forced) const {
  const char* source = nullptr;
  return choose_algorithm(a, forced, &source);
}

Algo NativeProcessGroup::choose_algorithm(const CollArgs& a, Algo forced, const char** source) const {
  *source = "forced";
  if (collective_info(a.op).point_to_point) return Algo::kAuto;
  auto candidates = algorithms_for(a.op);
  auto names = [&] {
    std::vector<std::string> n;
    for (auto* c : candidates) n.push_back(algo_name(c->algo));
    return fmt::format("{}", fmt::join(n, ", "));
  };
  if (candidates.empty())
    TRIDENT_THROW(Unsupported, "backend native: no algorithm implements {}", op_name(a.op));
  if (forced != Algo::kAuto) {
    const AlgorithmInfo* info = find_algorithm(a.op, forced);
    if (!info)
      TRIDENT_THROW(InvalidArgument, "algorithm '{}' is not available for {}; available: {}", algo_name(forced),
                    op_name(a.op), names());
    if (info->applicable && !info->applicable(a, size()))
      TRIDENT_THROW(InvalidArgument, "algorithm '{}' cannot run {} on {} ranks", algo_name(forced), describe(a), size());
    return forced;
  }
  static const std::string env_algo = env::algo();
  if (!env_algo.empty()) {
    Algo e = parse_algo(env_algo);
    const AlgorithmInfo* info = find_algorithm(a.op, e);
    *source = "TRIDENT_ALGO";
    if (info && (!info->applicable || info->applicable(a, size()))) return e;
  }
  // The window algorithms (shm, cma) only run as themselves when the group has a shared-memory window
  // (e.g. not with --transport tcp): otherwise they would run their message-passing fallback under their
  // name, so the automatic choice (tuning or cost model) leaves them out. Forcing them still works.
  const bool window = engine_->has_shm_window();
  auto usable = [&](const AlgorithmInfo* c) {
    if (c->applicable && !c->applicable(a, size())) return false;
    return window || (c->algo != Algo::kShm && c->algo != Algo::kCma);
  };
  if (tuning_) {
    const double tbytes = static_cast<double>(size_bytes(a, size()));
    const AlgorithmInfo* best = nullptr;
    double best_t = 0;
    for (auto* c : candidates) {
      if (!usable(c)) continue;
      std::optional<double> t = tuning_->predict(a.op, c->algo, tbytes);
      if (t && (!best || *t < best_t)) best = c, best_t = *t;
    }
    if (best) {
      *source = "tuning";
      return best->algo;
    }
  }
  *source = "cost model";
  // Size as the algorithms' cost() counts it (size_bytes: the whole gathered/scattered buffer).
  const size_t bytes = size_bytes(a, size());
  const AlgorithmInfo* best = nullptr;
  double best_t = 0;
  std::string trace;
  const bool debug = log_debug_enabled("comm");
  for (auto* c : candidates) {
    if (!usable(c)) continue;
    double t = predict_seconds(*c, bytes, layout_, intra_link_, inter_link_);
    if (debug)
      trace += fmt::format("{}{} {}", trace.empty() ? "" : ", ", algo_name(c->algo),
                           std::isfinite(t) ? fmt::format("{:.1f}us", t * 1e6) : std::string("n/a"));
    if (!best || t < best_t) best = c, best_t = t;
  }
  if (debug && best)
    log_debug("comm", "group '{}' rank {}: {} on {}: cost model predicts {} -> {}", name(), rank(), describe(a),
              layout_.describe(), trace, algo_name(best->algo));
  if (!best) TRIDENT_THROW(Unsupported, "backend native: no algorithm can run {} on {} ranks", describe(a), size());
  return best->algo;
}

const AlgorithmInfo* NativeProcessGroup::choose_memoized(const CollArgs& args, Algo forced, Algo* algo,
                                                         const char** source, std::string* description) {
  if (collective_info(args.op).point_to_point) {
    *algo = Algo::kAuto;
    *source = "forced";
    if (description) *description = fmt::format("{} in group '{}'", describe(args), name());
    return nullptr;
  }
  // ---- memo: the same call as last time (same op, count, dtype, op, root, forced algorithm) reuses its
  // choice and description; the choice depends on nothing else that changes after construction ----
  const bool memoizable = args.op != OpKind::kAllGatherV;
  const ChoiceMemo& m = memo_;
  if (memoizable && m.valid && m.op == args.op && m.count == args.count && m.dtype == args.dtype &&
      m.redop == args.redop && m.root == args.root && m.forced == forced) {
    *algo = m.algo;
    *source = m.source;
    if (description) *description = m.description;
    return m.info;
  }
  *algo = choose_algorithm(args, forced, source);
  const AlgorithmInfo* info = find_algorithm(args.op, *algo);
  if (!info)
    TRIDENT_THROW(Unsupported, "backend native: algorithm '{}' does not implement {}", algo_name(*algo),
                  op_name(args.op));
  std::string d = fmt::format("{} in group '{}'", describe(args), name());
  if (memoizable)
    memo_ = ChoiceMemo{true, args.op, args.count, args.dtype, args.redop, args.root, forced, *algo, *source, info, d};
  if (description) *description = std::move(d);
  return info;
}  // ---- end memo ----

std::shared_ptr<Work> NativeProcessGroup::post(const CollArgs& args, const CallOptions& opts, bool blocking) {
  const auto deadline = call_deadline(opts.timeout.value_or(timeout()));
  auto item = std::make_unique<Item>();
  item->args = args;
  if (args.counts) {
    item->counts = *args.counts;
    item->args.counts = &item->counts;
  }
  item->deadline = deadline;
  std::unique_lock<std::mutex> lock(mu_);
  const char* source = nullptr;
  std::string description;
  item->info = choose_memoized(args, opts.algo, &item->algo, &source, &description);
  item->work = std::make_shared<Work>(std::move(description));
  if (debug_comm_) {
    // Which buffers are registered memory (alloc_shared): the cma path reads and writes those in place.
    auto registered = [](const void* p) {
      ShmBuffer::Registration r;
      return p && ShmBuffer::lookup(p, 1, &r);
    };
    const bool rs = registered(args.send), rr = registered(args.recv);
    log_debug("comm", "group '{}' rank {}: {} -> algorithm {} ({}){}", name(), rank(), describe(args),
              algo_name(item->algo), source,
              rs || rr ? fmt::format("; registered buffers: {}", rs && rr ? "send and recv" : rs ? "send" : "recv")
                       : std::string());
  }
  auto work = item->work;
  const bool collective = args.op != OpKind::kSend && args.op != OpKind::kRecv;
  item->seq = collective ? next_seq_++ : 0;
  queue_.push_back(std::move(item));
  if (blocking && !busy_) {
    // Nothing else drives the group: this thread does, until its own call finished (it also takes calls
    // queued meanwhile by other threads, and progresses pending sends and receives).
    busy_ = true;
    Work* w = work.get();
    drive(lock, [w] { return w->completed(); });
    busy_ = false;
    const bool more = !queue_.empty() || p2p_count_ > 0;
    if (more && !worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    lock.unlock();
    if (more) cv_.notify_all();
    return work;
  }
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  const bool poke = idle_;  // the driver sleeps on pending sends and receives: wake it for this call
  lock.unlock();
  if (poke) engine_->wake();
  cv_.notify_all();
  return work;
}

// The synchronous fast path: with nothing queued, running or pending on the group, a blocking collective
// runs here, on the caller's thread, in issue order (it takes its sequence number under mu_ like post, and
// the worker does not start another item while busy_), with the same deadline, fingerprints and failure
// handling as a Work, but no Work: no heap allocation, no condition variable, no string. Sends and
// receives take post()'s path (they may finish after later calls: they need a Work).
void NativeProcessGroup::run_blocking(const CollArgs& args, const CallOptions& opts) {
  const auto deadline = call_deadline(opts.timeout.value_or(timeout()));
  std::unique_lock<std::mutex> lock(mu_);
  const bool collective = args.op != OpKind::kSend && args.op != OpKind::kRecv;
  if (!collective || !queue_.empty() || busy_ || p2p_count_ > 0 || debug_comm_) {
    lock.unlock();
    post(args, opts, true)->wait();
    return;
  }
  Algo algo;
  const char* source = nullptr;
  const AlgorithmInfo* info = choose_memoized(args, opts.algo, &algo, &source, nullptr);
  const uint64_t seq = next_seq_++;
  busy_ = true;
  lock.unlock();
  std::exception_ptr error = run_call(args, info, algo, seq, deadline);
  lock.lock();
  busy_ = false;
  const bool wake = !queue_.empty();
  lock.unlock();
  if (wake) cv_.notify_all();
  if (error) std::rethrow_exception(error);
}

template <class Done>
void NativeProcessGroup::drive(std::unique_lock<std::mutex>& lock, Done done) {
  for (;;) {
    if (done()) return;
    if (!queue_.empty()) {
      std::unique_ptr<Item> item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (collective_info(item->args.op).point_to_point) start_p2p(*item);
      else execute(*item);
      reap_p2p();
      lock.lock();
      p2p_count_ = p2p_.size();
      continue;
    }
    if (p2p_.empty()) return;  // nothing left to drive (a caller's call is then finished)
    idle_ = true;
    lock.unlock();
    try {
      engine_->idle_wait();
    } catch (const NetworkError&) {
      engine_->fail(std::current_exception());
    } catch (const std::exception& e) {
      engine_->abort(engine_->record(AbortRecord::Kind::kOther,
                                     fmt::format("rank {} of group '{}' failed: {}", rank(), name(), e.what())));
      engine_->fail(std::current_exception());
    }
    reap_p2p();
    lock.lock();
    idle_ = false;
    p2p_count_ = p2p_.size();
  }
}

void NativeProcessGroup::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !busy_ && (stop_ || !queue_.empty() || p2p_count_ > 0); });
    if (queue_.empty() && p2p_count_ == 0) return;  // stop_, with nothing left to run
    busy_ = true;
    drive(lock, [&] { return queue_.empty() && p2p_.empty(); });
    busy_ = false;
    cv_.notify_all();
  }
}

void NativeProcessGroup::start_p2p(Item& it) {
  it.work->mark_started();
  record_started(it.args, 0, Algo::kAuto);  // the flight recorder's start time
  try {
    p2p_.push_back({engine_->start_p2p(it.args, it.deadline), it.work});
  } catch (const NetworkError&) {
    it.work->finish(engine_->fail(std::current_exception()));
  } catch (const std::exception& e) {
    engine_->abort(engine_->record(AbortRecord::Kind::kOther, fmt::format("rank {} of group '{}' failed in {}: {}",
                                                                          rank(), name(), describe(it.args), e.what())));
    it.work->finish(engine_->fail(std::current_exception()));
  }
}

void NativeProcessGroup::reap_p2p() {
  if (p2p_.empty()) return;
  std::exception_ptr failed = engine_->failure();
  if (!failed) {
    try {
      engine_->check_p2p_deadlines();
    } catch (...) {
      failed = engine_->fail(std::current_exception());
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < p2p_.size(); ++i) {
    PendingP2P& p = p2p_[i];
    const bool done = engine_->p2p_done(p.handle);
    if (!done && !failed) {
      if (kept != i) p2p_[kept] = std::move(p);
      ++kept;
      continue;
    }
    if (done) p.work->set_source_rank(engine_->p2p_source(p.handle));
    engine_->release_p2p(p.handle);
    p.work->finish(done ? nullptr : failed);
  }
  p2p_.resize(kept);
}

void NativeProcessGroup::execute(Item& it) {
  it.work->mark_started();
  it.work->finish(run_call(it.args, it.info, it.algo, it.seq, it.deadline));
}

std::exception_ptr NativeProcessGroup::run_call(const CollArgs& a, const AlgorithmInfo* info, Algo algo, uint64_t seq,
                                                Engine::Clock::time_point deadline) {
  record_started(a, seq, algo);  // the flight recorder's start time, sequence number and algorithm
  try {
    engine_->begin(a, algo, seq, deadline);
    const size_t es = dtype_size(a.dtype);
    {  // (sends and receives are not run here: start_p2p)
      CollArgs run = a;
      // (The shared-memory fast path, the single-copy path and the ring read `send` themselves: one copy
      // fewer out of place.)
      if (a.op == OpKind::kAllReduce && a.send != a.recv && a.count > 0 && algo != Algo::kShm && algo != Algo::kCma &&
          algo != Algo::kRing)
        std::memmove(a.recv, a.send, a.count * es);
      // All-to-all reads every block of send while writing recv: an in-place call works from a copy.
      std::vector<uint8_t> a2a_copy;
      if (a.op == OpKind::kAllToAll && a.count > 0) {
        const size_t bytes = a.count * size() * es;
        auto s0 = reinterpret_cast<uintptr_t>(a.send), r0 = reinterpret_cast<uintptr_t>(a.recv);
        if (s0 < r0 + bytes && r0 < s0 + bytes) {
          a2a_copy.assign(static_cast<const uint8_t*>(a.send), static_cast<const uint8_t*>(a.send) + bytes);
          run.send = a2a_copy.data();
        }
      }
      if (run.redop == ReduceOp::kAvg) run.redop = ReduceOp::kSum;
      info->run(*engine_, run);
      if (a.redop == ReduceOp::kAvg && size() > 1) {
        if (a.op == OpKind::kAllReduce || a.op == OpKind::kReduceScatter) scale_divide(a.recv, a.count, a.dtype, size());
        else if (a.op == OpKind::kReduce && rank() == a.root) scale_divide(a.recv, a.count, a.dtype, size());
      }
    }
    engine_->end();
    return nullptr;
  } catch (const NetworkError&) {
    return engine_->fail(std::current_exception());
  } catch (const std::exception& e) {
    engine_->abort(engine_->record(AbortRecord::Kind::kOther, fmt::format("rank {} of group '{}' failed in {}: {}",
                                                                          rank(), name(), describe(a), e.what())));
    return engine_->fail(std::current_exception());
  }
}

void NativeProcessGroup::abort(const std::string& reason) {
  // Any thread may call this: the record carries no collective (the executing thread's state is not read).
  AbortRecord r;
  r.reporter = rank();
  r.message = fmt::format("group '{}' aborted by rank {}: {}", name(), rank(), reason);
  engine_->abort(r);
  engine_->fail(std::make_exception_ptr(NetworkError(fmt::format("group '{}' aborted on this rank: {}", name(), reason),
                                                     rank())));
  engine_->wake();  // a driver sleeping on pending sends and receives fails them now
  abort_device_lane(reason);
}

TransportInfo NativeProcessGroup::transport_info() const { return transport_info_; }

std::shared_ptr<RegisteredBuffer> NativeProcessGroup::alloc_shared(size_t bytes) {
  if (size() < 2 || !engine_->has_shm_window()) return nullptr;
  return ShmBuffer::allocate(bytes);
}

std::shared_ptr<ProcessGroup> NativeProcessGroup::make_subgroup(const std::vector<int>& members,
                                                               const std::string& name) {
  auto it = std::find(members.begin(), members.end(), rank());
  if (it == members.end()) return nullptr;
  GroupOptions o = options_;
  o.name = name;
  o.timeout = timeout();
  std::vector<int> globals;
  for (int m : members) globals.push_back(global_ranks_[m]);
  return std::make_shared<NativeProcessGroup>(base_store_, static_cast<int>(it - members.begin()),
                                              static_cast<int>(members.size()), o, globals);
}

std::shared_ptr<ProcessGroup> NativeProcessGroup::make_group(const std::vector<int>& ranks, const std::string& name) {
  int k = ++subgroup_counter_;
  std::string n = fmt::format("{}.{}", this->name(), name.empty() ? fmt::format("g{}", k) : name);
  return make_subgroup(ranks, n);
}

std::shared_ptr<ProcessGroup> NativeProcessGroup::split(int color, int key) {
  int k = ++subgroup_counter_;
  store_->set_string(fmt::format("split{}/{}", k, rank()), fmt::format("{} {}", color, key));
  std::vector<std::pair<int, int>> mine;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    std::istringstream in(store_->get_string(fmt::format("split{}/{}", k, r), timeout()));
    int c = 0, kk = 0;
    in >> c >> kk;
    if (c == color && color >= 0) mine.emplace_back(kk, r);
  }
  if (color < 0) return nullptr;
  std::sort(mine.begin(), mine.end());
  std::vector<int> members;
  for (auto& [kk, r] : mine) members.push_back(r);
  return make_subgroup(members, fmt::format("{}.s{}c{}", name(), k, color));
}

}  // namespace trident
