#include "trident/core/log.h"

#include <unistd.h>

#include <mutex>

#include "trident/core/env.h"

namespace trident {
namespace {
// Never destroyed, as env's table: threads that outlive static destructors log (the flight recorder's dump
// thread writing the dump of the launcher's SIGTERM while the main thread is in exit()).
std::mutex& prefix_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::string& prefix_storage() {
  static auto* p = new std::string;
  return *p;
}
LogLevel threshold() {
  static const LogLevel level = [] {
    std::string v = env::log_level();
    if (v == "debug") return LogLevel::kDebug;
    if (v == "warn") return LogLevel::kWarn;
    if (v == "error") return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}
}  // namespace

bool log_enabled(LogLevel level) { return level >= threshold(); }

bool log_debug_enabled(std::string_view subsystem) {
  static const std::string debug = env::debug();
  if (debug.empty()) return false;
  if (debug == "all" || debug == "1") return true;
  size_t pos = 0;
  while (pos <= debug.size()) {
    size_t end = debug.find(',', pos);
    if (end == std::string::npos) end = debug.size();
    if (std::string_view(debug).substr(pos, end - pos) == subsystem) return true;
    pos = end + 1;
  }
  return false;
}

void set_log_prefix(std::string prefix) {
  std::lock_guard<std::mutex> lock(prefix_mutex());
  prefix_storage() = std::move(prefix);
}

void log_line(LogLevel level, std::string_view msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(prefix_mutex());
    prefix = prefix_storage();
  }
  std::string line = fmt::format("trident{}{} {}: {}\n", prefix.empty() ? "" : " ", prefix,
                                 names[static_cast<int>(level)], msg);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(2, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace trident
