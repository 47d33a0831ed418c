// Test helper: runs a program (the built `trident` CLI) with pipes on stdout/stderr, reads its output while it
// runs, and bounds every wait with a hang guard (a guard that fires kills the program and fails the test; it is
// not a performance assertion). Single-threaded; owns the child and kills it in the destructor.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace trident::testing {

// This process's environment without `drop`, plus `extra` ("NAME=value").
inline std::vector<std::string> make_env(const std::vector<std::string>& drop, const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    std::string name = kv.substr(0, kv.find('='));
    bool dropped = false;
    for (const auto& d : drop) dropped |= d == name;
    if (!dropped) out.push_back(kv);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// How many times `needle` occurs in `text` (e.g. the step records a training job has printed so far).
inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// "A=1 B=x" -> {A:1, B:x}
inline std::map<std::string, std::string> parse_fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    auto eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

// The children of `parent` (the ranks the launcher started), with their RANK.
inline std::vector<std::pair<pid_t, int>> ranks_of(pid_t parent) {
  std::vector<std::pair<pid_t, int>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream env_file(e.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(env_file)), std::istreambuf_iterator<char>());
    int rank = -1;
    for (size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
      if (env.compare(at, 5, "RANK=") == 0) rank = std::stoi(env.substr(at + 5));
      if (env.find('\0', at) == std::string::npos) break;
    }
    if (rank >= 0) out.emplace_back(static_cast<pid_t>(std::stol(name)), rank);
  }
  return out;
}

class ProcessRunner {
 public:
  ProcessRunner(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }
  ~ProcessRunner() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  ProcessRunner(const ProcessRunner&) = delete;
  ProcessRunner& operator=(const ProcessRunner&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  // Reads output until `done()` holds or `guard_seconds` pass; returns whether it holds.
  bool read_until(const std::function<bool()>& done, double guard_seconds) {
    const auto deadline = now() + guard_seconds;
    while (!done()) {
      if (now() >= deadline || (out_fd_ < 0 && err_fd_ < 0)) return done();
      pump(50);
    }
    return true;
  }

  // Reads all output and waits for the exit; returns the raw wait status, or nullopt when the guard fired
  // (the program is then killed).
  std::optional<int> wait(double guard_seconds) {
    const auto deadline = now() + guard_seconds;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (now() >= deadline) return kill_after_guard();
      pump(50);
    }
    while (!status_) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        break;
      }
      if (now() >= deadline) return kill_after_guard();
      ::usleep(5000);
    }
    return status_;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  std::optional<int> kill_after_guard() {
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
    status_ = st;
    return std::nullopt;
  }
  void pump(int timeout_ms) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    if (n == 0 || ::poll(fds, n, timeout_ms) <= 0) return;
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      int& fd = fds[i].fd == out_fd_ ? out_fd_ : err_fd_;
      std::string& sink = fds[i].fd == out_fd_ ? out_ : err_;
      char buf[4096];
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r > 0) {
        sink.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fd);
        fd = -1;
      }
    }
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_, err_;
  std::optional<int> status_;
};

}  // namespace trident::testing
