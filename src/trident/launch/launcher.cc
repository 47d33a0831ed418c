#include "trident/launch/launcher.h"

#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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

constexpr const char* kFailedKey = "trident_launch/failed";  // "node N: rank R (pid P) exited with code C"
constexpr const char* kDoneKey = "trident_launch/done";      // nodes whose ranks have all ended
constexpr double kWatchSeconds = 0.25;                        // how often a node looks for others' failures
constexpr double kLinkRequestSeconds = 10.0;                  // deadline of each launcher-to-launcher request

// Marks this node done; node 0 then keeps serving the store until every node is done (their ranks and
// launchers may still need it), at most `timeout` seconds. Never throws.
void finish_node(TCPStore& link, const LaunchOptions& o, bool hosting, double timeout) {
  try {
    int64_t done = link.add(kDoneKey, 1);
    log_debug("launch", "trident launch: node {} done ({} of {} nodes)", o.node_rank, done, o.nnodes);
    if (!hosting) return;
    const auto start = std::chrono::steady_clock::now();
    bool told = false;
    double limit = timeout;
    while (done < o.nnodes) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // After a failure the others only need the time to notice it and stop their ranks.
      if (limit == timeout && link.check({kFailedKey})) limit = std::min(timeout, o.grace_seconds + 10.0);
      if (waited >= limit) {
        print_error_line(fmt::format("trident launch: gave up waiting for {} of {} nodes to finish after {:.0f} s "
                                     "; stopping the store",
                                     o.nnodes - done, o.nnodes, waited));
        return;
      }
      if (!told && waited > 5) {
        print_error_line(fmt::format("trident launch: node 0 keeps the store up until the other {} node{} finish",
                                     o.nnodes - done, o.nnodes - done == 1 ? "" : "s"));
        told = true;
      }
      ::usleep(50 * 1000);
      done = link.add(kDoneKey, 0);
    }
  } catch (const Error& e) {
    log_warn("trident launch: exit barrier: {}", e.what());
  }
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
  TRIDENT_CHECK(o.max_restarts == 0 || o.nnodes == 1, InvalidArgument,
                "--max-restarts {} with --nnodes {}: restarts are supported on a single node only; use --nnodes 1, "
                "or --max-restarts 0 and restart the job from its checkpoint",
                o.max_restarts, o.nnodes);
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

  // With several nodes, the launchers talk through the same store: the first failure anywhere stops every
  // node, and node 0 keeps the store up until every node is done.
  std::unique_ptr<TCPStore> link;
  if (o.nnodes > 1) {
    try {
      link = std::make_unique<TCPStore>(o.master_addr, port, token, Seconds(timeout));
      // Connecting may wait for node 0 (up to TRIDENT_TIMEOUT); later requests are quick checks, and a store
      // that does not answer them within this bound is treated as gone.
      link->set_timeout(Seconds(std::min(timeout, kLinkRequestSeconds)));
    } catch (const Error& e) {
      TRIDENT_THROW(StoreError,
                    "trident launch (node {}) cannot reach node 0's store at {}:{}: {}; start node 0 with the same "
                    "--master-addr, --master-port and TRIDENT_STORE_TOKEN",
                    o.node_rank, o.master_addr, port, e.what());
    }
  }
  auto publish = [&](const std::string& what) {
    try {
      const std::string text = fmt::format("node {}: {}", o.node_rank, what);
      link->compare_set(kFailedKey, {}, Bytes(text.begin(), text.end()));  // the first failure of the job wins
    } catch (const Error& e) {
      log_warn("trident launch: could not tell the other nodes about the failure: {}", e.what());
    }
  };
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

  std::string remote_failure;  // why another node's failure stopped this node
  bool published = false;
  double next_watch = 0;
  SuperviseOptions sopts;
  sopts.grace_seconds = o.grace_seconds;
  sopts.tail_lines = 20;
  sopts.stop_on_failure = true;
  sopts.forward_signals = true;
  if (link) {
    sopts.on_tick = [&](Supervisor& s) {
      if (!published && s.first_failure() >= 0) {
        publish(describe_rank(s.child(static_cast<size_t>(s.first_failure())), s.first_failure()));
        published = true;
      }
      const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      if (s.stopping() || now < next_watch) return;
      next_watch = now + kWatchSeconds;
      try {
        if (link->check({kFailedKey})) remote_failure = link->get_string(kFailedKey);
      } catch (const Error& e) {
        remote_failure = fmt::format("node 0's store at {}:{} is gone ({})", o.master_addr, port, e.what());
      }
      if (!remote_failure.empty()) s.stop_all(SIGTERM);
    };
  }

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

  SuperviseResult result;
  int restart = 0;
  for (;; ++restart) {
    if (!run_round(restart, result)) {
      if (link) {
        publish(start_error);
        finish_node(*link, o, server != nullptr, timeout);
      }
      return 127;
    }
    // A rank that failed on its own is restarted while restarts are left; a signal to the launcher is not a
    // rank failure, and another node's failure cannot happen (restarts are single-node).
    const bool restartable = result.first_failure >= 0 && result.received_signal == 0 && remote_failure.empty();
    if (!restartable || restart >= o.max_restarts) break;
    print_error_line(failure_report(result) +
                     fmt::format("; restarting all {} rank{} (restart {} of {}){}", o.nproc_per_node,
                                 o.nproc_per_node == 1 ? "" : "s", restart + 1, o.max_restarts,
                                 output_tail(result)));
  }
  if (link) {
    if (!published && result.first_failure >= 0) {
      publish(describe_rank(result.children[static_cast<size_t>(result.first_failure)], result.first_failure));
    } else if (!published && result.received_signal != 0) {
      publish(fmt::format("its launcher received {}", signal_name(result.received_signal)));
    }
    finish_node(*link, o, server != nullptr, timeout);
  }
  link.reset();
  if (server) server->stop();

  int stopped = 0;
  for (const auto& c : result.children) stopped += c.sent_stop ? 1 : 0;
  if (result.first_failure >= 0) {
    const ChildResult& c = result.children[static_cast<size_t>(result.first_failure)];
    std::string line = failure_report(result);
    if (o.max_restarts > 0) {
      line += fmt::format("; no restart left (--max-restarts {}: restarted {} time{})", o.max_restarts, restart,
                          restart == 1 ? "" : "s");
    }
    print_error_line(line + dumps_note() + output_tail(result));
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
  if (!remote_failure.empty() && !result.ok()) {
    print_error_line(fmt::format("trident launch: node {} stopped {} rank{} because {}", o.node_rank, stopped,
                                 stopped == 1 ? "" : "s", remote_failure));
    return 1;
  }
  if (result.ok() && restart > 0) {
    print_error_line(fmt::format("trident launch: every rank finished after {} restart{} (--max-restarts {})",
                                 restart, restart == 1 ? "" : "s", o.max_restarts));
  }
  return result.ok() ? 0 : 1;
}

}  // namespace trident::launch
