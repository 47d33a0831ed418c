// TCPStoreServer: accepts clients, authenticates them with the shared token, and serves the commands of
// tcp_store_wire.h from a HashStore, on one thread. The wire format is in tcp_store_wire.h.
#include "trident/comm/store/tcp_store.h"


#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/tcp_store_wire.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {
using namespace store_wire;

// ---------------------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------------------

struct TCPStoreServer::State {
  struct Conn {
    int fd = -1;
    std::string in;
    size_t in_pos = 0;
    std::string out;
    size_t out_pos = 0;
    bool authed = false;
    bool closing = false;   // a fatal reply is queued: flush it, then drain
    bool draining = false;  // write side shut: read and discard until EOF or the drain deadline
    bool dead = false;      // to be closed at the end of this loop iteration
    Clock::time_point deadline;  // auth deadline, then drain deadline
    uint64_t waiter = 0;         // parked get/wait (0 = none)
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    bool is_get;
    double timeout_s;
    Clock::time_point deadline;
    std::string index_key;  // the missing key it is filed under in key_index
  };

  std::string token;
  std::unordered_map<std::string, Bytes> data;
  std::map<int, Conn> conns;
  std::map<uint64_t, Waiter> waiters;
  std::unordered_map<std::string, std::vector<uint64_t>> key_index;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  uint64_t next_waiter = 1;
  std::atomic<int>* num_clients = nullptr;

  // ---- replies
  void reply(Conn& c, const std::string& payload) {
    c.out += frame(payload);
    flush(c);
  }
  void reply_ok(Conn& c, const std::string& fields = {}) {
    std::string p(1, static_cast<char>(kOk));
    p += fields;
    reply(c, p);
  }
  void reply_msg(Conn& c, Status st, const std::string& msg) {
    std::string p(1, static_cast<char>(st));
    p += msg;
    reply(c, p);
  }
  void fatal(Conn& c, const std::string& msg) {
    log_debug("store", "store server: closing connection fd {}: {}", c.fd, msg);
    reply_msg(c, kFatal, msg);
    c.closing = true;
    c.in.clear();
    c.in_pos = 0;
    if (c.waiter) remove_waiter(c.waiter);
    maybe_start_drain(c);
  }
  void maybe_start_drain(Conn& c) {
    if (c.closing && !c.draining && !c.dead && c.out_pos == c.out.size()) {
      ::shutdown(c.fd, SHUT_WR);
      c.draining = true;
      c.deadline = Clock::now() + kDrainDeadline;
    }
  }
  void flush(Conn& c) {
    while (!c.dead && c.out_pos < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        kill(c);
        return;
      }
      c.out_pos += static_cast<size_t>(n);
    }
    if (c.out_pos == c.out.size()) {
      c.out.clear();
      c.out_pos = 0;
    }
    maybe_start_drain(c);
  }
  void kill(Conn& c) {
    if (c.dead) return;
    c.dead = true;
    if (c.waiter) remove_waiter(c.waiter);
  }

  // ---- waiters
  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (auto& k : keys)
      if (!data.count(k)) out.push_back(k);
    return out;
  }
  void remove_waiter(uint64_t id) {
    auto it = waiters.find(id);
    if (it == waiters.end()) return;
    auto& ids = key_index[it->second.index_key];
    ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
    if (ids.empty()) key_index.erase(it->second.index_key);
    deadlines.erase({it->second.deadline, id});
    auto cit = conns.find(it->second.fd);
    if (cit != conns.end()) cit->second.waiter = 0;
    waiters.erase(it);
  }
  // Answers a waiter whose keys are all present, then resumes the frames queued behind it on its connection.
  void answer_waiter(uint64_t id) {
    Waiter w = waiters.at(id);
    remove_waiter(id);
    auto cit = conns.find(w.fd);
    if (cit == conns.end() || cit->second.dead) return;
    Conn& c = cit->second;
    if (w.is_get) {
      std::string f;
      put_bytes(f, data[w.keys.front()]);
      reply_ok(c, f);
    } else {
      reply_ok(c);
    }
    process(c);  // frames queued behind the wait
  }
  void park(Conn& c, std::vector<std::string> keys, bool is_get, int64_t timeout_ms) {
    auto miss = missing(keys);
    uint64_t id = next_waiter++;
    Waiter w{c.fd, std::move(keys), is_get, static_cast<double>(timeout_ms) / 1000.0,
             Clock::now() + std::chrono::milliseconds(timeout_ms), miss.front()};
    key_index[w.index_key].push_back(id);
    deadlines.insert({w.deadline, id});
    waiters.emplace(id, std::move(w));
    c.waiter = id;
  }
  void notify(const std::string& key) {
    auto it = key_index.find(key);
    if (it == key_index.end()) return;
    std::vector<uint64_t> ids = std::move(it->second);
    key_index.erase(it);
    for (uint64_t id : ids) {
      auto wit = waiters.find(id);
      if (wit == waiters.end()) continue;
      auto miss = missing(wit->second.keys);
      if (miss.empty()) {
        wit->second.index_key = key;
        key_index[key].push_back(id);  // so remove_waiter finds it
        answer_waiter(id);
      } else {
        wit->second.index_key = miss.front();
        key_index[miss.front()].push_back(id);
      }
    }
  }
  void expire_waiters() {
    auto now = Clock::now();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      uint64_t id = deadlines.begin()->second;
      Waiter w = waiters.at(id);
      remove_waiter(id);
      auto cit = conns.find(w.fd);
      if (cit == conns.end() || cit->second.dead) continue;
      reply_msg(cit->second, kTimeoutStatus,
                fmt::format("wait timed out after {:.1f}s; missing keys: {}", w.timeout_s,
                            fmt::join(missing(w.keys), ", ")));
      process(cit->second);
    }
  }

  // ---- requests
  void handle(Conn& c, std::string_view payload) {
    if (!c.authed && (payload.empty() || static_cast<uint8_t>(payload[0]) != kAuth)) {
      fatal(c, "the first message must authenticate (is this a trident store client of the same version?)");
      return;
    }
    Request q;
    std::string error;
    if (!parse_request(payload, &q, &error)) {
      fatal(c, error);
      return;
    }
    if (!c.authed) {
      if (!token.empty() && !tokens_equal(q.token, token)) {
        fatal(c, "wrong token");
        return;
      }
      c.authed = true;
      num_clients->fetch_add(1);
      reply_ok(c);
      return;
    }
    switch (q.cmd) {
      case kAuth:
        fatal(c, "a second authentication on an authenticated connection (is this a trident store client of the same "
                 "version?)");
        return;
      case kSet:
        data[q.key] = Bytes(q.value.begin(), q.value.end());
        reply_ok(c);
        notify(q.key);
        return;
      case kGet:
      case kWait: {
        const bool get = q.cmd == kGet;
        std::vector<std::string> keys = get ? std::vector<std::string>{q.key} : std::move(q.keys);
        auto miss = missing(keys);
        if (miss.empty()) {
          std::string f;
          if (get) put_bytes(f, data[keys.front()]);
          reply_ok(c, f);
        } else if (q.number == 0) {
          reply_msg(c, kTimeoutStatus,
                    fmt::format("wait timed out after 0.0s; missing keys: {}", fmt::join(miss, ", ")));
        } else {
          park(c, std::move(keys), get, q.number);
        }
        return;
      }
      case kAdd: {
        auto it = data.find(q.key);
        int64_t v = 0;
        try {
          v = it == data.end() ? 0 : store_parse_int(it->second, q.key);
        } catch (const Error& e) {
          reply_msg(c, kErrorStatus, e.what());
          return;
        }
        v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(q.number));  // wraps, never UB
        data[q.key] = store_format_int(v);
        std::string f;
        put_i64(f, v);
        reply_ok(c, f);
        notify(q.key);
        return;
      }
      case kCompareSet: {
        auto it = data.find(q.key);
        bool swap = it == data.end() ? q.expected.empty()
                                     : (it->second.size() == q.expected.size() &&
                                        std::equal(it->second.begin(), it->second.end(), q.expected.begin()));
        std::string f;
        if (swap) {
          data[q.key] = Bytes(q.value.begin(), q.value.end());
          put_str(f, q.value);
        } else if (it == data.end()) {
          put_str(f, std::string());
        } else {
          put_bytes(f, it->second);
        }
        reply_ok(c, f);
        if (swap) notify(q.key);
        return;
      }
      case kCheck:
        reply_ok(c, std::string(1, missing(q.keys).empty() ? 1 : 0));
        return;
      case kDelete: {
        bool existed = data.erase(q.key) > 0;
        reply_ok(c, std::string(1, existed ? 1 : 0));
        return;
      }
      case kNumKeys: {
        std::string f;
        put_i64(f, static_cast<int64_t>(data.size()));
        reply_ok(c, f);
        return;
      }
    }
  }

  // Handles every complete frame buffered on `c` (stopping while a get/wait is parked).
  void process(Conn& c) {
    while (!c.dead && !c.closing && c.waiter == 0) {
      size_t avail = c.in.size() - c.in_pos;
      if (avail < 4) break;
      size_t len = read_u32(c.in.data() + c.in_pos);
      size_t limit = c.authed ? kMaxFrameBytes : kMaxPreAuthFrameBytes;
      if (len > limit) {
        fatal(c, fmt::format("message of {} bytes exceeds the {} limit{}", len, format_bytes(limit),
                             c.authed ? "" : " before authentication"));
        break;
      }
      if (len == 0) {
        fatal(c, "malformed request (empty frame)");
        break;
      }
      if (avail < 4 + len) break;
      std::string_view payload(c.in.data() + c.in_pos + 4, len);
      handle(c, payload);
      if (c.closing || c.dead) break;
      c.in_pos += 4 + len;
    }
    if (c.in_pos > 0 && (c.in_pos == c.in.size() || c.in_pos > (size_t{1} << 20))) {
      c.in.erase(0, c.in_pos);
      c.in_pos = 0;
    }
  }

  void read_from(Conn& c) {
    char buf[65536];
    for (;;) {
      // Back-pressure: while a wait is parked, buffer at most one more frame.
      if (!c.draining && c.waiter && c.in.size() - c.in_pos > kMaxFrameBytes + 4) return;
      ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        kill(c);
        return;
      }
      if (n == 0) {  // peer closed
        kill(c);
        return;
      }
      if (c.draining || c.closing) continue;  // discard
      c.in.append(buf, static_cast<size_t>(n));
      if (c.waiter == 0 && c.in.size() - c.in_pos >= (size_t{1} << 20)) process(c);  // keep buffers bounded
    }
    process(c);
  }
};

TCPStoreServer::TCPStoreServer(const std::string& host, int port, std::string token)
    : host_(host), state_(std::make_unique<State>()) {
  if (port < 0 || port > 65535) TRIDENT_THROW(InvalidArgument, "store server port {} is out of range 0..65535", port);
  state_->token = std::move(token);
  state_->num_clients = &num_clients_;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const char* node = (host.empty() || host == "*") ? nullptr : host.c_str();
  std::string service = std::to_string(port);
  int gai = ::getaddrinfo(node, service.c_str(), &hints, &res);
  if (gai != 0)
    TRIDENT_THROW(StoreError, "store server: cannot resolve '{}': {}; use an address of this host", host,
                  ::gai_strerror(gai));
  std::string last_error = "no usable address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = detail::errno_string(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6 && node == nullptr) {
      int zero = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
      last_error = detail::errno_string(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
    break;
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0)
    TRIDENT_THROW(StoreError,
                  "store server: cannot listen on {}:{}: {}; choose a free port (MASTER_PORT) or stop the process "
                  "holding it",
                  host.empty() ? "*" : host, port, last_error);
  const int fd = listen_fd_;
  listen_fd_ = -1;
  start(fd);
}

TCPStoreServer::TCPStoreServer(int bound_fd, std::string token) : state_(std::make_unique<State>()) {
  state_->token = std::move(token);
  state_->num_clients = &num_clients_;
  start(bound_fd);
}

void TCPStoreServer::start(int fd) {
  if (::listen(fd, SOMAXCONN) < 0) {
    int e = errno;
    ::close(fd);
    TRIDENT_THROW(StoreError, "store server: cannot listen: {}", detail::errno_string(e));
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  listen_fd_ = fd;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (::pipe2(wake_fd_, O_NONBLOCK | O_CLOEXEC) < 0) {
    int e = errno;
    ::close(listen_fd_);
    TRIDENT_THROW(StoreError, "store server: pipe2: {}", detail::errno_string(e));
  }
  thread_ = std::thread([this] { serve(); });
  log_debug("store", "store server listening on {}:{}", host_.empty() ? "*" : host_, port_);
}

TCPStoreServer::~TCPStoreServer() { stop(); }

void TCPStoreServer::stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  char b = 1;
  ssize_t rc;
  do {
    rc = ::write(wake_fd_[1], &b, 1);
  } while (rc < 0 && errno == EINTR);
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : state_->conns) ::close(fd);
  state_->conns.clear();
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
  num_clients_ = 0;
}

void TCPStoreServer::serve() {
  State& s = *state_;
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({wake_fd_[0], POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    auto next = Clock::now() + std::chrono::seconds(1);
    for (auto& [fd, c] : s.conns) {
      short ev = 0;
      bool backpressured = !c.draining && c.waiter && c.in.size() - c.in_pos > kMaxFrameBytes + 4;
      if (!backpressured) ev |= POLLIN;
      if (c.out_pos < c.out.size()) ev |= POLLOUT;
      pfds.push_back({fd, ev, 0});
      if (!c.authed || c.draining) next = std::min(next, c.deadline);
    }
    if (!s.deadlines.empty()) next = std::min(next, s.deadlines.begin()->first);
    int rc = ::poll(pfds.data(), pfds.size(), ms_until(next));
    if (rc < 0) {
      if (errno == EINTR) continue;
      log_error("store server: poll failed: {}", detail::errno_string(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (pfds[0].revents) return;  // stop()
    if (pfds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            log_warn("store server: accept failed: {}", detail::errno_string(errno));
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // e.g. EMFILE: do not spin
          }
          break;
        }
        set_nodelay(fd);
        State::Conn c;
        c.fd = fd;
        c.deadline = Clock::now() + kAuthDeadline;
        s.conns.emplace(fd, std::move(c));
      }
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      auto it = s.conns.find(pfds[i].fd);
      if (it == s.conns.end()) continue;
      State::Conn& c = it->second;
      if (c.dead) continue;
      if (pfds[i].revents & POLLOUT) s.flush(c);
      if (!c.dead && (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) s.read_from(c);
    }
    s.expire_waiters();
    auto now = Clock::now();
    for (auto it = s.conns.begin(); it != s.conns.end();) {
      State::Conn& c = it->second;
      if (!c.dead && (c.draining || !c.authed) && c.deadline <= now) {
        if (!c.authed && !c.closing) log_debug("store", "store server: dropping connection that never authenticated");
        s.kill(c);
      }
      if (c.dead) {
        if (c.authed) num_clients_.fetch_sub(1);
        ::close(c.fd);
        it = s.conns.erase(it);
      } else {
        ++it;
      }
    }
  }
}


}  // namespace trident
