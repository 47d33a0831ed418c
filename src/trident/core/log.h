// Logging to stderr with a rank prefix. Thread-safe (one write(2) per line). Never throws.
//
// TRIDENT_LOG_LEVEL=debug|info|warn|error sets the threshold (default info). TRIDENT_DEBUG=comm,store,...
// enables debug lines of the named subsystems only (log_debug_enabled("comm")).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace trident {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void log_line(LogLevel level, std::string_view msg);
bool log_enabled(LogLevel level);
// True when TRIDENT_DEBUG names `subsystem` (or "all").
bool log_debug_enabled(std::string_view subsystem);
// Prefix for every line, e.g. "[rank 3]". Set once a rank is known.
void set_log_prefix(std::string prefix);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kInfo)) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kWarn)) log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kError)) log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}
// Debug lines for one subsystem: printed when TRIDENT_DEBUG names it.
template <typename... Args>
void log_debug(std::string_view subsystem, fmt::format_string<Args...> f, Args&&... args) {
  if (log_debug_enabled(subsystem)) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace trident
