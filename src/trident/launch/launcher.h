// trident launch: start the local ranks of a job (torchrun's role), host the rendezvous store on node 0,
// forward their output, and turn the first failure into a clear report and a prompt stop of the others.
//
// Ownership: launch() owns everything it starts (the TCPStoreServer on node 0, one child process per local
// rank) and ends all of it before returning. Blocking: launch() blocks until every rank has ended. It is
// called once per process (it installs SIGINT/SIGTERM/SIGHUP handlers for its duration and forwards those
// signals to the ranks); not thread-safe. Timeouts: none of its own on the job (ranks may run for days);
// stopping is bounded: SIGTERM, then SIGKILL after grace_seconds.
//
// Each rank's environment: the launcher's, plus
//   RANK = node_rank * nproc_per_node + LOCAL_RANK, WORLD_SIZE = nnodes * nproc_per_node,
//   LOCAL_RANK, LOCAL_WORLD_SIZE (= nproc_per_node), GROUP_RANK (= node_rank), GROUP_WORLD_SIZE (= nnodes),
//   MASTER_ADDR, MASTER_PORT (the real port when --master-port 0 picked one),
//   TRIDENT_STORE_TOKEN (inherited when set; otherwise a fresh random 128-bit hex token; required in the
//   environment when nnodes > 1, since every node must present the same one),
//   TRIDENT_STORE_HOSTED=1 on every node (the store is served by the node-0 launcher: ranks connect to it,
//   rank 0 does not host one),
//   TRIDENT_FLIGHT_RECORDER_DIR = --flight-recorder-dir when given (`trident train --nproc`: its
//   <out_dir>/flight_recorder); the failure report then says where the dumps are.
//
// CPU binding (--bind, default TRIDENT_BIND, else auto): each local rank is bound (sched_setaffinity, before
// exec, so every thread it starts inherits it) to CPUs of the launcher's own allowed set (sched_getaffinity):
//   none: the rank inherits the launcher's affinity untouched;
//   core: local rank i -> the i-th allowed CPU, round-robin when there are more ranks than CPUs;
//   auto: when local ranks <= allowed CPUs, rank i gets its own contiguous share of the allowed set
//         (allowed[i*n/p, (i+1)*n/p): one CPU each when p == n, so it equals core there, and a multi-threaded
//         rank keeps its share when p < n; one rank keeps the whole set); round-robin as core when ranks >
//         CPUs (measured faster than leaving oversubscribed ranks to the scheduler: launcher.cc).
// Why binding is the default: docs/ARCHITECTURE.md ("The life of one training step", step 2).
//
// Rounds (torchrun's elastic agent with a static rendezvous; job_rounds.h has the keys): every launcher,
// node 0's included (over loopback), takes part in the job's rounds through the store node 0 hosts. Round 0
// is the first start, each restart the next round. A launcher starts its ranks only once every node has
// joined the round (within --join-timeout, default TRIDENT_TIMEOUT), so all nodes agree on the round, which is
// the job's restart count. One node is the same mechanism with itself.
//
// Failures (a rank of any node failing on its own, not when a launcher itself is signalled): the node whose
// rank failed stops its other ranks (SIGTERM, then SIGKILL after grace_seconds) and publishes why for the
// round; every other node notices within ~0.25 s and stops its ranks the same way. A store that stops
// answering a launcher (10 s, or TRIDENT_TIMEOUT if less, per request) counts as a failure of the round on
// that node. Then, while restarts are left (--max-restarts N, up to N for the job), every launcher prints one
// line naming the failed rank (or the node and rank that stopped it), its cause and "restart k of N", and
// joins the next round: each round's ranks get TRIDENT_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT = the
// round, TRIDENT_MAX_RESTARTS / TORCHELASTIC_MAX_RESTARTS = N, and round r > 0 rendezvouses under the store
// prefix "restart<r>/" (connect_store), so no key of a failed round is visible to the next. A node whose
// ranks all exited 0 while restarts are left waits until every node's did (or one failed: then it restarts
// with the others). A launcher that cannot reach the store keeps reconnecting until the join deadline, so a
// node whose link was cut rejoins once it is back. A node missing from a round at the deadline is named
// ("node 2 (host emu2) did not join restart round 1 within 60 s") by the launchers that waited, which then
// exit 1; one that never reached the store exits 1 naming node 0's store. A signal to any launcher while its
// ranks run stops the whole job (no restart); while it waits to join a round (no rank runs then) the signal
// ends it at once, and the others name it as missing at the deadline. The store, its port and token stay the
// same across rounds.
//
// The store lives in node 0's launcher: while node 0's host is cut off, the other launchers wait (up to the
// join deadline) to rejoin and resume once it is back, but if node 0's launcher dies the store dies with it
// and every node fails naming it (torchrun's static c10d rendezvous endpoint has the same limit). Node 0
// keeps the store up after its own ranks end until every node has reported done (bounded by TRIDENT_TIMEOUT,
// or by grace + 10 s once the job failed), so other nodes' ranks never lose the store early.
//
// Several nodes (nnodes > 1): one launcher per node, all given the same --nnodes, --master-addr,
// --master-port and TRIDENT_STORE_TOKEN, and the same --max-restarts and --join-timeout.
//
// Exit status of launch() (of the last round): 0 when every rank exited 0. When a rank fails first, that
// rank's exit code, or 128 + signal when a signal killed it (as a shell reports it); one line on stderr names
// the rank, its pid and what happened (and the round's cause when it was another node's),
// followed by its last lines of output. 128 + signal when the launcher itself was stopped by
// SIGINT/SIGTERM/SIGHUP (a second signal skips the grace period). 1 when another node's failure stopped this
// node with no restart left, or a round's rendezvous failed (a node missing, the store unreachable). 127
// when the command cannot be executed. Bad options, and a store that cannot be hosted or reached at the
// start (round 0), throw (InvalidArgument, StoreError).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trident::launch {

enum class Bind { kNone, kCore, kAuto };

// "none" | "core" | "auto"; anything else throws InvalidArgument naming `what` (e.g. "--bind") and the values.
Bind parse_bind(const std::string& text, const std::string& what = "--bind");
const char* bind_name(Bind bind);
// TRIDENT_BIND parsed (auto when unset).
Bind default_bind();
// This process's allowed CPUs (sched_getaffinity), ascending. Throws IoError when the kernel refuses.
std::vector<int> allowed_cpus();
// The CPUs local rank `local_rank` of `local_ranks` is bound to under `bind`, given the launcher's allowed set;
// empty: leave the rank's affinity as inherited (none, or an auto share equal to the whole set).
std::vector<int> rank_cpus(Bind bind, const std::vector<int>& allowed, int local_rank, int local_ranks);

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;   // 0: node 0 picks a free port (other nodes learn it through port_file)
  std::string port_file;     // node 0 writes the store's port here (one line) once it listens; "" = none
  bool tag_output = false;   // prefix every output line with "[rank R] "
  double grace_seconds = 3.0;  // SIGTERM -> SIGKILL when stopping ranks
  std::optional<Bind> bind;    // CPU binding of local ranks; unset: TRIDENT_BIND (default auto)
  int max_restarts = 0;        // restart every rank of every node up to this many times after a rank fails
  // How long a launcher waits for every node to join a round (the first start and each restart); unset:
  // TRIDENT_TIMEOUT. torchrun's rdzv join_timeout.
  std::optional<double> join_timeout_seconds;
  // The job's folder of flight-recorder dumps: every rank gets TRIDENT_FLIGHT_RECORDER_DIR = it (created by
  // launch()), so a hang or a failure leaves every rank's dump in one place for `trident inspect DIR`.
  // "" = the ranks inherit the launcher's TRIDENT_FLIGHT_RECORDER_DIR, if any.
  std::string flight_recorder_dir;
  std::vector<std::string> command;  // program and arguments, run once per local rank
};

// Throws InvalidArgument naming the bad option and the fix.
void validate(const LaunchOptions& options);

// The variables launch() adds to the environment of local rank `local_rank` in restart round `restart`
// (port: the real store port).
std::vector<std::pair<std::string, std::string>> rank_environment(const LaunchOptions& options, int local_rank,
                                                                  int port, const std::string& token,
                                                                  int restart = 0);

// A fresh random 128-bit token as 32 lowercase hex digits.
std::string random_token();

// True when this process is already one rank of a launched job: the environment names a rank (trident
// launch / torchrun, mpirun or Slurm variables, as rendezvous_from_env reads them). A command that can start
// its own ranks (train --nproc, bench comm --nproc) starts none then. Throws InvalidArgument on inconsistent
// launcher variables.
bool in_launched_job();

// Runs the job; returns the process exit status described above.
int launch(const LaunchOptions& options);

}  // namespace trident::launch
