#include "trident/core/error.h"

#include <cstring>
#include <typeinfo>

namespace trident {

std::exception_ptr copy_error(const std::exception_ptr& e, const std::string& lead) {
  if (!e) return e;
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    const std::type_info& t = typeid(x);
    const std::string what = lead + x.what();
    if (t == typeid(MismatchError)) {
      const auto& m = static_cast<const MismatchError&>(x);
      return std::make_exception_ptr(MismatchError(what, m.rank, m.peer, m.op, m.seq, m.ranks));
    }
    if (t == typeid(TimeoutError)) {
      const auto& m = static_cast<const TimeoutError&>(x);
      return std::make_exception_ptr(TimeoutError(what, m.rank, m.op, m.seq, m.missing));
    }
    if (t == typeid(PeerDiedError)) {
      const auto& m = static_cast<const PeerDiedError&>(x);
      return std::make_exception_ptr(PeerDiedError(what, m.rank, m.peer, m.op, m.seq));
    }
    if (t == typeid(NetworkError)) {
      const auto& m = static_cast<const NetworkError&>(x);
      return std::make_exception_ptr(NetworkError(what, m.rank, m.peer, m.op, m.seq));
    }
    if (t == typeid(InvalidArgument)) return std::make_exception_ptr(InvalidArgument(what));
    if (t == typeid(Unsupported)) return std::make_exception_ptr(Unsupported(what));
    if (t == typeid(StoreError)) return std::make_exception_ptr(StoreError(what));
    if (t == typeid(IoError)) return std::make_exception_ptr(IoError(what));
    if (t == typeid(Error)) return std::make_exception_ptr(Error(what));
    return e;
  } catch (...) {
    return e;
  }
}

std::string with_timed_out_words(const std::string& message) {
  if (message.find("Timed out") != std::string::npos) return message;
  return "Timed out - " + message;
}

std::string with_peer_failed_words(const std::string& message, int peer) {
  if (message.find("Connection closed by peer") != std::string::npos) return message;
  std::string lead = "Connection closed by peer - ";
  if (peer >= 0 && message.find(fmt::format("Rank {} failed", peer)) == std::string::npos)
    lead = fmt::format("Rank {} failed - ", peer) + lead;
  return lead + message;
}

}  // namespace trident

namespace trident::detail {

std::string with_location(const std::string& msg, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return fmt::format("{} ({}:{})", msg, base ? base + 1 : file, line);
}

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer.
  const char* s = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", s, err);
}

}  // namespace trident::detail
