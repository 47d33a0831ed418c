// Errors thrown at trident's API boundaries.
//
// Every error is a trident::Error (a std::runtime_error) with a typed origin and its context as fields,
// thrown through TRIDENT_THROW, which adds file:line. Hot loops use no-throw status values and convert at
// the boundary. C library return codes (POSIX, MPI, CUDA, NCCL) are wrapped at the call site.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace trident {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed something that cannot work: a bad flag, config value, size or dtype.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An operation a backend or dtype does not support.
class Unsupported : public Error {
 public:
  using Error::Error;
};

// The rendezvous store failed or refused a request.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its contents are corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// An allocation the machine could not satisfy: `bytes` is what was asked for.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, size_t bytes) : Error(what), bytes(bytes) {}
  size_t bytes;
};

// c10d's words for a condition a typed error describes, put before `message` unless it has them already, so
// that programs and tools that match PyTorch's messages (its tests: " (Timed out|closed|timeout) ") recognise
// trident's; the fields and the rest of the message stay as they are. PeerDiedError and TimeoutError add
// them to every message they are made with, wherever they are thrown (native, MPI, stores).
// An expired deadline: "Timed out - <message>".
std::string with_timed_out_words(const std::string& message);
// A peer that died or closed its connection: "Rank <peer> failed - Connection closed by peer - <message>"
// (without "Rank <peer> failed" when peer < 0).
std::string with_peer_failed_words(const std::string& message, int peer);

// Communication with a peer failed. `rank` is this process's rank in `group`, `peer` the other side
// (-1 when not one peer), `op` the collective or "connect"/"send"/"recv", `seq` its sequence number.
class NetworkError : public Error {
 public:
  NetworkError(const std::string& what, int rank = -1, int peer = -1, std::string op = {}, long seq = -1)
      : Error(what), rank(rank), peer(peer), op(std::move(op)), seq(seq) {}
  int rank;
  int peer;
  std::string op;
  long seq;
};

// A peer process died: `peer` names it.
class PeerDiedError : public NetworkError {
 public:
  PeerDiedError(const std::string& what, int rank = -1, int peer = -1, std::string op = {}, long seq = -1)
      : NetworkError(with_peer_failed_words(what, peer), rank, peer, std::move(op), seq) {}
};

// Ranks issued different collectives at the same sequence number. `ranks` are the two ranks whose calls
// differ (the one that noticed first); `peer` is the one of them that is not this rank.
class MismatchError : public NetworkError {
 public:
  MismatchError(const std::string& what, int rank = -1, int peer = -1, std::string op = {}, long seq = -1,
                std::vector<int> ranks = {})
      : NetworkError(what, rank, peer, std::move(op), seq), ranks(std::move(ranks)) {}
  std::vector<int> ranks;
};

// A deadline expired. `missing` lists the ranks not heard from, when known.
class TimeoutError : public NetworkError {
 public:
  TimeoutError(const std::string& what, int rank = -1, std::string op = {}, long seq = -1,
               std::vector<int> missing = {})
      : NetworkError(with_timed_out_words(what), rank, -1, std::move(op), seq), missing(std::move(missing)) {}
  std::vector<int> missing;
};

// A new exception of exactly e's type and fields whose message is lead + e's, for trident's types above;
// any other exception (a subclass defined elsewhere, a std:: one) is returned as it is. The thread that
// calls this gets an object of its own: an error made on one thread and read on another (a collective's
// Work) is copied by the reader, so the original may be released by either thread without the reader
// touching it after that.
std::exception_ptr copy_error(const std::exception_ptr& e, const std::string& lead = {});

namespace detail {
std::string with_location(const std::string& msg, const char* file, int line);
std::string errno_string(int err);
}  // namespace detail

}  // namespace trident

// TRIDENT_THROW(Type, "fmt {}", args...) throws Type(message " (file:line)").
#define TRIDENT_THROW(Type, ...) \
  throw Type(::trident::detail::with_location(::fmt::format(__VA_ARGS__), __FILE__, __LINE__))

// TRIDENT_CHECK(cond, Type, "fmt", args...) throws when cond is false.
#define TRIDENT_CHECK(cond, Type, ...) \
  do {                                 \
    if (!(cond)) TRIDENT_THROW(Type, __VA_ARGS__); \
  } while (0)

// Wraps a POSIX call that returns -1 and sets errno.
#define TRIDENT_SYSCHECK(expr, what)                                                             \
  do {                                                                                           \
    if ((expr) < 0) {                                                                            \
      int trident_errno_ = errno;                                                                \
      TRIDENT_THROW(::trident::IoError, "{}: {}", what, ::trident::detail::errno_string(trident_errno_)); \
    }                                                                                            \
  } while (0)
