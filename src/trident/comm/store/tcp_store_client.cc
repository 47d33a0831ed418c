// TCPStore: the client side of the store (one connection, one request at a time, deadlines on every call).
// The wire format is in tcp_store_wire.h.
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

// Sends (`sending`) or receives all `len` bytes at `buf` before `deadline`. Returns "" or the reason it
// failed ("timeout" on expiry).
std::string transfer_all(int fd, char* buf, size_t len, Clock::time_point deadline, bool sending) {
  size_t done = 0;
  while (done < len) {
    pollfd p{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    int prc = ::poll(&p, 1, ms_until(deadline));
    if (prc < 0) {
      if (errno == EINTR) continue;
      return detail::errno_string(errno);
    }
    if (prc == 0) return "timeout";
    ssize_t n = sending ? ::send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : ::recv(fd, buf + done, len - done, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return detail::errno_string(errno);
    }
    if (n == 0 && !sending) return "connection closed by the server";
    done += static_cast<size_t>(n);
  }
  return {};
}
std::string send_all(int fd, const std::string& data, Clock::time_point deadline) {
  // transfer_all only reads the buffer when sending.
  return transfer_all(fd, const_cast<char*>(data.data()), data.size(), deadline, true);
}
std::string recv_all(int fd, char* buf, size_t len, Clock::time_point deadline) {
  return transfer_all(fd, buf, len, deadline, false);
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
