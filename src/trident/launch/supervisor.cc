#include "trident/launch/supervisor.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <fmt/ranges.h>

#include "trident/core/error.h"

namespace trident::launch {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLineBytes = 64 * 1024;  // a longer run without '\n' is emitted as one line
constexpr size_t kTailLineBytes = 1024;      // lines kept for reports are cut to this
constexpr double kDrainSeconds = 1.0;        // output still read after the last child ended
constexpr int kPollMillis = 20;              // how often running children are reaped

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      return;  // EPIPE and friends: the reader is gone; output is dropped, supervision goes on
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Process-wide signal forwarding: the handler writes the signal number into a self-pipe that run() polls.
int g_signal_pipe[2] = {-1, -1};
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_previous[3];
struct sigaction g_previous_pipe;
bool g_forwarding = false;

void on_forwarded_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void install_forwarding() {
  TRIDENT_CHECK(!g_forwarding, IoError,
                "two Supervisors forward signals at once; only one per process may set forward_signals");
  TRIDENT_SYSCHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK), "pipe2 (signal forwarding)");
  struct sigaction sa{};
  sa.sa_handler = on_forwarded_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &sa, &g_previous[i]);
  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &g_previous_pipe);  // a closed stdout must not kill the supervisor
  g_forwarding = true;
}

void uninstall_forwarding() {
  if (!g_forwarding) return;
  for (int i = 0; i < 3; ++i) ::sigaction(kForwarded[i], &g_previous[i], nullptr);
  ::sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
  g_forwarding = false;
}

// Signals sent to the child's process group, falling back to the child alone.
void signal_child(pid_t pid, int sig) {
  if (::kill(-pid, sig) < 0) ::kill(pid, sig);
}

// In the forked child: async-signal-safe calls only (the parent may have threads).
[[noreturn]] void child_setup_and_run(const ChildSpec& spec, pid_t parent, bool kill_on_parent_death, int devnull,
                                      int out_fd, int err_fd, int exec_err_fd, const char* path, char* const* argv,
                                      char* const* envp, const cpu_set_t* cpus) {
  ::setpgid(0, 0);
  if (cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) {
    int err = -errno;  // negative: the binding failed, not the exec
    [[maybe_unused]] ssize_t n = ::write(exec_err_fd, &err, sizeof err);
    ::_exit(127);
  }
  if (kill_on_parent_death) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
  }
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(devnull, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  if (spec.body) {
    ::close(exec_err_fd);  // (after the binding: its failure is reported through it)
    int code = 1;
    try {
      code = spec.body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child body threw: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "child body threw a non-std exception\n");
    }
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);  // nothing of ours leaks into the program but 0, 1, 2
  ::execve(path, argv, envp);
  int err = errno;
  [[maybe_unused]] ssize_t n = ::write(exec_err_fd, &err, sizeof err);
  ::_exit(127);
}

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev == nullptr) return fmt::format("signal {}", sig);
  return std::string("SIG") + abbrev;
}

std::string find_executable(const std::string& program, const std::string& path) {
  if (program.empty()) return {};
  if (program.find('/') != std::string::npos) return program;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    // An empty PATH entry means the current directory.
    std::string candidate = (end > start ? path.substr(start, end - start) : std::string(".")) + "/" + program;
    struct stat st{};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return {};
}

std::string ChildResult::describe() const {
  if (exited) return fmt::format("exited with code {}", exit_code);
  if (term_signal != 0) return fmt::format("was killed by signal {} ({})", term_signal, signal_name(term_signal));
  return "ended with an unknown status (it was reaped elsewhere)";
}

bool SuperviseResult::ok() const {
  if (first_failure >= 0 || received_signal != 0 || timed_out) return false;
  for (const auto& c : children) {
    if (!c.ok()) return false;
  }
  return true;
}

Supervisor::Supervisor(SuperviseOptions options) : options_(std::move(options)) {
  if (options_.forward_signals) install_forwarding();
}

Supervisor::~Supervisor() {
  for (auto& c : children_) {
    if (c.running) {
      signal_child(c.result.pid, SIGKILL);
      int status = 0;
      while (::waitpid(c.result.pid, &status, 0) < 0 && errno == EINTR) {
      }
      c.running = false;
    }
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].out.fd >= 0) ::close(children_[i].out.fd);
    if (children_[i].err.fd >= 0) ::close(children_[i].err.fd);
  }
  if (devnull_ >= 0) ::close(devnull_);
  if (options_.forward_signals) uninstall_forwarding();
}

int Supervisor::spawn(const ChildSpec& spec) {
  TRIDENT_CHECK(!ran_, InvalidArgument, "Supervisor::spawn after run(); create a new Supervisor");
  std::string path;
  std::vector<char*> argv;
  std::vector<char*> envp;
  if (!spec.body) {
    TRIDENT_CHECK(!spec.argv.empty() && !spec.argv[0].empty(), InvalidArgument,
                  "no command to run; give the program and its arguments");
    std::string search = "/usr/local/bin:/usr/bin:/bin";
    for (const auto& kv : spec.env) {
      if (kv.rfind("PATH=", 0) == 0) search = kv.substr(5);
    }
    path = find_executable(spec.argv[0], search);
    TRIDENT_CHECK(!path.empty(), IoError, "cannot execute '{}': command not found (searched PATH)", spec.argv[0]);
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  if (devnull_ < 0) TRIDENT_SYSCHECK(devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC), "open /dev/null");
  int out[2], err[2], exec_err[2];
  TRIDENT_SYSCHECK(::pipe2(out, O_CLOEXEC), "pipe2 (child stdout)");
  if (::pipe2(err, O_CLOEXEC) < 0) {
    int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    TRIDENT_THROW(IoError, "pipe2 (child stderr): {}", detail::errno_string(e));
  }
  if (::pipe2(exec_err, O_CLOEXEC) < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    TRIDENT_THROW(IoError, "pipe2: {}", detail::errno_string(e));
  }
  cpu_set_t cpus;  // built here: the forked child only calls sched_setaffinity
  CPU_ZERO(&cpus);
  for (int c : spec.cpus) {
    TRIDENT_CHECK(c >= 0 && c < CPU_SETSIZE, InvalidArgument, "cannot bind a child to CPU {}: CPUs are 0..{}", c,
                  CPU_SETSIZE - 1);
    CPU_SET(c, &cpus);
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // buffered output must not be written twice by a body child
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    child_setup_and_run(spec, parent, options_.kill_on_parent_death, devnull_, out[1], err[1], exec_err[1],
                        path.c_str(), argv.data(), envp.data(), spec.cpus.empty() ? nullptr : &cpus);
  }
  int fork_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  ::close(exec_err[1]);
  if (pid < 0) {
    for (int fd : {out[0], err[0], exec_err[0]}) ::close(fd);
    TRIDENT_THROW(IoError, "fork: {}", detail::errno_string(fork_errno));
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_err[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_err[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ::close(out[0]);
    ::close(err[0]);
    if (exec_errno < 0) {
      TRIDENT_THROW(IoError, "cannot bind '{}' to CPUs {}: sched_setaffinity: {}; run with --bind none",
                    spec.body ? std::string("child") : spec.argv[0], fmt::join(spec.cpus, ","),
                    detail::errno_string(-exec_errno));
    }
    TRIDENT_THROW(IoError, "cannot execute '{}' ({}): {}", spec.argv[0], path, detail::errno_string(exec_errno));
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  Child c;
  c.tag = spec.tag;
  c.out.fd = out[0];
  c.err.fd = err[0];
  c.result.pid = pid;
  c.running = true;
  children_.push_back(std::move(c));
  if (stopping_) {  // a stop is in progress: the newcomer is stopped too
    signal_child(pid, killed_ ? SIGKILL : SIGTERM);
    children_.back().result.sent_stop = true;
  }
  return static_cast<int>(children_.size() - 1);
}

void Supervisor::stop_all(int sig) {
  for (auto& c : children_) {
    // Groups whose pipes are still open may hold the child's own subprocesses even after it ended.
    if (c.running || c.out.fd >= 0 || c.err.fd >= 0) signal_child(c.result.pid, sig);
    if (c.running) c.result.sent_stop = true;
  }
  stop_signal_ = sig;
  if (sig == SIGKILL) {
    killed_ = true;
  } else if (!stopping_) {
    kill_deadline_ = now_seconds() + options_.grace_seconds;
  }
  stopping_ = true;
}

void Supervisor::emit_line(size_t index, StreamKind kind, std::string_view line) {
  auto& c = children_[index];
  auto& tail = c.result.tail;
  if (options_.tail_lines > 0) {
    tail.emplace_back(line.substr(0, kTailLineBytes));
    while (tail.size() > options_.tail_lines) tail.pop_front();
  }
  if (options_.on_line) {
    options_.on_line(static_cast<int>(index), kind, line);
    return;
  }
  std::string text;
  text.reserve(c.tag.size() + line.size() + 1);
  text.append(c.tag).append(line).push_back('\n');
  write_all(kind == StreamKind::kStdout ? STDOUT_FILENO : STDERR_FILENO, text.data(), text.size());
}

void Supervisor::handle_readable(size_t index, StreamKind kind) {
  Stream& s = kind == StreamKind::kStdout ? children_[index].out : children_[index].err;
  if (s.fd < 0) return;
  char buf[kReadChunk];
  ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0) {
    s.buffer.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (;;) {
      size_t nl = s.buffer.find('\n', start);
      if (nl == std::string::npos) break;
      emit_line(index, kind, std::string_view(s.buffer).substr(start, nl - start));
      start = nl + 1;
    }
    s.buffer.erase(0, start);
    if (s.buffer.size() >= kMaxLineBytes) {
      emit_line(index, kind, s.buffer);
      s.buffer.clear();
    }
    return;
  }
  // End of file (or a read error): the last line may lack its newline.
  if (!s.buffer.empty()) {
    emit_line(index, kind, s.buffer);
    s.buffer.clear();
  }
  ::close(s.fd);
  s.fd = -1;
}

void Supervisor::close_streams(size_t index) {
  for (StreamKind kind : {StreamKind::kStdout, StreamKind::kStderr}) {
    Stream& s = kind == StreamKind::kStdout ? children_[index].out : children_[index].err;
    if (s.fd < 0) continue;
    if (!s.buffer.empty()) {
      emit_line(index, kind, s.buffer);
      s.buffer.clear();
    }
    ::close(s.fd);
    s.fd = -1;
  }
}

void Supervisor::reap() {
  for (size_t i = 0; i < children_.size(); ++i) {
    auto& c = children_[i];
    if (!c.running) continue;
    int status = 0;
    pid_t r = ::waitpid(c.result.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    c.running = false;
    if (r == c.result.pid) {
      if (WIFEXITED(status)) {
        c.result.exited = true;
        c.result.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        c.result.term_signal = WTERMSIG(status);
      }
    }
    // Failed on its own: not stopped by us, or killed by a signal we did not send (it died in the same
    // instant as the peer whose failure stopped the job). A death by a signal is the cause of the failures
    // it provokes (peers exiting with an error that names it), so it replaces a first failure that is
    // only an exit code.
    const bool own = !c.result.sent_stop || (c.result.term_signal != 0 && c.result.term_signal != stop_signal_);
    if (c.result.ok() || !own) continue;
    if (first_failure_ < 0 ||
        (c.result.term_signal != 0 && children_[static_cast<size_t>(first_failure_)].result.exited)) {
      first_failure_ = static_cast<int>(i);
      if (options_.stop_on_failure && !stopping_) stop_all(SIGTERM);
    }
  }
}

SuperviseResult Supervisor::run() {
  TRIDENT_CHECK(!ran_, InvalidArgument, "Supervisor::run called twice");
  ran_ = true;
  const double start = now_seconds();
  double drain_deadline = -1;
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, StreamKind>> owners;
  for (;;) {
    reap();
    if (options_.on_tick) options_.on_tick(*this);
    const double now = now_seconds();
    if (options_.timeout_seconds && !stopping_ && now - start >= *options_.timeout_seconds) {
      timed_out_ = true;
      stop_all(SIGTERM);
    }
    if (stopping_ && !killed_ && now >= kill_deadline_) stop_all(SIGKILL);

    bool any_running = false;
    bool any_open = false;
    for (const auto& c : children_) {
      any_running |= c.running;
      any_open |= c.out.fd >= 0 || c.err.fd >= 0;
    }
    if (!any_running) {
      if (!any_open) break;
      if (drain_deadline < 0) drain_deadline = now + kDrainSeconds;
      if (now >= drain_deadline) {
        // Something the children started still holds their pipes: stop waiting for it.
        for (size_t i = 0; i < children_.size(); ++i) close_streams(i);
        break;
      }
    }

    fds.clear();
    owners.clear();
    if (g_forwarding && options_.forward_signals) {
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      owners.emplace_back(SIZE_MAX, StreamKind::kStdout);
    }
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].out.fd >= 0) {
        fds.push_back({children_[i].out.fd, POLLIN, 0});
        owners.emplace_back(i, StreamKind::kStdout);
      }
      if (children_[i].err.fd >= 0) {
        fds.push_back({children_[i].err.fd, POLLIN, 0});
        owners.emplace_back(i, StreamKind::kStderr);
      }
    }
    int wait_ms = kPollMillis;
    if (!any_running) wait_ms = std::max(1, static_cast<int>((drain_deadline - now) * 1000));
    int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready <= 0) continue;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (owners[k].first == SIZE_MAX) {
        unsigned char sigs[64];
        ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof sigs);
        for (ssize_t j = 0; j < n; ++j) {
          if (received_signal_ == 0) {
            received_signal_ = sigs[j];
            stop_all(sigs[j]);
          } else {
            stop_all(SIGKILL);  // asked twice: no more grace
          }
        }
        continue;
      }
      handle_readable(owners[k].first, owners[k].second);
    }
  }

  SuperviseResult result;
  result.first_failure = first_failure_;
  result.received_signal = received_signal_;
  result.timed_out = timed_out_;
  for (const auto& c : children_) result.children.push_back(c.result);
  return result;
}

}  // namespace trident::launch
