// TCPStore specifics: authentication, hostile input on raw sockets, start order, server loss.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>
#include <utility>

#include "trident/comm/store/tcp_store.h"
#include "trident/core/error.h"

namespace trident::tcp_store_test {
namespace {

constexpr const char* kHost = "127.0.0.1";

Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }

// The wire format, written out independently of tcp_store_wire.h (see the protocol comment there).
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
std::string field(const std::string& s) { return le32(static_cast<uint32_t>(s.size())) + s; }
std::string frame(const std::string& payload) { return le32(static_cast<uint32_t>(payload.size())) + payload; }
std::string auth_frame(const std::string& token) { return frame(std::string(1, '\x01') + field(token)); }

// A raw TCP connection for sending arbitrary bytes.
class RawSocket {
 public:
  explicit RawSocket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawSocket() { ::close(fd_); }
  bool connected() const { return connected_; }
  // Sends what it can (the server may close early); returns false if the connection broke.
  bool send(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until the server closes or `seconds` pass; returns what arrived and sets eof.
  std::string read_until_close(double seconds, bool* eof) {
    std::string out;
    *eof = false;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        *eof = true;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Reads exactly one reply frame; returns {status, message}.
  std::pair<int, std::string> read_reply(double seconds = 10) {
    std::string got;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      if (got.size() >= 4) {
        uint32_t len = 0;
        for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(got[i])) << (8 * i);
        if (got.size() >= 4 + len && len >= 1) return {static_cast<uint8_t>(got[4]), got.substr(5, len - 1)};
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return {-1, got};
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A good client can still use the server.
void expect_server_healthy(int port, const std::string& token, const std::string& tag) {
  TCPStore good(kHost, port, token, Seconds(30));
  good.set("health/" + tag, B(tag));
  EXPECT_EQ(good.get_string("health/" + tag), tag);
  int64_t after = good.add("health/count", 1);
  EXPECT_EQ(good.add("health/count", 0), after);
}

// A TCP socket bound to 127.0.0.1 on a port the kernel picked, not listening: it holds the port (no other
// process can bind it) while connections to it are refused. release() hands the socket to a server.
class BoundSocket {
 public:
  BoundSocket() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) std::abort();
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~BoundSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(TCPStore, WrongTokenIsRefusedAndTheServerKeepsServing) {
  TCPStoreServer server(kHost, 0, "right-token");
  try {
    TCPStore bad(kHost, server.port(), "wrong-token", Seconds(10));
    FAIL() << "a client with the wrong token connected";
  } catch (const StoreError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("wrong token"), std::string::npos) << what;
    EXPECT_NE(what.find("TRIDENT_STORE_TOKEN"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("{}:{}", kHost, server.port())), std::string::npos) << what;
  }
  EXPECT_THROW(TCPStore(kHost, server.port(), "", Seconds(10)), StoreError);  // no token at all
  expect_server_healthy(server.port(), "right-token", "after-bad-token");
}

TEST(TCPStore, ServerWithoutTokenAcceptsAnyClient) {
  TCPStoreServer server(kHost, 0, "");
  TCPStore a(kHost, server.port(), "", Seconds(10));
  TCPStore b(kHost, server.port(), "anything", Seconds(10));
  a.set("k", B("v"));
  EXPECT_EQ(b.get_string("k"), "v");
  EXPECT_EQ(server.num_clients(), 2);
}

TEST(TCPStore, RandomBytesDoNotCrashOrWedgeTheServer) {
  TCPStoreServer server(kHost, 0, "tok");
  std::mt19937 rng(12345);
  for (int round = 0; round < 8; ++round) {
    RawSocket raw(server.port());
    ASSERT_TRUE(raw.connected());
    std::string junk(1 + rng() % 8192, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    raw.send(junk);
    bool eof = false;
    raw.read_until_close(0.2, &eof);  // either refused and closed, or waiting for the rest of a "frame"
    expect_server_healthy(server.port(), "tok", "random" + std::to_string(round));
  }
}

struct Refusal {
  const char* name;
  bool authenticate_first;
  std::string bytes;
  const char* expected_message;
};

TEST(TCPStore, MalformedOrOversizedFramesAreRefusedAndDisconnected) {
  const std::string big_key(kMaxKeyBytes + 1, 'k');
  std::vector<Refusal> cases = {
      {"oversized length before auth", false, le32(0xFFFFFFFFu), "exceeds"},
      {"large frame before auth", false, le32(1u << 20), "before authentication"},
      {"command before auth", false, frame(std::string(1, '\x02') + field("k") + field("v")), "must authenticate"},
      {"empty frame", false, le32(0), "malformed"},
      {"oversized length after auth", true, le32(static_cast<uint32_t>(kMaxFrameBytes + 1)), "64 MiB"},
      {"unknown command", true, frame(std::string(1, '\xEE')), "unknown command"},
      {"truncated field", true, frame(std::string(1, '\x02') + le32(1000) + "abc"), "malformed"},
      {"trailing bytes", true, frame(std::string(1, '\x09') + "extra"), "malformed"},
      {"key too long", true, frame(std::string(1, '\x02') + field(big_key) + field("v")), "key"},
      {"wait with absurd key count", true, frame(std::string(1, '\x06') + le32(0x7FFFFFFF)), "malformed"},
  };
  TCPStoreServer server(kHost, 0, "tok");
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawSocket raw(server.port());
    ASSERT_TRUE(raw.connected());
    if (c.authenticate_first) {
      raw.send(auth_frame("tok"));
      auto [status, msg] = raw.read_reply();
      ASSERT_EQ(status, 0) << msg;
    }
    raw.send(c.bytes);
    auto [status, msg] = raw.read_reply();
    EXPECT_EQ(status, 3) << msg;  // fatal: the server closes after this reply
    EXPECT_NE(msg.find(c.expected_message), std::string::npos) << msg;
    bool eof = false;
    raw.read_until_close(10, &eof);
    EXPECT_TRUE(eof) << "server kept a refused connection open";
    expect_server_healthy(server.port(), "tok", c.name);
  }
}

// Clients already connected (one of them parked in a wait) keep being served while others are refused:
// a wrong token, no token, an authentication frame without its token field, garbage instead of a frame,
// and a second authentication on an authenticated connection. Each refusal is a fatal reply saying why.
TEST(TCPStore, RefusedClientsLeaveConnectedClientsServed) {
  TCPStoreServer server(kHost, 0, "tok");
  TCPStore a(kHost, server.port(), "tok", Seconds(30));
  TCPStore b(kHost, server.port(), "tok", Seconds(30));
  std::atomic<bool> released{false};
  std::thread waiter([&] {
    b.wait({"go"}, Seconds(30));
    released = true;
  });
  std::mt19937 rng(7);
  std::string garbage(4096, '\0');
  for (auto& ch : garbage) ch = static_cast<char>(rng());
  garbage[0] = 8, garbage[1] = garbage[2] = garbage[3] = 0;  // a small frame of random bytes
  const std::vector<Refusal> cases = {
      {"wrong token", false, auth_frame("not-tok"), "wrong token"},
      {"empty token", false, auth_frame(""), "wrong token"},
      {"auth without its token field", false, frame(std::string(1, '\x01')), "malformed"},
      {"garbage instead of auth", false, garbage, "must authenticate"},
      {"second authentication", true, auth_frame("tok"), "second authentication"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawSocket raw(server.port());
    ASSERT_TRUE(raw.connected());
    if (c.authenticate_first) {
      raw.send(auth_frame("tok"));
      ASSERT_EQ(raw.read_reply().first, 0);
    }
    raw.send(c.bytes);
    auto [status, msg] = raw.read_reply();
    EXPECT_EQ(status, 3) << msg;
    EXPECT_NE(msg.find(c.expected_message), std::string::npos) << msg;
    bool eof = false;
    raw.read_until_close(10, &eof);
    EXPECT_TRUE(eof) << "server kept a refused connection open";
    // The clients connected before are served between refusals.
    a.set(std::string("after/") + c.name, B(c.name));
    EXPECT_EQ(b.get_string(std::string("after/") + c.name), c.name);
  }
  EXPECT_FALSE(released.load());
  a.set("go", B("1"));
  waiter.join();
  EXPECT_TRUE(released.load());
}

TEST(TCPStore, AStalledPartialFrameDoesNotBlockOtherClients) {
  TCPStoreServer server(kHost, 0, "tok");
  RawSocket stalled(server.port());
  ASSERT_TRUE(stalled.connected());
  stalled.send(auth_frame("tok"));
  ASSERT_EQ(stalled.read_reply().first, 0);
  stalled.send(le32(100) + "only part of the frame");  // and never the rest
  RawSocket silent(server.port());                      // connected, never authenticates
  expect_server_healthy(server.port(), "tok", "beside-stalled");
}

TEST(TCPStore, ClientThatDisconnectsWhileWaitingIsForgotten) {
  TCPStoreServer server(kHost, 0, "tok");
  {
    RawSocket raw(server.port());
    raw.send(auth_frame("tok"));
    ASSERT_EQ(raw.read_reply().first, 0);
    std::string wait = std::string(1, '\x06') + le32(1) + field("never") + std::string("\x60\xEA\0\0\0\0\0\0", 8);
    raw.send(frame(wait));  // wait 60 s for "never", then hang up
  }
  TCPStore good(kHost, server.port(), "tok", Seconds(30));
  good.set("never", B("now"));  // would answer the departed waiter
  expect_server_healthy(server.port(), "tok", "after-departed-waiter");
}

TEST(TCPStore, ServerAnswersOthersWhileAWaitIsParked) {
  TCPStoreServer server(kHost, 0, "tok");
  std::atomic<bool> timed_out{false};
  std::thread waiter([&] {
    TCPStore w(kHost, server.port(), "tok", Seconds(30));
    try {
      w.wait({"parked_key"}, Seconds(0.5));
    } catch (const TimeoutError& e) {
      timed_out = std::string(e.what()).find("parked_key") != std::string::npos;
    }
  });
  TCPStore busy(kHost, server.port(), "tok", Seconds(30));
  for (int i = 0; i < 200; ++i) {
    busy.set("k" + std::to_string(i), B(std::to_string(i * i)));
    EXPECT_EQ(busy.get_string("k" + std::to_string(i)), std::to_string(i * i));
  }
  waiter.join();
  EXPECT_TRUE(timed_out.load());
}

TEST(TCPStore, OneSetReleasesEveryWaiter) {
  TCPStoreServer server(kHost, 0, "tok");
  constexpr int kWaiters = 12;
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      TCPStore c(kHost, server.port(), "tok", Seconds(30));
      c.add("arrived", 1);
      if (i % 2 == 0) c.wait({"go", "arrived"});
      else EXPECT_EQ(c.get_string("go"), "now");
      released++;
    });
  }
  TCPStore main_client(kHost, server.port(), "tok", Seconds(30));
  while (main_client.add("arrived", 0) < kWaiters) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  main_client.set("go", B("now"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), kWaiters);
}

TEST(TCPStore, ClientStartedBeforeTheServerConnectsOnceItIsUp) {
  BoundSocket reserved;  // the port is known and held before the server exists; connections are refused
  const int port = reserved.port();
  std::string got;
  std::thread client([&] {
    TCPStore c(kHost, port, "tok", Seconds(30));  // retries until the server listens
    got = c.get_string("hello");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  TCPStoreServer server(reserved.release(), "tok");
  EXPECT_EQ(server.port(), port);
  TCPStore(kHost, port, "tok", Seconds(30)).set("hello", B("world"));
  client.join();
  EXPECT_EQ(got, "world");
}

TEST(TCPStore, NoServerWithinTheDeadlineIsAStoreErrorNamingTheAddress) {
  BoundSocket reserved;  // held for the whole test: nothing listens there and nothing else can
  const int port = reserved.port();
  try {
    TCPStore c(kHost, port, "", Seconds(0.3));
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{}:{}", kHost, port)), std::string::npos) << e.what();
  }
}

TEST(TCPStore, StoppedServerGivesStoreErrorNotAHang) {
  auto server = std::make_unique<TCPStoreServer>(kHost, 0, "tok");
  int port = server->port();
  TCPStore idle(kHost, port, "tok", Seconds(600));
  idle.set("k", B("v"));
  std::atomic<int> waiter_error{0};  // 1 = StoreError, 2 = something else
  std::atomic<bool> parked{false};
  std::thread waiter([&] {
    TCPStore w(kHost, port, "tok", Seconds(600));
    try {
      parked = true;
      w.wait({"never"});  // default deadline: 600 s
      waiter_error = 2;
    } catch (const StoreError& e) {
      waiter_error = std::string(e.what()).find(fmt::format("{}:{}", kHost, port)) != std::string::npos ? 1 : 3;
    } catch (...) {
      waiter_error = 2;
    }
  });
  while (!parked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server->stop();
  waiter.join();
  EXPECT_EQ(waiter_error.load(), 1);
  try {
    idle.get("k");
    FAIL() << "get succeeded on a stopped server";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{}:{}", kHost, port)), std::string::npos) << e.what();
  }
  EXPECT_THROW(idle.set("k", B("v")), StoreError);  // stays broken
}

// Hosts a TCPStoreServer in a forked child (a separate process that can be killed or stopped).
class ServerProcess {
 public:
  ServerProcess() {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      TCPStoreServer server(kHost, 0, "tok");
      int port = server.port();
      if (::write(fds[1], &port, sizeof port) != sizeof port) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(fds[1]);
    if (::read(fds[0], &port_, sizeof port_) != sizeof port_) port_ = -1;
    ::close(fds[0]);
  }
  ~ServerProcess() { kill_now(); }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void pause_it() {  // returns once the child is stopped (SIGSTOP is asynchronous)
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

TEST(TCPStore, KilledServerProcessGivesStoreErrorToEveryClient) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);
  TCPStore idle(kHost, server.port(), "tok", Seconds(600));
  idle.set("k", B("v"));
  std::atomic<bool> parked{false};
  std::atomic<int> outcome{0};  // 1 = StoreError naming the address
  std::thread waiter([&] {
    TCPStore w(kHost, server.port(), "tok", Seconds(600));
    parked = true;
    try {
      w.get("never");
    } catch (const StoreError& e) {
      outcome = std::string(e.what()).find(fmt::format("{}:{}", kHost, server.port())) != std::string::npos ? 1 : 2;
    } catch (...) {
      outcome = 3;
    }
  });
  while (!parked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server.kill_now();
  waiter.join();
  EXPECT_EQ(outcome.load(), 1);
  EXPECT_THROW(idle.get("k"), StoreError);
}

TEST(TCPStore, StalledServerIsATimeoutAtTheClientsDeadline) {
  ServerProcess server;
  ASSERT_GT(server.port(), 0);
  TCPStore c(kHost, server.port(), "tok", Seconds(0.3));
  c.set_timeout(Seconds(30));
  c.set("k", B("v"));
  c.set_timeout(Seconds(0.3));
  server.pause_it();  // alive, connected, silent
  try {
    c.set("k", B("w"));
    FAIL() << "a stopped server answered";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("{}:{}", kHost, server.port())), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.get("k"), StoreError);  // the client does not trust that connection again
}

TEST(TCPStore, OverlongKeyIsRefusedByTheClientWhichStaysUsable) {
  TCPStoreServer server(kHost, 0, "");
  TCPStore c(kHost, server.port(), "", Seconds(30));
  EXPECT_THROW(c.set(std::string(kMaxKeyBytes + 1, 'k'), B("v")), StoreError);
  c.set("short", B("v"));
  EXPECT_EQ(c.get_string("short"), "v");
}

TEST(TCPStore, PortInUseIsAStoreError) {
  TCPStoreServer first(kHost, 0, "");
  EXPECT_THROW(TCPStoreServer(kHost, first.port(), ""), StoreError);
}

}  // namespace
}  // namespace trident::tcp_store_test
