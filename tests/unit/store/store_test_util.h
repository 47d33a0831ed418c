// Helpers shared by the store tests: a temporary folder, an environment guard, forked workers.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trident::test {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string tmpl = base + "/trident-store-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) std::abort();
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Saves the named variables, unsets them, and restores them on destruction.
class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::string> names) {
    for (auto& n : names) {
      const char* v = std::getenv(n.c_str());
      saved_[n] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(n.c_str());
    }
  }
  ~EnvGuard() {
    for (auto& [n, v] : saved_) {
      if (v) ::setenv(n.c_str(), v->c_str(), 1);
      else ::unsetenv(n.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    if (!saved_.count(name)) {  // remember variables not named at construction too
      const char* v = std::getenv(name.c_str());
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
    }
    ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Runs fn(i) in `n` forked children; returns how many children failed (threw, returned false, or died).
inline int run_forked(int n, const std::function<bool(int)>& fn) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = fn(i) ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "forked worker %d: %s\n", i, e.what());
        code = 2;
      } catch (...) {
        code = 3;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    if (pid < 0) return n;
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed;
}

}  // namespace trident::test
