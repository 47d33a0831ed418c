// Runs the built `trident` binary (TRIDENT_BIN) with a shell command line and captures its output: for tests
// of a command's flags, output and exit status.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace trident::testing {

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

// `args`: everything after the binary's path, as a shell would read it; `env` (e.g. "A=1 B=2") is set for it.
inline CliRun run_trident(const std::string& args, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(TRIDENT_BIN) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace trident::testing
