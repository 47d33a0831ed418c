// TCPStore: the Store of real runs (c10d's TCPStore): one TCPStoreServer (rank 0 or the launcher) holds the
// keys; every rank talks to it through a TCPStore client.
//
// Protocol (tcp_store_wire.h has the details): length-prefixed binary frames over one TCP connection per client.
// The first frame must authenticate with the shared token (compared in constant time; an empty server token
// accepts any). Frames are bounded (kMaxFrameBytes; 64 KiB before authentication), keys by kMaxKeyBytes.
// A wrong token, a malformed frame, an unknown command or an oversized frame is answered with an error (when
// the connection can still carry one) and the connection is closed; the server keeps serving everyone else.
//
// TCPStoreServer. Ownership: owns its listening socket, its connections and its serving thread, which starts
// in the constructor and is joined by stop() or the destructor. Blocking: never, on the serving thread: it is
// one poll() loop over non-blocking sockets; get()/wait() requests whose keys are missing are parked as
// waiters and answered when the keys appear or the waiter's deadline passes. Thread-safety: port(), stop()
// and num_clients() may be called from any thread.
//
// TCPStore (client). Ownership: owns its connections. Thread-safety: any thread. Each connection carries one
// request at a time (a request takes an idle connection under a mutex and returns it after the response), and
// a thread that finds every connection busy (say, another thread is parked in wait()) opens one more, so a
// wait never blocks a set from another thread (at most kMaxIdleConnections stay open when idle). After fork()
// the child opens its own connections. Timeouts: the constructor retries connecting until `timeout`
// (so ranks may start before the server); every request has a deadline (the store's timeout, or the one
// given to get()/wait()); the server answers an expired wait with TimeoutError naming the missing keys, and
// the client also enforces the deadline itself (plus a grace) so a stalled server cannot hang it. Errors:
// StoreError naming host:port when the server refuses the connection or the connection breaks (a dead
// server is reported at once, not after the timeout); after a break the client stays broken (no silent
// reconnection, since keys may have been lost with the server).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "trident/comm/store/store.h"

namespace trident {

constexpr size_t kMaxFrameBytes = size_t{64} << 20;  // one request or response, all fields included
constexpr size_t kMaxKeyBytes = size_t{64} << 10;
constexpr size_t kMaxPreAuthFrameBytes = size_t{64} << 10;

class TCPStoreServer {
 public:
  // Binds host:port ("" or "0.0.0.0" = every interface; port 0 picks a free port) and starts serving.
  // Throws StoreError when the address cannot be bound (e.g. the port is in use).
  TCPStoreServer(const std::string& host, int port, std::string token);
  // Serves on `bound_fd`, a TCP socket already bound (not yet listening) that the server now owns: whoever
  // bound it knows the port before the server exists, and until this call connections to it are refused
  // (clients retry), so no other process can take the port in between. Throws StoreError when listen fails.
  TCPStoreServer(int bound_fd, std::string token);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  // Closes every connection and joins the serving thread. Idempotent.
  void stop();
  // Authenticated connections now open (for tests and diagnostics).
  int num_clients() const { return num_clients_.load(); }

 private:
  struct State;
  void serve();
  void start(int fd);  // listens on fd, learns the port, starts the serving thread

  std::string host_;
  int port_ = 0;
  std::unique_ptr<State> state_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::atomic<int> num_clients_{0};
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

class TCPStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout`, and authenticates with `token`. `timeout` is also the
  // default deadline of every later request.
  TCPStore(const std::string& host, int port, std::string token, Seconds timeout = Seconds(600.0));
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Seconds> timeout = std::nullopt) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // Keeps `server` alive as long as this client (rank 0 hosting the store for everyone).
  void adopt_server(std::unique_ptr<TCPStoreServer> server) { server_ = std::move(server); }

 private:
  struct Reply {
    uint8_t status;
    std::string body;
  };
  static constexpr size_t kMaxIdleConnections = 8;
  Reply request(const std::string& payload, Seconds deadline_after, const char* what);
  int connect_and_auth(std::chrono::steady_clock::time_point deadline, bool retry);
  void mark_broken(const std::string& why);
  std::string where() const;

  std::unique_ptr<TCPStoreServer> server_;  // declared first: destroyed after the connections close
  std::string host_;
  int port_;
  std::string token_;
  std::mutex mu_;           // guards idle_, broken_, pid_; never held during I/O
  std::vector<int> idle_;   // authenticated connections not in use
  std::string broken_;      // why the client is unusable ("" = fine)
  int pid_;                 // the process that opened idle_ (a forked child opens its own)
};

}  // namespace trident
