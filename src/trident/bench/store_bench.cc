#include "trident/bench/store_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fcntl.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trident/comm/store/tcp_store.h"
#include "trident/comm/store/tcp_store_wire.h"
#include "trident/core/error.h"

namespace trident::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kHost = "127.0.0.1";

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string value_of(int client) { return fmt::format("client {} was here", client); }

// What one client process sends back through its pipe: per client, its two times; or one error line.
struct ClientRecord {
  int32_t client;
  int32_t ok;
  double connect_s, rendezvous_s;
  char error[200];
};

// One client: the rendezvous described in the header. Throws on any failure or wrong value.
void one_client(int port, const std::string& token, int id, int n, Seconds timeout, ClientRecord* rec) {
  const Clock::time_point t0 = Clock::now();
  TCPStore s(kHost, port, token, timeout);
  rec->connect_s = since(t0);
  const Clock::time_point t1 = Clock::now();
  s.set(fmt::format("client/{}", id), bytes_of(value_of(id)));
  if (s.add("arrived", 1) == n) s.set("go", bytes_of("1"));
  s.wait({"go"});
  const int next = (id + 1) % n;
  const Bytes got = s.get(fmt::format("client/{}", next));
  TRIDENT_CHECK(got == bytes_of(value_of(next)), Error, "client {} read client {}'s key as '{}', not '{}'", id, next,
                std::string(got.begin(), got.end()), value_of(next));
  if (s.add("departed", 1) == n) s.set("all_departed", bytes_of("1"));
  s.wait({"all_departed"});
  rec->rendezvous_s = since(t1);
}

int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, kHost, &a.sin_addr);
  for (int i = 0; i < 2000; ++i) {  // the server may not listen yet: retry for up to 20 s
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  }
  ::close(fd);
  return -1;
}

bool send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    ssize_t w = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (w <= 0) return false;
    at += static_cast<size_t>(w);
  }
  return true;
}

// An authenticated raw connection with half of a request frame sent after it.
int half_request(int port, const std::string& token, const std::string& payload) {
  using namespace store_wire;
  int fd = raw_connect(port);
  if (fd < 0) return -1;
  std::string auth(1, static_cast<char>(kAuth));
  put_str(auth, token);
  const std::string f = frame(payload);
  if (!send_all(fd, frame(auth)) || !send_all(fd, f.substr(0, f.size() / 2))) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string wait_payload(const std::string& key) {
  using namespace store_wire;
  std::string p(1, static_cast<char>(kWait));
  put_u32(p, 1);
  put_str(p, key);
  put_i64(p, 60000);
  return p;
}

// A client process: `count` clients from `first`, one thread each; writes one record per client to `fd`.
[[noreturn]] void client_process(int port, const std::string& token, int first, int count, int n, Seconds timeout,
                                 int fd) {
  std::vector<ClientRecord> recs(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      ClientRecord& r = recs[static_cast<size_t>(i)];
      std::memset(&r, 0, sizeof r);
      r.client = first + i;
      try {
        one_client(port, token, first + i, n, timeout, &r);
        r.ok = 1;
      } catch (const std::exception& e) {
        std::snprintf(r.error, sizeof r.error, "%s", e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  const char* p = reinterpret_cast<const char*>(recs.data());
  size_t left = recs.size() * sizeof(ClientRecord);
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w <= 0) break;
    p += w;
    left -= static_cast<size_t>(w);
  }
  ::_exit(0);
}

double quantile_of(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

StoreBenchResult run_store_bench(const StoreBenchOptions& o) {
  TRIDENT_CHECK(o.clients >= 1, InvalidArgument, "bench store: --clients {} must be at least 1", o.clients);
  TRIDENT_CHECK(o.procs >= 1 && o.procs <= o.clients, InvalidArgument,
                "bench store: --procs {} must be between 1 and --clients ({})", o.procs, o.clients);
  TRIDENT_CHECK(o.stalled >= 0 && o.vanishing >= 0, InvalidArgument, "bench store: --stalled and --vanishing must be >= 0");
  StoreBenchResult r;
  r.clients = o.clients;
  r.procs = o.procs;
  std::random_device rd;
  const std::string token = fmt::format("{:016x}{:016x}", (uint64_t{rd()} << 32) | rd(), (uint64_t{rd()} << 32) | rd());

  // The server's socket is bound first and listens only once the server starts, after the fork: the clients
  // know its port, and until then their connections are refused and retried.
  int bound = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TRIDENT_CHECK(bound >= 0, StoreError, "bench store: socket: {}", detail::errno_string(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, kHost, &a.sin_addr);
  if (::bind(bound, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    ::close(bound);
    TRIDENT_THROW(StoreError, "bench store: bind 127.0.0.1:0: {}", detail::errno_string(e));
  }
  socklen_t len = sizeof a;
  ::getsockname(bound, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);

  struct Child {
    pid_t pid;
    int fd;
    int count;
  };
  std::vector<Child> children;
  const Clock::time_point t0 = Clock::now();
  for (int p = 0; p < o.procs; ++p) {
    const int first = static_cast<int>(static_cast<int64_t>(o.clients) * p / o.procs);
    const int last = static_cast<int>(static_cast<int64_t>(o.clients) * (p + 1) / o.procs);
    int fds[2];
    TRIDENT_CHECK(::pipe2(fds, O_CLOEXEC) == 0, Error, "bench store: pipe: {}", detail::errno_string(errno));
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      ::close(bound);
      client_process(port, token, first, last - first, o.clients, o.timeout, fds[1]);
    }
    ::close(fds[1]);
    TRIDENT_CHECK(pid > 0, Error, "bench store: fork: {}", detail::errno_string(errno));
    children.push_back({pid, fds[0], last - first});
  }
  // A server that cannot start must not leave the clients retrying until their deadline: stop and reap them.
  std::unique_ptr<TCPStoreServer> started;
  try {
    started = std::make_unique<TCPStoreServer>(bound, token);
  } catch (...) {
    for (Child& c : children) {
      ::kill(c.pid, SIGKILL);
      ::close(c.fd);
      ::waitpid(c.pid, nullptr, 0);
    }
    throw;
  }
  TCPStoreServer& server = *started;
  // The misbehaving connections, opened among the clients' own.
  std::vector<int> stalled;
  for (int i = 0; i < o.stalled; ++i) {
    std::string set(1, static_cast<char>(store_wire::kSet));
    store_wire::put_str(set, fmt::format("stalled/{}", i));
    store_wire::put_str(set, std::string(64, 'x'));
    int fd = half_request(port, token, set);
    if (fd >= 0) stalled.push_back(fd);
  }
  for (int i = 0; i < o.vanishing; ++i) {
    int fd = half_request(port, token, wait_payload("never"));
    if (fd >= 0) ::close(fd);
  }

  // Read every child's records (poll: each child writes once, at its end), within the deadline.
  std::vector<double> connect, rendezvous;
  std::vector<std::vector<char>> bufs(children.size());
  size_t open = children.size();
  const Clock::time_point deadline = t0 + std::chrono::duration_cast<Clock::duration>(o.timeout + Seconds(30.0));
  while (open > 0 && Clock::now() < deadline) {
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i)
      if (children[i].fd >= 0) pfds.push_back({children[i].fd, POLLIN, 0}), which.push_back(i);
    ::poll(pfds.data(), pfds.size(), 200);
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (!(pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = children[which[k]];
      char buf[65536];
      ssize_t got = ::read(c.fd, buf, sizeof buf);
      if (got > 0) {
        bufs[which[k]].insert(bufs[which[k]].end(), buf, buf + got);
        continue;
      }
      ::close(c.fd);
      c.fd = -1;
      --open;
    }
  }
  r.total_s = since(t0);
  for (Child& c : children) {
    if (c.fd >= 0) {
      ::kill(c.pid, SIGKILL);
      ::close(c.fd);
    }
    int status = 0;
    ::waitpid(c.pid, &status, 0);
  }
  for (int fd : stalled) ::close(fd);

  int done = 0;
  for (size_t i = 0; i < children.size(); ++i) {
    const size_t n = bufs[i].size() / sizeof(ClientRecord);
    for (size_t k = 0; k < n; ++k) {
      ClientRecord rec;
      std::memcpy(&rec, bufs[i].data() + k * sizeof rec, sizeof rec);
      if (!rec.ok) {
        if (r.error.empty()) r.error = fmt::format("client {}: {}", rec.client, rec.error);
        continue;
      }
      ++done;
      connect.push_back(rec.connect_s);
      rendezvous.push_back(rec.rendezvous_s);
    }
    if (n != static_cast<size_t>(children[i].count) && r.error.empty())
      r.error = fmt::format("client process {} reported {} of its {} clients (killed at the deadline of {:.0f} s, or "
                            "it crashed)", i, n, children[i].count, o.timeout.count());
  }
  {
    TCPStore check(kHost, port, token, Seconds(10.0));
    r.arrived = check.add("arrived", 0);
    r.departed = check.add("departed", 0);
    r.keys = check.num_keys();
  }
  server.stop();
  r.connect_p50_s = quantile_of(connect, 0.5);
  r.connect_max_s = quantile_of(connect, 1.0);
  r.rendezvous_p50_s = quantile_of(rendezvous, 0.5);
  r.rendezvous_max_s = quantile_of(rendezvous, 1.0);
  // Keys: one per client, arrived, departed, go, all_departed.
  const int64_t want_keys = int64_t{o.clients} + 4;
  if (r.error.empty() && (r.arrived != o.clients || r.departed != o.clients || r.keys != want_keys))
    r.error = fmt::format("the store lost requests: arrived {} and departed {} (want {} each), {} keys (want {})",
                          r.arrived, r.departed, o.clients, r.keys, want_keys);
  r.ok = r.error.empty() && done == o.clients;
  return r;
}

void print_store_bench(std::ostream& out, const StoreBenchResult& r, bool json) {
  if (json) {
    out << nlohmann::json{{"ok", r.ok},
                          {"error", r.error},
                          {"clients", r.clients},
                          {"procs", r.procs},
                          {"total_s", r.total_s},
                          {"connect_p50_s", r.connect_p50_s},
                          {"connect_max_s", r.connect_max_s},
                          {"rendezvous_p50_s", r.rendezvous_p50_s},
                          {"rendezvous_max_s", r.rendezvous_max_s},
                          {"arrived", r.arrived},
                          {"departed", r.departed},
                          {"keys", r.keys}}
               .dump()
        << "\n";
    return;
  }
  out << fmt::format("# store rendezvous: {} clients in {} processes (set, add, wait on a shared key, get, barrier)\n",
                     r.clients, r.procs);
  out << fmt::format("total {:.3f} s  ({:.0f} clients/s)\n", r.total_s, r.clients / std::max(r.total_s, 1e-9));
  out << fmt::format("connect     p50 {:.4f} s  max {:.4f} s\n", r.connect_p50_s, r.connect_max_s);
  out << fmt::format("rendezvous  p50 {:.4f} s  max {:.4f} s\n", r.rendezvous_p50_s, r.rendezvous_max_s);
  out << fmt::format("counters arrived {} departed {}, keys {}: {}\n", r.arrived, r.departed, r.keys,
                     r.ok ? "nothing lost" : "FAILED: " + r.error);
}

}  // namespace trident::bench
