// Supervisor: spawn N child processes and supervise them until they are all gone.
//
// Used by `trident launch` (one child per local rank, each exec'ing the user's command) and usable by the
// multi-process test harness (a child may run a function instead of exec'ing a program).
//
// Ownership: a Supervisor owns its children. Each child runs in its own process group (signals go to the
// whole group, so a rank's own subprocesses are stopped with it), gets stdin from /dev/null, and has its
// stdout and stderr connected to pipes the Supervisor reads. By default a child is killed (SIGKILL) when
// the thread that spawned it dies (PR_SET_PDEATHSIG), so a crashed supervisor leaves no orphans. The
// destructor SIGKILLs and reaps any child still running.
//
// Blocking: spawn() returns once the child has exec'd (or failed to: then it throws IoError naming the
// program and the reason). run() blocks until every child has exited and its output is drained. Output is
// re-emitted one whole line per write(2), so lines of different children never interleave mid-line; a
// final line without a newline is emitted too (a newline is added). Each child's last `tail_lines` lines
// are kept for failure reports.
//
// Stopping: when a child fails (exits non-zero or dies on a signal) and stop_on_failure is set, or when
// the supervising process receives SIGINT/SIGTERM/SIGHUP (forward_signals), every remaining child gets
// SIGTERM (the received signal, when forwarding), then SIGKILL after grace_seconds. A second forwarded
// signal escalates to SIGKILL at once. Nothing waits forever: timeout_seconds (when set) stops the run, and
// output still held open by a child's own subprocesses is read for at most 1 s after the last child ended.
// on_tick (when set) runs on run()'s thread every turn of its loop and may call stop_all() for outside reasons.
//
// Thread-safety: none; one thread owns a Supervisor. Only one Supervisor at a time may forward signals
// (it installs process-wide handlers for its lifetime and restores the previous ones afterwards).
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trident::launch {

struct ChildSpec {
  // Program and arguments; argv[0] is searched in PATH unless it contains '/'. Ignored when `body` is set.
  std::vector<std::string> argv;
  // Complete environment of the child as "NAME=value" strings.
  std::vector<std::string> env;
  // When set, the forked child runs body() and exits with its return value instead of exec'ing argv
  // (for tests; body must not return into the parent's state, and an exception exits with code 1).
  std::function<int()> body;
  // Prefix of every forwarded output line (e.g. "[rank 3] "); empty for none.
  std::string tag;
  // CPUs the child is bound to (sched_setaffinity before exec or body); empty: inherit this process's.
  // spawn() throws IoError naming the CPUs when the kernel refuses the set.
  std::vector<int> cpus;
};

enum class StreamKind { kStdout, kStderr };

class Supervisor;

struct SuperviseOptions {
  double grace_seconds = 3.0;   // between SIGTERM and SIGKILL when stopping
  size_t tail_lines = 20;       // lines of each child's output kept for reports
  bool stop_on_failure = true;  // the first failure stops the others
  bool forward_signals = false; // forward SIGINT/SIGTERM/SIGHUP received by this process to the children
  bool kill_on_parent_death = true;  // PR_SET_PDEATHSIG(SIGKILL) in each child
  std::optional<double> timeout_seconds;  // stop every child when run() has lasted this long
  // Called for each complete output line (without its newline). Default: write tag + line + "\n" to this
  // process's stdout or stderr (matching the child's stream).
  std::function<void(int index, StreamKind stream, std::string_view line)> on_line;
  // Called on every turn of run()'s loop (at least every 20 ms while children run), e.g. to watch for an
  // outside reason to stop; it may call stop_all(). It should return quickly.
  std::function<void(Supervisor&)> on_tick;
};

struct ChildResult {
  pid_t pid = -1;
  bool exited = false;       // exited normally with exit_code
  int exit_code = -1;
  int term_signal = 0;       // the signal that killed it, when it did not exit normally
  bool sent_stop = false;    // the supervisor had signalled it before it ended
  std::deque<std::string> tail;  // its last lines of output (stdout and stderr in arrival order)

  bool ok() const { return exited && exit_code == 0; }
  // "exited with code 3" or "was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

struct SuperviseResult {
  std::vector<ChildResult> children;
  int first_failure = -1;    // the child that failed on its own (not stopped by us) first, or -1; a later one
                             // killed by a signal we did not send replaces one that only exited with an error
  int received_signal = 0;   // the first forwarded signal, or 0
  bool timed_out = false;    // timeout_seconds expired
  bool ok() const;           // every child exited 0 and nothing stopped the run
};

class Supervisor {
 public:
  explicit Supervisor(SuperviseOptions options = {});
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Forks a child; returns its index (0, 1, ...). Throws IoError if it cannot be started or exec'd.
  int spawn(const ChildSpec& spec);
  // Sends `sig` to every child still running and arms the SIGKILL escalation after grace_seconds.
  void stop_all(int sig);
  // Supervises until every child has ended; may be called once.
  SuperviseResult run();
  size_t size() const { return children_.size(); }
  // While running: the index of the first child that failed on its own so far (-1: none), and any child's
  // state (its result fields are final once it has ended).
  int first_failure() const { return first_failure_; }
  const ChildResult& child(size_t index) const { return children_.at(index).result; }
  bool stopping() const { return stopping_; }

 private:
  struct Stream {
    int fd = -1;
    std::string buffer;
  };
  struct Child {
    std::string tag;
    Stream out, err;
    ChildResult result;
    bool running = false;
  };
  void handle_readable(size_t index, StreamKind kind);
  void emit_line(size_t index, StreamKind kind, std::string_view line);
  void reap();
  void close_streams(size_t index);

  SuperviseOptions options_;
  std::vector<Child> children_;
  int first_failure_ = -1;
  int stop_signal_ = 0;  // the last signal stop_all sent (0: none)
  int received_signal_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  double kill_deadline_ = 0;
  bool timed_out_ = false;
  bool ran_ = false;
  int devnull_ = -1;
};

// The signal's short name: "SIGKILL", or "signal 64" when unknown.
std::string signal_name(int sig);
// The path execve() would run for `program`: itself when it contains '/', else the first executable match
// in the ':'-separated `path` list. Empty when there is none.
std::string find_executable(const std::string& program, const std::string& path);

}  // namespace trident::launch
