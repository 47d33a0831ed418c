#include "trident/launch/launcher.h"

#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include <fmt/ranges.h>

#include "trident/comm/store/rendezvous.h"
#include "trident/comm/store/tcp_store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/launch/job_rounds.h"
#include "trident/launch/supervisor.h"

extern char** environ;

namespace trident::launch {
namespace {

bool is_loopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1";
}

// Where node 0 binds the store: the loopback address itself, or every interface when other hosts connect.
std::string bind_host(const std::string& master_addr) {
  if (!is_loopback(master_addr)) return "0.0.0.0";
  return master_addr == "localhost" ? "127.0.0.1" : master_addr;
}

// Writes "PORT\n" to `path` through a temporary file and a rename, so a reader polling for the file never sees
// it half-written.
void write_port_file(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  const std::string text = fmt::format("{}\n", port);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int e = errno;
  if (f != nullptr && std::fclose(f) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    TRIDENT_THROW(IoError, "--port-file {}: cannot write the store's port there: {}; give a writable path", path,
                  detail::errno_string(e));
  }
}

void print_error_line(const std::string& text) {
  std::string line = text + "\n";
  std::fflush(stdout);
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

constexpr const char* kDoneKey = "trident_launch/done";  // nodes whose launchers are leaving the job
constexpr double kWatchSeconds = 0.25;                    // how often a node looks for others' failures
constexpr double kLinkRequestSeconds = 10.0;              // deadline of each launcher-to-launcher request

// Marks this node done; node 0 then keeps serving the store until every node is done (their ranks and
// launchers may still need it), at most `timeout` seconds, or grace + 10 s when the job failed (the others
// then only need the time to notice it and stop their ranks). Never throws.
// `expected`: the nodes that will report (those that never joined the last round, `round`, will not).
void finish_node(JobRounds& rounds, const LaunchOptions& o, bool hosting, double timeout, bool failed,
                 int round, int expected) {
  try {
    Store& link = rounds.store(std::min(timeout, kLinkRequestSeconds));
    int64_t done = link.add(kDoneKey, 1);
    log_debug("launch", "trident launch: node {} done ({} of {} nodes)", o.node_rank, done, o.nnodes);
    if (!hosting) return;
    const auto start = std::chrono::steady_clock::now();
    bool told = false;
    const double short_limit = std::min(timeout, o.grace_seconds + 10.0);
    double limit = failed ? short_limit : timeout;
    while (done < expected) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (limit > short_limit && !rounds.failure(round).why.empty()) limit = short_limit;  // failed since
      if (waited >= limit) {
        print_error_line(fmt::format("trident launch: gave up waiting for {} of {} nodes to finish after {:.0f} s "
                                     "; stopping the store",
                                     expected - done, expected, waited));
        return;
      }
      if (!told && waited > 5) {
        print_error_line(fmt::format("trident launch: node 0 keeps the store up until the other {} node{} finish",
                                     expected - done, expected - done == 1 ? "" : "s"));
        told = true;
      }
      ::usleep(50 * 1000);
      done = link.add(kDoneKey, 0);
    }
  } catch (const Error& e) {
    rounds.drop_store();
    log_warn("trident launch: exit barrier: {}", e.what());
  }
}

// This node's name in the others' messages: TRIDENT_HOST_ID, TRIDENT_HOSTNAME, else the hostname.
std::string host_name() {
  if (std::string id = env::host_id(); !id.empty()) return id;
  if (std::string h = env::hostname_override(); !h.empty()) return h;
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string join_command(const std::vector<std::string>& command) {
  std::string out;
  for (const auto& a : command) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

}  // namespace

Bind parse_bind(const std::string& text, const std::string& what) {
  if (text == "none") return Bind::kNone;
  if (text == "core") return Bind::kCore;
  if (text == "auto") return Bind::kAuto;
  TRIDENT_THROW(InvalidArgument, "{} '{}': CPU binding must be one of none, core, auto", what, text);
}

const char* bind_name(Bind bind) {
  switch (bind) {
    case Bind::kNone: return "none";
    case Bind::kCore: return "core";
    case Bind::kAuto: return "auto";
  }
  return "?";
}

Bind default_bind() { return parse_bind(env::bind(), "TRIDENT_BIND"); }

bool in_launched_job() { return rendezvous_from_env().source != "single"; }

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  TRIDENT_CHECK(::sched_getaffinity(0, sizeof set, &set) == 0, IoError, "sched_getaffinity: {}; use --bind none",
                detail::errno_string(errno));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<int> rank_cpus(Bind bind, const std::vector<int>& allowed, int local_rank, int local_ranks) {
  TRIDENT_CHECK(local_ranks >= 1 && local_rank >= 0 && local_rank < local_ranks, InvalidArgument,
                "rank_cpus: local rank {} of {} is out of range", local_rank, local_ranks);
  const size_t n = allowed.size();
  const auto p = static_cast<size_t>(local_ranks);
  const auto i = static_cast<size_t>(local_rank);
  if (n == 0 || bind == Bind::kNone) return {};
  if (bind == Bind::kCore) return {allowed[i % n]};
  // auto, oversubscribed: round-robin as core. Left unbound, the scheduler let ranks that wait on each
  // other share a core while the other idled (4 ranks on 2 cores, 40 steps: PP 4 18.8-23.7k tokens/s
  // unbound, 32.1-32.8k bound; TP 2 x PP 2 21.0k / 38.2k; DDP 38-40k either way; a 1 MiB all_reduce
  // 0.81-1.52x OpenMPI unbound, 1.26-1.38x bound).
  if (p > n) return {allowed[i % n]};
  std::vector<int> share(allowed.begin() + static_cast<std::ptrdiff_t>(i * n / p),
                         allowed.begin() + static_cast<std::ptrdiff_t>((i + 1) * n / p));
  if (share.size() == n) return {};  // the whole set: nothing to change
  return share;
}

void validate(const LaunchOptions& o) {
  TRIDENT_CHECK(o.nproc_per_node >= 1, InvalidArgument,
                "--nproc-per-node {}: need at least 1 process per node", o.nproc_per_node);
  TRIDENT_CHECK(o.nproc_per_node <= 4096, InvalidArgument,
                "--nproc-per-node {}: at most 4096 processes per node", o.nproc_per_node);
  TRIDENT_CHECK(o.nnodes >= 1, InvalidArgument, "--nnodes {}: need at least 1 node", o.nnodes);
  TRIDENT_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, InvalidArgument,
                "--node-rank {} with --nnodes {}: the node rank must be in [0, {}]", o.node_rank, o.nnodes,
                o.nnodes - 1);
  TRIDENT_CHECK(o.master_port >= 0 && o.master_port <= 65535, InvalidArgument,
                "--master-port {}: a TCP port is in [0, 65535] (0 picks a free one)", o.master_port);
  TRIDENT_CHECK(o.master_port != 0 || o.nnodes == 1 || (o.node_rank == 0 && !o.port_file.empty()), InvalidArgument,
                "--master-port 0 with --nnodes {} on node {}: {}", o.nnodes, o.node_rank,
                o.node_rank == 0 ? "the other nodes cannot learn a port picked here; give every node the same fixed "
                                   "--master-port, or add --port-file FILE and pass the port node 0 writes there"
                                 : "a node other than 0 needs node 0's real port; give the --master-port node 0 "
                                   "uses (with --master-port 0 and --port-file, the port it wrote)");
  TRIDENT_CHECK(o.port_file.empty() || o.node_rank == 0, InvalidArgument,
                "--port-file {} on node {}: only node 0 hosts the store and writes its port; drop --port-file here",
                o.port_file, o.node_rank);
  TRIDENT_CHECK(!o.master_addr.empty(), InvalidArgument, "--master-addr is empty; give node 0's address");
  TRIDENT_CHECK(o.grace_seconds >= 0, InvalidArgument, "--grace-period {}: must be >= 0 seconds", o.grace_seconds);
  TRIDENT_CHECK(o.max_restarts >= 0, InvalidArgument, "--max-restarts {}: must be >= 0 (0: no restarts)",
                o.max_restarts);
  TRIDENT_CHECK(!o.join_timeout_seconds || *o.join_timeout_seconds > 0, InvalidArgument,
                "--join-timeout {}: must be > 0 seconds", o.join_timeout_seconds.value_or(0));
  if (!o.bind) default_bind();  // a bad TRIDENT_BIND is an error before anything starts
  TRIDENT_CHECK(!o.command.empty() && !o.command[0].empty(), InvalidArgument,
                "no command to launch; usage: trident launch -n N [options] -- COMMAND [ARGS...]");
}

std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchOptions& o, int local_rank, int port,
                                                                  const std::string& token, int restart) {
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  std::vector<std::pair<std::string, std::string>> env = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TRIDENT_STORE_TOKEN", token},
      {"TRIDENT_STORE_HOSTED", "1"},
      {"TRIDENT_RESTART_COUNT", std::to_string(restart)},
      {"TRIDENT_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
  };
  if (!o.flight_recorder_dir.empty()) env.emplace_back("TRIDENT_FLIGHT_RECORDER_DIR", o.flight_recorder_dir);
  return env;
}

std::string random_token() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      TRIDENT_THROW(IoError, "getrandom: {}", detail::errno_string(errno));
    }
    got += static_cast<size_t>(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

int launch(const LaunchOptions& o) {
  validate(o);
  std::string token = env::store_token();
  if (token.empty()) {
    TRIDENT_CHECK(o.nnodes == 1, InvalidArgument,
                  "--nnodes {} needs a shared store token: export the same TRIDENT_STORE_TOKEN on every node "
                  "(e.g. TRIDENT_STORE_TOKEN=$(openssl rand -hex 16))",
                  o.nnodes);
    token = random_token();
  }
  const double timeout = env::timeout_seconds();
  if (!o.flight_recorder_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.flight_recorder_dir, ec);
    if (ec || !std::filesystem::is_directory(o.flight_recorder_dir))
      TRIDENT_THROW(IoError, "--flight-recorder-dir '{}': cannot create the folder ({}); pass a writable folder",
                    o.flight_recorder_dir, ec ? ec.message() : "a file of that name exists");
  }
  // Where the ranks write their flight-recorder dumps, when a failure report should point at them.
  const std::string dump_dir =
      o.flight_recorder_dir.empty() ? env::param_string("TRIDENT_FLIGHT_RECORDER_DIR") : o.flight_recorder_dir;
  auto dumps_note = [&]() -> std::string {
    if (dump_dir.empty()) return {};
    std::error_code ec;
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dump_dir, ec)) {
      const std::string name = e.path().filename().string();
      n += name.starts_with("rank_") && name.ends_with(".json") ? 1 : 0;
    }
    if (n == 0) return {};
    return fmt::format("; {} {} flight-recorder dumps are in {} (trident inspect {} says where each stopped)", n,
                       n == 1 ? "rank's" : "ranks'", dump_dir, dump_dir);
  };

  // Node 0 hosts the rendezvous store for the whole job.
  std::unique_ptr<TCPStoreServer> server;
  int port = o.master_port;
  if (o.node_rank == 0) {
    const std::string host = bind_host(o.master_addr);
    try {
      server = std::make_unique<TCPStoreServer>(host, o.master_port, token);
    } catch (const Error& e) {
      TRIDENT_THROW(StoreError,
                    "trident launch cannot host the rendezvous store on {}:{}: {}; choose another --master-port "
                    "(0 picks a free one)",
                    host, o.master_port, e.what());
    }
    port = server->port();
    log_debug("launch", "trident launch: store on {}:{}, {} local ranks", host, port, o.nproc_per_node);
    if (!o.port_file.empty()) write_port_file(o.port_file, port);
  }

  // Every launcher, node 0's included, takes part in the job's rounds through a client of that store
  // (node 0's over loopback, so it keeps its store even when its own link to the others is cut). A single
  // node runs the same rounds with itself.
  const double join_timeout = o.join_timeout_seconds.value_or(timeout);
  const double request_timeout = std::min(timeout, kLinkRequestSeconds);
  std::string link_host = o.master_addr;
  if (server) link_host = bind_host(o.master_addr) == "0.0.0.0" ? "127.0.0.1" : bind_host(o.master_addr);
  RoundsOptions ro;
  ro.nnodes = o.nnodes;
  ro.node_rank = o.node_rank;
  ro.host = host_name();
  ro.join_timeout = join_timeout;
  ro.request_timeout = request_timeout;
  ro.store_where = fmt::format("node 0's store at {}:{}", o.master_addr, port);
  JobRounds rounds(ro, [link_host, port, token, request_timeout](double wait) -> std::unique_ptr<Store> {
    auto client = std::make_unique<TCPStore>(link_host, port, token, Seconds(wait));
    // Later requests are quick checks; a store that does not answer one within this bound is treated as gone.
    client->set_timeout(Seconds(request_timeout));
    return client;
  });
  auto describe_rank = [&](const ChildResult& c, int local) {
    return fmt::format("rank {} (pid {}) {}", o.node_rank * o.nproc_per_node + local, c.pid, c.describe());
  };

  std::set<std::string> ours;
  for (const auto& [k, v] : rank_environment(o, 0, port, token)) ours.insert(k);
  std::vector<std::string> base_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    if (ours.count(kv.substr(0, kv.find('='))) == 0) base_env.push_back(std::move(kv));
  }

  int round = 0;           // the restart round every node is in (the job's restart count)
  RoundFailure remote;     // why another node's failure (or a lost store) stopped this node's ranks
  bool published = false;  // this node's failure of the round is in the store
  double next_watch = 0;
  SuperviseOptions sopts;
  sopts.grace_seconds = o.grace_seconds;
  sopts.tail_lines = 20;
  sopts.stop_on_failure = true;
  sopts.forward_signals = true;
  sopts.on_tick = [&](Supervisor& s) {
    if (!published && s.first_failure() >= 0) {
      const ChildResult& c = s.child(static_cast<size_t>(s.first_failure()));
      rounds.publish_failure(round, describe_rank(c, s.first_failure()), c.term_signal != 0);
      published = true;
    }
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (s.stopping() || now < next_watch) return;
    next_watch = now + kWatchSeconds;
    try {
      remote = rounds.failure(round);
    } catch (const Error& e) {
      remote = {e.what(), false};
    }
    if (!remote.why.empty()) s.stop_all(SIGTERM);
  };

  const Bind bind = o.bind ? *o.bind : default_bind();
  const std::vector<int> allowed = bind == Bind::kNone ? std::vector<int>{} : allowed_cpus();
  // One round: start every local rank and supervise them until all have ended. Returns false when a rank
  // could not be started (the others are stopped; `start_error` says why).
  std::string start_error;
  auto run_round = [&](int restart, SuperviseResult& result) {
    auto supervisor = std::make_unique<Supervisor>(sopts);
    for (int local = 0; local < o.nproc_per_node; ++local) {
      ChildSpec spec;
      spec.cpus = rank_cpus(bind, allowed, local, o.nproc_per_node);
      log_debug("launch", "trident launch: --bind {}: local rank {} on CPUs {}", bind_name(bind), local,
                spec.cpus.empty() ? std::string("(inherited)") : fmt::format("{}", fmt::join(spec.cpus, ",")));
      spec.argv = o.command;
      spec.env = base_env;
      for (const auto& [k, v] : rank_environment(o, local, port, token, restart)) spec.env.push_back(k + "=" + v);
      const int rank = o.node_rank * o.nproc_per_node + local;
      if (o.tag_output) spec.tag = fmt::format("[rank {}] ", rank);
      try {
        supervisor->spawn(spec);
      } catch (const IoError& e) {
        start_error = fmt::format("rank {} could not be started", rank);
        print_error_line(fmt::format("trident launch: rank {}: {}", rank, e.what()));
        supervisor->stop_all(SIGKILL);
        supervisor->run();
        return false;
      }
    }
    result = supervisor->run();
    return true;  // the supervisor's destructor puts the default signal dispositions back
  };
  auto failure_report = [&](const SuperviseResult& result) {
    const ChildResult& c = result.children[static_cast<size_t>(result.first_failure)];
    int stopped = 0;
    for (const auto& r : result.children) stopped += r.sent_stop ? 1 : 0;
    std::string line = "trident launch: " + describe_rank(c, result.first_failure);
    if (stopped > 0) line += fmt::format("; stopped the other {} rank{}", stopped, stopped == 1 ? "" : "s");
    return line;
  };
  auto output_tail = [&](const SuperviseResult& result) {
    const ChildResult& c = result.children[static_cast<size_t>(result.first_failure)];
    std::string text;
    if (c.tail.empty()) {
      text = "; it printed nothing";
    } else {
      text = fmt::format("; its last {} line{} of output:", c.tail.size(), c.tail.size() == 1 ? "" : "s");
    }
    const int rank = o.node_rank * o.nproc_per_node + result.first_failure;
    for (const auto& t : c.tail) text += fmt::format("\n[rank {}] {}", rank, t);
    return text;
  };

  auto ranks_word = [&](int n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); };
  auto stopped_count = [](const SuperviseResult& r) {
    int n = 0;
    for (const auto& c : r.children) n += c.sent_stop ? 1 : 0;
    return n;
  };
  // The round's cause as every node reads it, when it is another node's (the cause of this node's own rank
  // failing, as a rule): appended to this node's report.
  // Before a restart, a local rank that exited with a code (not a signal) is often the consequence of a rank
  // killed on another node whose launcher has not published that yet (ranks notice a dead peer before its
  // launcher reaps it): this node waits up to kCauseWait for it, so its restart line names the cause and not
  // the rank it provoked. (The final report does not wait: a job that ends should end within its bound.)
  auto first_elsewhere = [&](const SuperviseResult& r, bool restarting) -> std::string {
    constexpr double kCauseWait = 1.0;
    const bool local_by_code = restarting && r.first_failure >= 0 &&
                               r.children[static_cast<size_t>(r.first_failure)].term_signal == 0;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(local_by_code ? kCauseWait : 0.0));
    for (;;) {
      try {
        RoundFailure f = rounds.failure(round);
        if (!f.why.empty() && !f.why.starts_with(fmt::format("node {}: ", o.node_rank)))
          return "; the round's cause: " + f.why;
      } catch (const Error&) {
        return {};
      }
      if (std::chrono::steady_clock::now() >= until) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  // A rendezvous of round `joining` that failed (a node missing, the store unreachable, the job stopped
  // elsewhere): this node leaves with status 1 and one line saying why. Node 0 keeps the store up for the
  // nodes that joined that round.
  auto leave = [&](int joining, const std::string& why) {
    const int expected = server ? o.nnodes - static_cast<int>(rounds.absent(joining, "node").size()) : o.nnodes;
    finish_node(rounds, o, server != nullptr, timeout, true, joining, expected);
    rounds.drop_store();
    if (server) server->stop();
    print_error_line(fmt::format("trident launch: node {} stops: {}", o.node_rank, why));
    return 1;
  };

  // Round 0: every node joins before any rank starts (as torchrun's rendezvous).
  try {
    if (std::string abort = rounds.join(0); !abort.empty()) return leave(0, abort);
  } catch (const TimeoutError& e) {
    return leave(0, e.what());
  } catch (const Error& e) {
    TRIDENT_THROW(StoreError,
                  "trident launch (node {}) cannot reach node 0's store at {}:{}: {}; start node 0 with the same "
                  "--master-addr, --master-port and TRIDENT_STORE_TOKEN",
                  o.node_rank, o.master_addr, port, e.what());
  }

  SuperviseResult result;
  RoundFailure ended;  // why the last round failed (empty: it succeeded)
  for (;; ++round) {
    remote = {};
    published = false;
    next_watch = 0;
    if (!run_round(round, result)) {
      rounds.publish_failure(round, start_error);
      rounds.publish_abort(start_error);
      finish_node(rounds, o, server != nullptr, timeout, true, round, o.nnodes);
      return 127;
    }
    if (result.received_signal != 0) {  // a signal to a launcher stops the whole job: no restart
      rounds.publish_abort(fmt::format("its launcher received {}", signal_name(result.received_signal)));
      ended = {"signal", true};
      break;
    }
    std::string restart_line;
    if (result.first_failure >= 0) {
      const std::string what = describe_rank(result.children[static_cast<size_t>(result.first_failure)],
                                             result.first_failure);
      const ChildResult& c = result.children[static_cast<size_t>(result.first_failure)];
      // A later death by a signal may replace the first failure the tick published (Supervisor's rule).
      if (!published || c.term_signal != 0) rounds.publish_failure(round, what, c.term_signal != 0);
      ended = {what, false};
      restart_line = failure_report(result) + first_elsewhere(result, round < o.max_restarts);
    } else if (!remote.why.empty()) {
      // Read again now that this node's ranks are stopped: a death by a signal elsewhere, published since,
      // is the round's cause rather than the failure it provoked.
      try {
        if (RoundFailure again = rounds.failure(round); !again.why.empty()) remote = again;
      } catch (const Error&) {
      }
      ended = remote;
      restart_line = fmt::format("trident launch: node {} stopped {} because {}", o.node_rank,
                                 ranks_word(stopped_count(result)), remote.why);
    } else {
      // Every local rank exited 0. Another node may still fail this round, and then every node restarts;
      // without a restart left, nothing waits on that.
      ended = {};
      if (round < o.max_restarts) {
        std::vector<int> unfinished;
        ended = rounds.await_success(round, join_timeout, &unfinished);
        if (!unfinished.empty()) {
          std::string names;
          for (int k : unfinished) names += (names.empty() ? "" : ", ") + rounds.node_name(k);
          print_error_line(fmt::format("trident launch: node {}'s ranks finished; {} did not finish within {:.0f} s",
                                       o.node_rank, names, join_timeout));
        }
        if (!ended.why.empty()) {
          restart_line = fmt::format("trident launch: node {}'s {} finished, but {}", o.node_rank,
                                     ranks_word(o.nproc_per_node), ended.why);
        }
      }
    }
    if (ended.why.empty() || ended.final || round >= o.max_restarts) break;
    print_error_line(restart_line +
                     fmt::format("; restarting all {} (restart {} of {}){}", ranks_word(o.nproc_per_node), round + 1,
                                 o.max_restarts, result.first_failure >= 0 ? output_tail(result) : std::string()));
    // Every node joins the next round once its ranks have ended; none starts before all have.
    try {
      if (std::string abort = rounds.join(round + 1); !abort.empty()) return leave(round + 1, abort);
    } catch (const Error& e) {
      return leave(round + 1, e.what());
    }
  }
  const int restart = round;
  const std::string elsewhere = result.first_failure >= 0 ? first_elsewhere(result, false) : std::string();
  finish_node(rounds, o, server != nullptr, timeout, !result.ok() || !ended.why.empty(), round, o.nnodes);
  rounds.drop_store();
  if (server) server->stop();

  const int stopped = stopped_count(result);
  const std::string restarts_note =
      o.max_restarts > 0 ? fmt::format("; no restart left (--max-restarts {}: restarted {} time{})", o.max_restarts,
                                       restart, restart == 1 ? "" : "s")
                         : std::string();
  if (result.first_failure >= 0) {
    const ChildResult& c = result.children[static_cast<size_t>(result.first_failure)];
    print_error_line(failure_report(result) + restarts_note + elsewhere + dumps_note() + output_tail(result));
    if (c.exited) return c.exit_code != 0 ? c.exit_code : 1;
    if (c.term_signal != 0) return 128 + c.term_signal;
    return 1;
  }
  if (result.received_signal != 0) {
    print_error_line(fmt::format("trident launch: received {}; stopped {} rank{} of '{}'",
                                 signal_name(result.received_signal), stopped, stopped == 1 ? "" : "s",
                                 join_command(o.command)));
    return 128 + result.received_signal;
  }
  if (!ended.why.empty()) {
    print_error_line(fmt::format("trident launch: node {} stopped {} because {}{}", o.node_rank, ranks_word(stopped),
                                 ended.why, ended.final ? std::string() : restarts_note));
    return 1;
  }
  if (result.ok() && restart > 0) {
    print_error_line(fmt::format("trident launch: every rank finished after {} restart{} (--max-restarts {})",
                                 restart, restart == 1 ? "" : "s", o.max_restarts));
  }
  return result.ok() ? 0 : 1;
}

}  // namespace trident::launch
