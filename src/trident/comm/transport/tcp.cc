#include "trident/comm/transport/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "trident/comm/store/store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kGreetingMagic = 0x54524443;  // "TRDC"
// Receive staging for reductions (peek): reduced from while it is still in L2.
constexpr size_t kStaging = 256 * 1024;
// Requested socket buffers when TRIDENT_TCP_SOCKBUF is 0: the kernel clamps to net.core.{w,r}mem_max
// (and doubles for its bookkeeping), so this asks for "as large as allowed".
constexpr int kSockBufMax = 64 << 20;
// After a send or recv found the socket full or empty, calls in that direction return 0 without a system
// call for kDryNs: the engine spins over its channels between polls, and a syscall per spin round (about
// 1 us each, taking the socket lock the peer's delivery needs) stretched a spin of a few thousand rounds
// to milliseconds of CPU. Time-based, so a poll() that slept longer always finds the next call real.
constexpr int64_t kDryNs = 2000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Greeting {
  uint32_t magic;
  int32_t rank;
  uint64_t group_id;
};

int remaining_ms(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int64_t want = env::tcp_sockbuf();
  int buf = want > 0 ? static_cast<int>(std::min<int64_t>(want, kSockBufMax)) : kSockBufMax;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

// Blocking-with-deadline full read/write used during setup only.
bool io_full(int fd, void* data, size_t n, bool write, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int r = poll(&pfd, 1, remaining_ms(deadline));
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// One connection. Sends go straight from the caller's buffer (one send() takes as much as the socket
// buffer holds; the engine hands over whole payloads). Receives go straight into the destination
// (read_some) or, for reductions, into a small staging buffer that the engine reduces from (peek).
class TcpChannel : public Channel {
 public:
  TcpChannel(int fd, int peer, std::string addr)
      : fd_(fd), peer_(peer), addr_(std::move(addr)), staging_(kStaging) {
    int flags = fcntl(fd_, F_GETFL, 0);
    fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    const int64_t cap = env::tcp_max_io();
    max_io_ = cap > 0 ? static_cast<size_t>(cap) : SIZE_MAX;
  }
  ~TcpChannel() override {
    if (fd_ >= 0) ::close(fd_);
  }

  size_t write_some(const void* data, size_t n) override {
    if (n == 0) return 0;
    if (tx_dry_until_ != 0 && now_ns() < tx_dry_until_) return 0;
    for (;;) {
      ssize_t k = ::send(fd_, data, std::min(n, max_io_), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) return static_cast<size_t>(k);
      if (k == 0) return 0;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        tx_dry_until_ = now_ns() + kDryNs;
        return 0;
      }
      fail("send", errno);
    }
  }

  size_t read_some(void* data, size_t n) override {
    if (n == 0) return 0;
    if (begin_ < end_) {
      size_t m = std::min(n, end_ - begin_);
      std::memcpy(data, staging_.data() + begin_, m);
      begin_ += m;
      return m;
    }
    if (eof_) closed();
    if (rx_dry()) return 0;
    for (;;) {
      ssize_t k = ::recv(fd_, data, std::min(n, max_io_), MSG_DONTWAIT);
      if (k > 0) return static_cast<size_t>(k);
      if (k == 0) closed();
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        rx_dry_until_ = now_ns() + kDryNs;
        return 0;
      }
      fail("recv", errno);
    }
  }

  std::span<const uint8_t> peek() override {
    if (end_ - begin_ < 4096 && !eof_ && !rx_dry()) {
      if (begin_ > 0) {
        std::memmove(staging_.data(), staging_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      for (;;) {
        ssize_t k = ::recv(fd_, staging_.data() + end_, std::min(staging_.size() - end_, max_io_), MSG_DONTWAIT);
        if (k > 0) {
          end_ += static_cast<size_t>(k);
          break;
        }
        if (k == 0) {
          eof_ = true;
          break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          rx_dry_until_ = now_ns() + kDryNs;
          break;
        }
        fail("recv", errno);
      }
      if (eof_ && begin_ == end_) closed();
    }
    return {staging_.data() + begin_, end_ - begin_};
  }

  void consume(size_t n) override { begin_ += n; }
  int fd() const override { return fd_; }
  void shutdown() override { ::shutdown(fd_, SHUT_RDWR); }
  std::string describe() const override { return "tcp " + addr_; }

 private:
  bool rx_dry() const { return rx_dry_until_ != 0 && now_ns() < rx_dry_until_; }
  [[noreturn]] void closed() {
    throw NetworkError(fmt::format("connection to rank {} ({}) closed: that rank exited, died or aborted", peer_, addr_),
                       -1, peer_, "recv");
  }
  [[noreturn]] void fail(const char* what, int err) {
    throw NetworkError(fmt::format("{} to rank {} ({}) failed: {}", what, peer_, addr_, detail::errno_string(err)), -1,
                       peer_, what);
  }
  int fd_;
  int peer_;
  std::string addr_;
  std::vector<uint8_t> staging_;
  size_t begin_ = 0, end_ = 0;
  size_t max_io_ = SIZE_MAX;
  int64_t rx_dry_until_ = 0, tx_dry_until_ = 0;  // now_ns() before which that direction is not retried
  bool eof_ = false;
};

bool parse_host_port(const std::string& s, std::string* host, int* port) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  *host = s.substr(0, colon);
  *port = std::atoi(s.c_str() + colon + 1);
  return *port > 0;
}

int connect_to(const std::string& host, int port, Clock::time_point deadline, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *err = fmt::format("cannot resolve {}: {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  while (Clock::now() < deadline) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    tune_socket(fd);
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    *err = detail::errno_string(errno);
    ::close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace

std::string local_socket_address() {
  if (auto a = env::socket_addr(); !a.empty()) return a;
  auto master = env::get("MASTER_ADDR");
  if (!master || *master == "localhost" || master->rfind("127.", 0) == 0) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string out = "127.0.0.1";
  if (getaddrinfo(master->c_str(), "29500", &hints, &res) == 0) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in sa{};
      socklen_t len = sizeof sa;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
        char buf[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
        out = buf;
      }
    }
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
  }
  return out;
}

std::vector<std::unique_ptr<Channel>> connect_tcp_mesh(Store& store, int rank, int size, const std::vector<bool>& need,
                                                       uint64_t group_id, double timeout_s) {
  std::vector<std::unique_ptr<Channel>> out(size);
  bool any = false;
  for (int i = 0; i < size; ++i) any = any || (i != rank && need[i]);
  // Every rank publishes (so peers can tell "no TCP needed" from "not there yet").
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(timeout_s));
  int lfd = -1;
  std::string my_addr = local_socket_address();
  int my_port = 0;
  if (any) {
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TRIDENT_SYSCHECK(lfd, "socket() for the TCP transport");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = 0;
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0 || ::listen(lfd, 128) < 0) {
      int e = errno;
      ::close(lfd);
      TRIDENT_THROW(NetworkError, "cannot listen for TCP peers: {}", detail::errno_string(e));
    }
    socklen_t len = sizeof sa;
    getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len);
    my_port = ntohs(sa.sin_port);
  }
  store.set_string(fmt::format("tcp/{}", rank), fmt::format("{}:{}", my_addr, my_port));

  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{lfd};

  // Connect to lower ranks.
  for (int j = 0; j < rank; ++j) {
    if (!need[j]) continue;
    std::string addr = store.get_string(fmt::format("tcp/{}", j), Seconds(std::max(0.0, timeout_s)));
    std::string host;
    int port = 0;
    if (!parse_host_port(addr, &host, &port))
      TRIDENT_THROW(NetworkError, "rank {} published no TCP address ('{}'): its transport settings differ from rank {}'s",
                    j, addr, rank);
    std::string err;
    int fd = connect_to(host, port, deadline, &err);
    if (fd < 0)
      TRIDENT_THROW(NetworkError, "rank {} cannot connect to rank {} at {}: {}", rank, j, addr, err);
    Greeting g{kGreetingMagic, rank, group_id};
    if (!io_full(fd, &g, sizeof g, true, deadline)) {
      ::close(fd);
      TRIDENT_THROW(NetworkError, "rank {} cannot greet rank {} at {}", rank, j, addr);
    }
    out[j] = std::make_unique<TcpChannel>(fd, j, addr);
  }
  // Accept from higher ranks.
  int expected = 0;
  for (int j = rank + 1; j < size; ++j) expected += need[j] ? 1 : 0;
  while (expected > 0) {
    pollfd pfd{lfd, POLLIN, 0};
    int r = poll(&pfd, 1, remaining_ms(deadline));
    if (r == 0) {
      std::string missing;
      for (int j = rank + 1; j < size; ++j)
        if (need[j] && !out[j]) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      TRIDENT_THROW(TimeoutError, "rank {}: TCP connections from ranks {} did not arrive within {:.1f}s", rank, missing,
                    timeout_s);
    }
    if (r < 0) continue;
    sockaddr_in peer{};
    socklen_t plen = sizeof peer;
    int fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tune_socket(fd);
    Greeting g{};
    auto greet_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!io_full(fd, &g, sizeof g, false, greet_deadline) || g.magic != kGreetingMagic || g.group_id != group_id ||
        g.rank <= rank || g.rank >= size || !need[g.rank] || out[g.rank]) {
      log_warn("rank {}: dropped an unexpected TCP connection (bad greeting) while setting up the group", rank);
      ::close(fd);
      continue;
    }
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &peer.sin_addr, buf, sizeof buf);
    out[g.rank] = std::make_unique<TcpChannel>(fd, g.rank, fmt::format("{}:{}", buf, ntohs(peer.sin_port)));
    --expected;
  }
  return out;
}

}  // namespace trident
