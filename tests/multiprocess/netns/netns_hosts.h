// Test helpers for emulated hosts (scripts/netns_hosts.sh): a shell runner, the reasons a machine cannot
// run them (a missing tool, no privilege for network namespaces), and hosts that exist for a scope.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace trident {

// Runs `cmd` with sh; returns (exit status, stdout+stderr).
inline std::pair<int, std::string> sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline std::string script() { return std::string(TRIDENT_SOURCE_DIR) + "/scripts/netns_hosts.sh"; }

// Why this machine cannot run the test, or "" when it can.
// A tool the test needs and this machine lacks (a package to install), or "".
inline std::string missing_tool() {
  for (const char* tool : {"ip", "tc"})
    if (sh(fmt::format("command -v {}", tool)).first != 0) return fmt::format("'{}' not found (install iproute2)", tool);
  return "";
}

// Why this process may not create network namespaces (a privilege the machine does not give), or "".
inline std::string no_privilege() {
  if (::geteuid() != 0) return fmt::format("network namespaces need root; this test runs as uid {}", ::geteuid());
  const std::string probe = fmt::format("trprobe{}", ::getpid());
  auto [rc, out] = sh("ip netns add " + probe);
  sh("ip netns del " + probe);
  if (rc != 0) return "cannot create a network namespace (`ip netns add` failed: " + out + ")";
  return "";
}

// Hosts PREFIX-h0.. up for the scope; down at exit, whatever happened.
struct Hosts {
  std::string prefix;
  std::string setup;  // the script's output (shaping line, addresses)
  int rc = -1;
  // `flags`: more flags of `netns_hosts.sh up` (--rate, --delay, --no-shape).
  Hosts(int n, std::string p, const std::string& flags = "") : prefix(std::move(p)) {
    std::tie(rc, setup) = sh(fmt::format("{} up {} --prefix {} {}", script(), n, prefix, flags));
  }
  ~Hosts() { sh(fmt::format("{} down --prefix {}", script(), prefix)); }
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace trident
