#include "trident/core/error.h"

#include <cstring>

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
