#include "trident/comm/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "trident/comm/collective.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/core/stamp_clock.h"

namespace trident {

const char* call_state_name(CallState s) {
  switch (s) {
    case CallState::kQueued: return "queued";
    case CallState::kStarted: return "started";
    case CallState::kCompleted: return "completed";
    case CallState::kFailed: return "failed";
  }
  return "?";
}

namespace {

// The most specific type name of a trident error (static text for the record).
const char* error_type_of(std::exception_ptr e, std::string* what, bool* network) {
  *network = false;
  try {
    std::rethrow_exception(e);
  } catch (const MismatchError& x) {
    *what = x.what(), *network = true;
    return "MismatchError";
  } catch (const PeerDiedError& x) {
    *what = x.what(), *network = true;
    return "PeerDiedError";
  } catch (const TimeoutError& x) {
    *what = x.what(), *network = true;
    return "TimeoutError";
  } catch (const NetworkError& x) {
    *what = x.what(), *network = true;
    return "NetworkError";
  } catch (const InvalidArgument& x) {
    *what = x.what();
    return "InvalidArgument";
  } catch (const Unsupported& x) {
    *what = x.what();
    return "Unsupported";
  } catch (const std::exception& x) {
    *what = x.what();
    return "Error";
  } catch (...) {
    *what = "unknown exception";
    return "Error";
  }
}

}  // namespace

FlightRing::FlightRing(std::string group, int rank, int size, int generation, size_t capacity)
    : slots_(capacity), group_(std::move(group)), rank_(rank), size_(size), generation_(generation) {}

uint64_t FlightRing::enqueue(const CollArgs& a) {
  const int64_t t = stamp_clock::now_anchored();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  FlightRecord& r = slots_[(id - 1) % slots_.size()];
  const CollectiveInfo& info = collective_info(a.op);
  const bool collective = !info.point_to_point;
  r.id = id;
  r.seq = collective ? next_seq_++ : 0;
  r.op = a.op;
  r.dtype = a.dtype;
  r.redop = a.redop;
  r.algo = Algo::kAuto;
  r.state = CallState::kQueued;
  r.root = info.rooted ? a.root : -1;
  r.peer = collective ? -1 : a.peer;
  r.tag = collective ? 0 : a.tag;
  r.count = a.count;
  r.enqueue_stamp = t;
  r.start_stamp = 0;
  r.end_stamp = 0;
  r.error_type = nullptr;
  if (!r.error.empty()) r.error.clear();
  return id;
}

void FlightRing::started(uint64_t id, uint64_t seq, Algo algo, int64_t stamp) {
  std::lock_guard<std::mutex> lock(mu_);
  FlightRecord& r = slots_[(id - 1) % slots_.size()];
  if (r.id != id) return;  // overwritten by a newer call (a ring smaller than the calls in flight)
  r.seq = seq;
  r.algo = algo;
  r.start_stamp = stamp;
  if (r.state == CallState::kQueued) r.state = CallState::kStarted;
}

void FlightRing::finished(uint64_t id, int64_t stamp, std::exception_ptr error) {
  std::string what;
  bool network = false;
  const char* type = error ? error_type_of(error, &what, &network) : nullptr;
  std::string seq_text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FlightRecord& r = slots_[(id - 1) % slots_.size()];
    if (r.id == id && r.end_stamp == 0) {
      r.end_stamp = stamp;
      r.state = error ? CallState::kFailed : CallState::kCompleted;
      if (error) {
        r.error_type = type;
        r.error = what;
      }
      // Named only for a failure's dump: a completed call formats nothing (this runs once per call).
      if (network) seq_text = r.seq ? fmt::format("{} #{}", op_name(r.op), r.seq) : op_name(r.op);
    } else if (network) {
      seq_text = "an overwritten call";
    }
  }
  if (network) flight_recorder::on_failure(fmt::format("{} in {} of group '{}'", type, seq_text, group_));
}

void FlightRing::describe(std::string backend, std::vector<int> global_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  backend_ = std::move(backend);
  global_ranks_ = std::move(global_ranks);
}

FlightRing::Snapshot FlightRing::snapshot() const {
  Snapshot s;
  std::lock_guard<std::mutex> lock(mu_);
  s.group = group_;
  s.rank = rank_;
  s.size = size_;
  s.generation = generation_;
  s.backend = backend_;
  s.global_ranks = global_ranks_;
  s.capacity = slots_.size();
  s.issued = next_id_ - 1;
  const uint64_t n = std::min<uint64_t>(s.issued, slots_.size());
  s.records.reserve(n);
  for (uint64_t id = s.issued - n + 1; id <= s.issued; ++id) s.records.push_back(slots_[(id - 1) % slots_.size()]);
  return s;
}

namespace flight_recorder {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<FlightRing>> rings;
  std::map<std::tuple<std::string, int, int>, int> generations;  // (group, rank, size) -> groups made
  std::string dir;           // set_dump_dir
  std::string pending;       // reason of a requested asynchronous dump
  bool started = false;      // dump thread and handlers (this process; reset in a forked child)
  bool warned_no_dir = false;
  int pipe_rd = -1;
  bool handled[2] = {false, false};  // SIGTERM, SIGUSR1: our handler is installed
  bool recording = false;            // rings are kept (SIGUSR1's dump is installed only then)
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the dump thread may outlive static destructors
  return *r;
}
std::atomic<int> g_pipe_wr{-1};
std::atomic<bool> g_failure_dumped{false};
// Dumps being written on any thread, and whether SIGTERM's dump is done and the process is about to end: the
// end waits for the dumps in flight, so a caller's dump is not cut off midway (a temporary file left beside
// the dumps), and a dump asked for after that point is refused by name.
std::atomic<int> g_dumps_in_flight{0};
std::atomic<bool> g_terminating{false};

// Functions that abort this process's groups (add_termination_hook). A mutex of their own: a hook may take
// a while (an abort writes its record to the store), and nothing else waits on it meanwhile.
struct Hooks {
  std::mutex mu;
  std::map<uint64_t, std::function<void()>> fns;
  uint64_t next = 1;
};
Hooks& hooks() {
  static Hooks* h = new Hooks;  // never destroyed: the dump thread may outlive static destructors
  return *h;
}

// The program's own SIGTERM action when trident's handler was installed over it (a Python handler, say):
// trident's handler runs it too. Written only while SIGTERM is trident's (reinstalled by guard_locked).
struct sigaction g_prev_term {};
std::atomic<bool> g_prev_term_is_handler{false};

void on_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved = errno;
  const int fd = g_pipe_wr.load(std::memory_order_relaxed);
  const char c = static_cast<char>(sig);
  if (fd >= 0) (void)!::write(fd, &c, 1);
  if (sig == SIGTERM && g_prev_term_is_handler.load(std::memory_order_acquire)) {
    if (g_prev_term.sa_flags & SA_SIGINFO) g_prev_term.sa_sigaction(sig, info, ctx);
    else g_prev_term.sa_handler(sig);
  }
  errno = saved;
}

bool ours(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == on_signal;
}

// In a forked child only the forking thread exists: forget the dump thread and give the signals back
// their default action (a child must still die of SIGTERM); the child's first ring starts them again.
void after_fork_child() {
  Registry& reg = registry();
  new (&reg.mu) std::mutex();
  // SIGTERM goes back to what the program had (its own handler, or the default: a child must still die of it).
  if (reg.handled[0]) ::sigaction(SIGTERM, &g_prev_term, nullptr), reg.handled[0] = false;
  if (reg.handled[1]) ::signal(SIGUSR1, SIG_DFL), reg.handled[1] = false;
  g_prev_term_is_handler.store(false);
  new (&hooks().mu) std::mutex();
  hooks().fns.clear();
  if (reg.pipe_rd >= 0) ::close(reg.pipe_rd);
  const int wr = g_pipe_wr.exchange(-1);
  if (wr >= 0) ::close(wr);
  reg.pipe_rd = -1;
  reg.started = false;
  reg.rings.clear();
  reg.generations.clear();
  g_failure_dumped.store(false);
  g_dumps_in_flight.store(0);
  g_terminating.store(false);
}

void dump_logged(const std::string& reason) {
  if (dump_dir().empty()) {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (!reg.warned_no_dir)
      log_warn("flight recorder: not writing a dump ({}): no folder; set TRIDENT_FLIGHT_RECORDER_DIR", reason);
    reg.warned_no_dir = true;
    return;
  }
  try {
    const std::string path = dump(reason);
    log_warn("flight recorder: {} -> {} (read it with `trident inspect {}`)", reason, path,
             std::filesystem::path(path).parent_path().string());
  } catch (const std::exception& e) {
    log_warn("flight recorder: dump failed ({}): {}", reason, e.what());
  }
}

// How long a program with a SIGTERM handler of its own has, after SIGTERM, to end by itself.
constexpr auto kTermGrace = std::chrono::seconds(5);

// SIGTERM, on the dump thread: the dump (when rings are kept), then the default action, so the process ends
// whatever its calls are doing. A program with a SIGTERM handler of its own (trident's handler ran it) first
// gets kTermGrace to end by itself: every group is aborted, so that a call blocked in one returns with an
// error (Python runs its signal handlers only between bytecodes, never while a call waits in C++).
void terminate_after_sigterm() {
  bool recording;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    recording = reg.recording;
  }
  if (recording) dump_logged("signal SIGTERM");
  if (g_prev_term_is_handler.load(std::memory_order_acquire)) {
    // On a thread of its own: an abort that blocks (a store that does not answer) must not delay the bound.
    std::thread([] {
      Hooks& h = hooks();
      std::lock_guard<std::mutex> lock(h.mu);  // a group being destroyed waits in remove_termination_hook
      for (auto& [id, fn] : h.fns) {
        try {
          fn();
        } catch (...) {
          // the group failed already: nothing more to do for it
        }
      }
    }).detach();
    std::this_thread::sleep_for(kTermGrace);
    log_warn("SIGTERM: the program did not end within {} s of it (its own handler ran); ending it now",
             std::chrono::duration_cast<std::chrono::seconds>(kTermGrace).count());
  }
  // A dump another thread started (a collective's failure) finishes first, within a bound: a full disk
  // must not keep the process alive.
  g_terminating.store(true);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (g_dumps_in_flight.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::signal(SIGTERM, SIG_DFL);
  ::kill(::getpid(), SIGTERM);
}

void guard_locked(Registry& reg);

void dump_thread(int fd) {
  for (;;) {
    // Once a second without a signal: a SIGTERM handler the program installed since (Python's
    // signal.signal after init_process_group) gets trident's installed over it again, chained.
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      Registry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      guard_locked(reg);
      continue;
    }
    char c = 0;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the pipe was closed (forked child cleanup)
    const int sig = static_cast<unsigned char>(c);
    if (sig == 0) {
      std::string reason;
      {
        Registry& reg = registry();
        std::lock_guard<std::mutex> lock(reg.mu);
        reason.swap(reg.pending);
      }
      if (!reason.empty()) dump_logged(reason);
      continue;
    }
    if (sig == SIGTERM) {
      terminate_after_sigterm();
      continue;
    }
    dump_logged("signal SIGUSR1");
  }
}

// Installs trident's SIGTERM handler over the program's (which it chains to), unless the program ignores
// SIGTERM or the handler is already trident's. Holds reg.mu; the dump thread runs.
void guard_locked(Registry& reg) {
  if (g_pipe_wr.load() < 0) return;
  struct sigaction old {};
  if (::sigaction(SIGTERM, nullptr, &old) != 0 || ours(old)) return;
  if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) return;  // the program chose to ignore it
  const bool handler = (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL;
  g_prev_term_is_handler.store(false, std::memory_order_release);  // not chained while g_prev_term changes
  g_prev_term = old;
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  if (::sigaction(SIGTERM, &sa, nullptr) != 0) return;
  g_prev_term_is_handler.store(handler, std::memory_order_release);
  reg.handled[0] = true;
}

// Starts the dump thread and installs the handlers. Holds reg.mu.
void start_locked(Registry& reg) {
  if (reg.started) {
    guard_locked(reg);  // the program may have installed a SIGTERM handler of its own since
    return;
  }
  static std::once_flag atfork;
  std::call_once(atfork, [] { ::pthread_atfork(nullptr, nullptr, after_fork_child); });
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    log_warn("flight recorder: pipe2 failed ({}); dumps on signals are off", detail::errno_string(errno));
    reg.started = true;
    return;
  }
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // a full pipe drops the byte; the handler never blocks
  reg.pipe_rd = fds[0];
  g_pipe_wr.store(fds[1]);
  std::thread(dump_thread, fds[0]).detach();
  guard_locked(reg);
  if (reg.recording) {
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) {
      struct sigaction sa {};
      sa.sa_sigaction = on_signal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESTART | SA_SIGINFO;
      if (::sigaction(SIGUSR1, &sa, nullptr) == 0) reg.handled[1] = true;
    }
  }
  reg.started = true;
}

int64_t clock_ns(clockid_t c) {
  timespec ts{};
  clock_gettime(c, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::vector<FlightRing::Snapshot> snapshots() {
  std::vector<std::shared_ptr<FlightRing>> live;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto& w : reg.rings)
      if (auto p = w.lock()) live.push_back(std::move(p));
  }
  std::vector<FlightRing::Snapshot> out;
  for (auto& r : live) out.push_back(r->snapshot());
  return out;
}

// The process's global rank: the smallest global rank of its groups (threads-as-ranks tests hold several).
int process_rank(const std::vector<FlightRing::Snapshot>& groups) {
  int best = -1;
  for (const auto& g : groups) {
    if (g.global_ranks.empty()) continue;
    const int gr = g.global_ranks[static_cast<size_t>(g.rank)];
    if (best < 0 || gr < best) best = gr;
  }
  if (best < 0)
    if (auto r = env::get("RANK")) best = std::atoi(r->c_str());
  return best;
}

}  // namespace

size_t capacity() {
  static const size_t n = [] {
    const int64_t v = env::param_size("TRIDENT_FLIGHT_RECORDER_SIZE");
    TRIDENT_CHECK(v <= (int64_t{1} << 24), InvalidArgument,
                  "TRIDENT_FLIGHT_RECORDER_SIZE={}: at most 16M calls per group (each takes about 100 bytes)", v);
    return static_cast<size_t>(v);
  }();
  return n;
}

std::shared_ptr<FlightRing> make_ring(const std::string& group, int rank, int size) {
  const size_t n = capacity();
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.recording = reg.recording || n > 0;
  start_locked(reg);  // the SIGTERM guard, recording or not
  if (n == 0) return nullptr;
  const int generation = reg.generations[{group, rank, size}]++;
  auto ring = std::make_shared<FlightRing>(group, rank, size, generation, n);
  std::erase_if(reg.rings, [](const std::weak_ptr<FlightRing>& w) { return w.expired(); });
  reg.rings.push_back(ring);
  return ring;
}

uint64_t add_termination_hook(std::function<void()> fn) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  const uint64_t id = h.next++;
  h.fns.emplace(id, std::move(fn));
  return id;
}

void remove_termination_hook(uint64_t id) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  h.fns.erase(id);
}

void set_dump_dir(const std::string& dir) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.dir = dir;
}

std::string dump_dir() {
  std::string d = env::param_string("TRIDENT_FLIGHT_RECORDER_DIR");
  if (!d.empty()) return d;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return reg.dir;
}

std::string dump_json(const std::string& reason) {
  using nlohmann::json;
  const std::vector<FlightRing::Snapshot> groups = snapshots();
  // Monotonic stamps become wall-clock microseconds, so dumps of several hosts line up (to NTP's accuracy).
  const int64_t offset_ns = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
  auto wall_us = [&](int64_t stamp) -> json {
    if (stamp == 0) return nullptr;
    return (stamp_clock::to_ns(stamp) + offset_ns) / 1000;
  };
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  json doc;
  doc["format"] = "trident-flight-recorder";
  doc["version"] = 1;
  doc["rank"] = process_rank(groups);
  doc["pid"] = static_cast<int>(getpid());
  doc["host"] = host;
  doc["reason"] = reason;
  doc["dump_time_us"] = clock_ns(CLOCK_REALTIME) / 1000;
  json jgroups = json::array();
  for (const auto& g : groups) {
    json jg;
    jg["name"] = g.group;
    jg["generation"] = g.generation;
    jg["rank"] = g.rank;
    jg["size"] = g.size;
    jg["ranks"] = g.global_ranks;
    jg["backend"] = g.backend;
    jg["capacity"] = g.capacity;
    jg["issued"] = g.issued;
    json recs = json::array();
    for (const auto& r : g.records) {
      json jr;
      jr["id"] = r.id;
      jr["seq"] = r.seq;
      jr["op"] = op_name(r.op);
      jr["count"] = r.count;
      jr["bytes"] = r.count * dtype_size(r.dtype);
      jr["dtype"] = dtype_name(r.dtype);
      jr["redop"] = collective_info(r.op).reduces ? json(reduce_op_name(r.redop)) : json(nullptr);
      jr["root"] = r.root;
      jr["peer"] = r.peer;
      jr["tag"] = r.tag;
      jr["algo"] = r.algo == Algo::kAuto ? json(nullptr) : json(algo_name(r.algo));
      jr["state"] = call_state_name(r.state);
      jr["enqueue_us"] = wall_us(r.enqueue_stamp);
      jr["start_us"] = wall_us(r.start_stamp);
      jr["end_us"] = wall_us(r.end_stamp);
      if (r.error_type) {
        jr["error_type"] = r.error_type;
        jr["error"] = r.error;
      }
      recs.push_back(std::move(jr));
    }
    jg["records"] = std::move(recs);
    jgroups.push_back(std::move(jg));
  }
  doc["groups"] = std::move(jgroups);
  return doc.dump(1);
}

std::string dump(const std::string& reason, const std::string& dir_in) {
  struct InFlight {
    InFlight() { g_dumps_in_flight.fetch_add(1); }
    ~InFlight() { g_dumps_in_flight.fetch_sub(1); }
  } in_flight;
  if (g_terminating.load())
    TRIDENT_THROW(IoError, "flight recorder: not dumping ({}): the process is ending on SIGTERM, whose dump is written",
                  reason);
  const std::string dir = dir_in.empty() ? dump_dir() : dir_in;
  if (dir.empty())
    TRIDENT_THROW(InvalidArgument,
                  "flight recorder: no dump folder; set TRIDENT_FLIGHT_RECORDER_DIR or pass a folder to dump()");
  const std::string text = dump_json(reason);
  const int rank = process_rank(snapshots());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) TRIDENT_THROW(IoError, "flight recorder: cannot create folder '{}': {}", dir, ec.message());
  const std::string name = rank >= 0 ? fmt::format("rank_{}.json", rank) : fmt::format("pid_{}.json", getpid());
  const std::string path = (std::filesystem::path(dir) / name).string();
  // Dumps of one process can overlap (a failure's on the caller's thread, a signal's on the dump thread):
  // each goes through a temporary file of its own, so every rename publishes a whole dump. (No lock: a
  // fork while another thread held it would leave the child's dumps waiting forever.)
  static std::atomic<uint64_t> serial{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, getpid(), serial.fetch_add(1));
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) TRIDENT_THROW(IoError, "flight recorder: cannot write '{}': {}", tmp, detail::errno_string(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) {
    std::remove(tmp.c_str());
    TRIDENT_THROW(IoError, "flight recorder: writing '{}' failed: {}", tmp, detail::errno_string(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    TRIDENT_THROW(IoError, "flight recorder: renaming '{}' to '{}' failed: {}", tmp, path, detail::errno_string(e));
  }
  return path;
}

void on_failure(const std::string& reason) {
  if (dump_dir().empty()) {
    dump_logged(reason);  // warns once
    return;
  }
  if (!g_failure_dumped.exchange(true)) {
    dump_logged(reason);
    return;
  }
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (!reg.pending.empty()) return;  // one already requested: it will see this failure too
    reg.pending = reason;
  }
  const int fd = g_pipe_wr.load();
  const char c = 0;
  if (fd >= 0) (void)!::write(fd, &c, 1);
}

}  // namespace flight_recorder
}  // namespace trident
