// TCPStore wire protocol.
//
// Every message is a frame: u32 length (little endian) followed by that many payload bytes.
// Request payload: u8 command, then its fields. Fields: str = u32 length + bytes; i64 = 8 bytes LE;
// keys = u32 count + that many str.
//   kAuth        str token                       -> OK
//   kSet         str key, str value              -> OK
//   kGet         str key, i64 timeout_ms         -> OK str value | TIMEOUT
//   kAdd         str key, i64 delta              -> OK i64 new value | ERROR (value not an integer)
//   kCompareSet  str key, str expected, str desired -> OK str value now stored
//   kWait        keys, i64 timeout_ms            -> OK | TIMEOUT
//   kCheck       keys                            -> OK u8 all present
//   kDelete      str key                         -> OK u8 existed
//   kNumKeys                                     -> OK i64
// Reply payload: u8 status (0 OK, 1 ERROR, 2 TIMEOUT, 3 FATAL), then the fields above (OK) or a message.
// FATAL means the server closes the connection after sending it (wrong token, malformed or oversized frame,
// unknown command); ERROR leaves the connection usable.
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
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {
namespace {

using Clock = std::chrono::steady_clock;

enum Command : uint8_t {
  kAuth = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kDelete = 8,
  kNumKeys = 9,
};
enum Status : uint8_t { kOk = 0, kErrorStatus = 1, kTimeoutStatus = 2, kFatal = 3 };

constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;  // ~35 years: "forever" without overflow
constexpr auto kAuthDeadline = std::chrono::seconds(30);  // an unauthenticated connection must speak by then
constexpr auto kDrainDeadline = std::chrono::seconds(1);  // after a fatal reply, read leftovers this long

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_i64(std::string& out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
}
void put_str(std::string& out, const void* data, size_t n) {
  put_u32(out, static_cast<uint32_t>(n));
  out.append(static_cast<const char*>(data), n);
}
void put_str(std::string& out, const std::string& s) { put_str(out, s.data(), s.size()); }
void put_bytes(std::string& out, const Bytes& b) { put_str(out, b.data(), b.size()); }
uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked field reader; any overrun sets ok = false.
struct Reader {
  std::string_view s;
  size_t pos = 0;
  bool ok = true;
  bool need(size_t n) {
    if (!ok || s.size() - pos < n) ok = false;
    return ok;
  }
  uint8_t u8() { return need(1) ? static_cast<uint8_t>(s[pos++]) : 0; }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = read_u32(s.data() + pos);
    pos += 4;
    return v;
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i])) << (8 * i);
    pos += 8;
    return static_cast<int64_t>(u);
  }
  std::string str() {
    uint32_t n = u32();
    if (!need(n)) return {};
    std::string out(s.substr(pos, n));
    pos += n;
    return out;
  }
  bool done() const { return ok && pos == s.size(); }
};

std::string frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

// Constant-time comparison: the time taken does not depend on where the strings differ.
bool tokens_equal(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string format_bytes(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n >= 1024 && n % 1024 == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

int64_t to_ms(Seconds t) {
  double ms = t.count() * 1000.0;
  if (!(ms > 0)) return 0;
  if (ms > static_cast<double>(kMaxTimeoutMs)) return kMaxTimeoutMs;
  return static_cast<int64_t>(ms);
}

int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (ms < 0) return 0;
  return static_cast<int>(std::min<long long>(ms + 1, 1000 * 1000));
}

Clock::time_point deadline_after(Seconds t) {
  double s = std::min(t.count(), 1e9);
  if (!(s > 0)) s = 0;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(s));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

}  // namespace

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
  bool read_keys(Reader& r, std::vector<std::string>& keys, Conn& c) {
    uint32_t n = r.u32();
    if (!r.ok) return false;
    if (n > kMaxFrameBytes / 4) {
      r.ok = false;
      return false;
    }
    for (uint32_t i = 0; i < n && r.ok; ++i) {
      keys.push_back(r.str());
      if (keys.back().size() > kMaxKeyBytes) {
        fatal(c, fmt::format("key of {} bytes exceeds the {} key limit", keys.back().size(),
                             format_bytes(kMaxKeyBytes)));
        return false;
      }
    }
    return r.ok;
  }
  bool check_key(Conn& c, const std::string& key) {
    if (key.size() <= kMaxKeyBytes) return true;
    fatal(c, fmt::format("key of {} bytes exceeds the {} key limit", key.size(), format_bytes(kMaxKeyBytes)));
    return false;
  }

  void handle(Conn& c, std::string_view payload) {
    Reader r{payload};
    uint8_t cmd = r.u8();
    auto malformed = [&] {
      if (!c.closing) fatal(c, fmt::format("malformed request (command {}, {} bytes)", cmd, payload.size()));
    };
    if (!c.authed) {
      if (cmd != kAuth) {
        fatal(c, "the first message must authenticate (is this a trident store client of the same version?)");
        return;
      }
      std::string tok = r.str();
      if (!r.done()) return malformed();
      if (!token.empty() && !tokens_equal(tok, token)) {
        fatal(c, "wrong token");
        return;
      }
      c.authed = true;
      num_clients->fetch_add(1);
      reply_ok(c);
      return;
    }
    switch (cmd) {
      case kSet: {
        std::string key = r.str();
        std::string value = r.str();
        if (!r.done()) return malformed();
        if (!check_key(c, key)) return;
        data[key] = Bytes(value.begin(), value.end());
        reply_ok(c);
        notify(key);
        return;
      }
      case kGet:
      case kWait: {
        std::vector<std::string> keys;
        if (cmd == kGet) {
          keys.push_back(r.str());
          if (r.ok && !check_key(c, keys.back())) return;
        } else if (!read_keys(r, keys, c)) {
          if (!c.closing) malformed();
          return;
        }
        int64_t timeout_ms = std::clamp<int64_t>(r.i64(), 0, kMaxTimeoutMs);
        if (!r.done()) return malformed();
        auto miss = missing(keys);
        if (miss.empty()) {
          std::string f;
          if (cmd == kGet) put_bytes(f, data[keys.front()]);
          reply_ok(c, f);
        } else if (timeout_ms == 0) {
          reply_msg(c, kTimeoutStatus,
                    fmt::format("wait timed out after 0.0s; missing keys: {}", fmt::join(miss, ", ")));
        } else {
          park(c, std::move(keys), cmd == kGet, timeout_ms);
        }
        return;
      }
      case kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        if (!r.done()) return malformed();
        if (!check_key(c, key)) return;
        auto it = data.find(key);
        int64_t v = 0;
        try {
          v = it == data.end() ? 0 : store_parse_int(it->second, key);
        } catch (const Error& e) {
          reply_msg(c, kErrorStatus, e.what());
          return;
        }
        v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(delta));  // wraps, never UB
        data[key] = store_format_int(v);
        std::string f;
        put_i64(f, v);
        reply_ok(c, f);
        notify(key);
        return;
      }
      case kCompareSet: {
        std::string key = r.str();
        std::string expected = r.str();
        std::string desired = r.str();
        if (!r.done()) return malformed();
        if (!check_key(c, key)) return;
        auto it = data.find(key);
        bool swap = it == data.end() ? expected.empty()
                                     : (it->second.size() == expected.size() &&
                                        std::equal(it->second.begin(), it->second.end(), expected.begin()));
        std::string f;
        if (swap) {
          data[key] = Bytes(desired.begin(), desired.end());
          put_str(f, desired);
        } else if (it == data.end()) {
          put_str(f, std::string());
        } else {
          put_bytes(f, it->second);
        }
        reply_ok(c, f);
        if (swap) notify(key);
        return;
      }
      case kCheck: {
        std::vector<std::string> keys;
        if (!read_keys(r, keys, c) || !r.done()) return malformed();
        reply_ok(c, std::string(1, missing(keys).empty() ? 1 : 0));
        return;
      }
      case kDelete: {
        std::string key = r.str();
        if (!r.done()) return malformed();
        bool existed = data.erase(key) > 0;
        reply_ok(c, std::string(1, existed ? 1 : 0));
        return;
      }
      case kNumKeys: {
        if (!r.done()) return malformed();
        std::string f;
        put_i64(f, static_cast<int64_t>(data.size()));
        reply_ok(c, f);
        return;
      }
      default:
        fatal(c, fmt::format("unknown command {} (is the client a trident store client of the same version?)", cmd));
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
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || ::listen(fd, SOMAXCONN) < 0) {
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
  log_debug("store", "store server listening on {}:{}", host.empty() ? "*" : host, port_);
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

// ---------------------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------------------

namespace {

// Result of one connection attempt: fd >= 0, or the reason it failed.
struct ConnectResult {
  int fd = -1;
  std::string error;
};

ConnectResult connect_once(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (gai != 0) return {-1, fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(gai))};
  ConnectResult out{-1, "no address"};
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      out.error = detail::errno_string(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int prc;
      do {
        prc = ::poll(&p, 1, ms_until(deadline));
      } while (prc < 0 && errno == EINTR);
      if (prc == 0) {
        out.error = "connection attempt timed out";
        ::close(fd);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err ? -1 : 0;
      errno = err;
    }
    if (rc < 0) {
      out.error = detail::errno_string(errno);
      ::close(fd);
      continue;
    }
    // Back to blocking mode: the client waits with poll() and its own deadlines.
    int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    set_nodelay(fd);
    out = {fd, {}};
    break;
  }
  ::freeaddrinfo(res);
  return out;
}

// Transfers all bytes before `deadline`. Returns "" or the reason it failed ("timeout" on expiry).
std::string send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    int prc = ::poll(&p, 1, ms_until(deadline));
    if (prc < 0) {
      if (errno == EINTR) continue;
      return detail::errno_string(errno);
    }
    if (prc == 0) return "timeout";
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return detail::errno_string(errno);
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

std::string recv_all(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t done = 0;
  while (done < len) {
    pollfd p{fd, POLLIN, 0};
    int prc = ::poll(&p, 1, ms_until(deadline));
    if (prc < 0) {
      if (errno == EINTR) continue;
      return detail::errno_string(errno);
    }
    if (prc == 0) return "timeout";
    ssize_t n = ::recv(fd, buf + done, len - done, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return detail::errno_string(errno);
    }
    if (n == 0) return "connection closed by the server";
    done += static_cast<size_t>(n);
  }
  return {};
}

constexpr auto kClientGrace = Seconds(5.0);  // how long past a wait's deadline the client waits for the answer

}  // namespace

TCPStore::TCPStore(const std::string& host, int port, std::string token, Seconds timeout)
    : host_(host), port_(port), token_(std::move(token)), pid_(::getpid()) {
  timeout_ = timeout;
  if (port <= 0 || port > 65535)
    TRIDENT_THROW(InvalidArgument, "store address {}:{}: the port must be in 1..65535 (MASTER_PORT)", host, port);
  idle_.push_back(connect_and_auth(deadline_after(timeout), true));
}

TCPStore::~TCPStore() {
  for (int fd : idle_) ::close(fd);
  idle_.clear();
}

std::string TCPStore::where() const { return fmt::format("{}:{}", host_, port_); }

int TCPStore::connect_and_auth(Clock::time_point deadline, bool retry) {
  auto backoff = std::chrono::milliseconds(10);
  int fd = -1;
  for (;;) {
    ConnectResult r = connect_once(host_, port_, deadline);
    if (r.fd >= 0) {
      fd = r.fd;
      break;
    }
    if (!retry || Clock::now() >= deadline)
      TRIDENT_THROW(StoreError,
                    "could not connect to the store at {}{}: {}; is rank 0 (or `trident launch`) running, and are "
                    "MASTER_ADDR/MASTER_PORT right?",
                    where(), retry ? fmt::format(" within {:.1f}s", timeout_.count()) : std::string(), r.error);
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  std::string p(1, static_cast<char>(kAuth));
  put_str(p, token_);
  std::string err = send_all(fd, frame(p), deadline);
  char hdr[4];
  std::string body;
  if (err.empty()) err = recv_all(fd, hdr, 4, deadline);
  if (err.empty()) {
    size_t len = read_u32(hdr);
    if (len == 0 || len > kMaxPreAuthFrameBytes) err = "invalid reply (is this a trident store?)";
    else {
      body.resize(len);
      err = recv_all(fd, body.data(), len, deadline);
    }
  }
  if (!err.empty()) {
    ::close(fd);
    TRIDENT_THROW(StoreError, "store at {}: authentication failed: {}", where(), err);
  }
  uint8_t status = static_cast<uint8_t>(body[0]);
  if (status != kOk) {
    ::close(fd);
    std::string msg = body.substr(1);
    if (msg == "wrong token")
      TRIDENT_THROW(StoreError,
                    "store at {} refused the connection: wrong token (set TRIDENT_STORE_TOKEN to the launcher's token)",
                    where());
    TRIDENT_THROW(StoreError, "store at {} refused the connection: {}", where(), msg);
  }
  return fd;
}

TCPStore::Reply TCPStore::request(const std::string& payload, Seconds deadline_after_s, const char* what) {
  if (payload.size() > kMaxFrameBytes)
    TRIDENT_THROW(StoreError, "store {} at {}: request of {} bytes exceeds the {} message limit", what, where(),
                  payload.size(), format_bytes(kMaxFrameBytes));
  auto deadline = deadline_after(deadline_after_s);
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty())
      TRIDENT_THROW(StoreError, "store at {} is unusable after an earlier failure ({}); {} not attempted", where(),
                    broken_, what);
    if (::getpid() != pid_) {  // a forked child must not share its parent's connections
      for (int old : idle_) ::close(old);  // closes the child's copies only; the parent's stay open
      idle_.clear();
      pid_ = ::getpid();
    }
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  // Another thread is using the connection (or none is left): open one more rather than queue behind a wait.
  if (fd < 0) fd = connect_and_auth(std::min(deadline, Clock::now() + std::chrono::seconds(10)), false);

  std::string err = send_all(fd, frame(payload), deadline);
  char hdr[4];
  Reply reply{};
  if (err.empty()) err = recv_all(fd, hdr, 4, deadline);
  if (err.empty()) {
    size_t len = read_u32(hdr);
    if (len == 0 || len > kMaxFrameBytes + 64) err = fmt::format("invalid reply length {}", len);
    else {
      reply.body.resize(len);
      err = recv_all(fd, reply.body.data(), len, deadline);
    }
  }
  if (!err.empty()) {
    ::close(fd);
    std::string why = err == "timeout" ? fmt::format("{} got no answer within {:.1f}s", what, deadline_after_s.count())
                                       : fmt::format("lost connection during {}: {}", what, err);
    mark_broken(why);
    if (err == "timeout")
      TRIDENT_THROW(TimeoutError, "store at {} did not answer {} within {:.1f}s (is the server stalled?)", where(),
                    what, deadline_after_s.count());
    TRIDENT_THROW(StoreError,
                  "lost connection to the store at {} during {}: {} (did the server, rank 0 or `trident launch`, "
                  "exit?)",
                  where(), what, err);
  }
  reply.status = static_cast<uint8_t>(reply.body[0]);
  reply.body.erase(0, 1);
  bool known = reply.status == kOk || reply.status == kErrorStatus || reply.status == kTimeoutStatus;
  if (reply.status == kFatal || !known) {
    // The server closes the connection after a fatal reply; this connection is gone, the others are fine.
    ::close(fd);
    if (reply.status == kFatal) TRIDENT_THROW(StoreError, "store at {} refused {}: {}", where(), what, reply.body);
    mark_broken(fmt::format("invalid reply status {}", reply.status));
    TRIDENT_THROW(StoreError, "store at {}: invalid reply status {} to {}", where(), reply.status, what);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleConnections && ::getpid() == pid_) idle_.push_back(fd);
    else ::close(fd);
  }
  if (reply.status == kErrorStatus) TRIDENT_THROW(StoreError, "store at {}: {} failed: {}", where(), what, reply.body);
  if (reply.status == kTimeoutStatus) TRIDENT_THROW(TimeoutError, "store at {}: {}", where(), reply.body);
  return reply;
}

void TCPStore::mark_broken(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.empty()) broken_ = why;
  for (int fd : idle_) ::close(fd);
  idle_.clear();
}

namespace {
void check_key_size(const std::string& key, const std::string& where) {
  if (key.size() > kMaxKeyBytes)
    TRIDENT_THROW(StoreError, "store at {}: key of {} bytes exceeds the {} key limit; use shorter keys", where,
                  key.size(), format_bytes(kMaxKeyBytes));
}
Reader reader_of(const std::string& body) { return Reader{std::string_view(body)}; }
}  // namespace

void TCPStore::set(const std::string& key, const Bytes& value) {
  check_key_size(key, where());
  std::string p(1, static_cast<char>(kSet));
  put_str(p, key);
  put_bytes(p, value);
  request(p, timeout_, "set");
}

Bytes TCPStore::get(const std::string& key, std::optional<Seconds> timeout) {
  check_key_size(key, where());
  Seconds t = timeout.value_or(timeout_);
  std::string p(1, static_cast<char>(kGet));
  put_str(p, key);
  put_i64(p, to_ms(t));
  Reply r = request(p, t + kClientGrace, "get");
  Reader rd = reader_of(r.body);
  std::string v = rd.str();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to get", where());
  return Bytes(v.begin(), v.end());
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  check_key_size(key, where());
  std::string p(1, static_cast<char>(kAdd));
  put_str(p, key);
  put_i64(p, delta);
  Reply r = request(p, timeout_, "add");
  Reader rd = reader_of(r.body);
  int64_t v = rd.i64();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to add", where());
  return v;
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_key_size(key, where());
  std::string p(1, static_cast<char>(kCompareSet));
  put_str(p, key);
  put_bytes(p, expected);
  put_bytes(p, desired);
  Reply r = request(p, timeout_, "compare_set");
  Reader rd = reader_of(r.body);
  std::string v = rd.str();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to compare_set", where());
  return Bytes(v.begin(), v.end());
}

void TCPStore::wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) {
  Seconds t = timeout.value_or(timeout_);
  std::string p(1, static_cast<char>(kWait));
  put_u32(p, static_cast<uint32_t>(keys.size()));
  for (auto& k : keys) {
    check_key_size(k, where());
    put_str(p, k);
  }
  put_i64(p, to_ms(t));
  request(p, t + kClientGrace, "wait");
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::string p(1, static_cast<char>(kCheck));
  put_u32(p, static_cast<uint32_t>(keys.size()));
  for (auto& k : keys) {
    check_key_size(k, where());
    put_str(p, k);
  }
  Reply r = request(p, timeout_, "check");
  Reader rd = reader_of(r.body);
  uint8_t v = rd.u8();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to check", where());
  return v != 0;
}

bool TCPStore::delete_key(const std::string& key) {
  check_key_size(key, where());
  std::string p(1, static_cast<char>(kDelete));
  put_str(p, key);
  Reply r = request(p, timeout_, "delete_key");
  Reader rd = reader_of(r.body);
  uint8_t v = rd.u8();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to delete_key", where());
  return v != 0;
}

int64_t TCPStore::num_keys() {
  Reply r = request(std::string(1, static_cast<char>(kNumKeys)), timeout_, "num_keys");
  Reader rd = reader_of(r.body);
  int64_t v = rd.i64();
  if (!rd.done()) TRIDENT_THROW(StoreError, "store at {}: malformed reply to num_keys", where());
  return v;
}

}  // namespace trident
