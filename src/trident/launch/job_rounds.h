// JobRounds: how the launchers of one job (one per node) agree on its rounds through the job's store, as
// torchrun's elastic agent does with a static rendezvous. Round 0 is the first start; each restart is the
// next round. A round starts on a node only once every node has joined it, so all nodes are always in the
// same round and agree on the restart count (the round number); every key of round r lives under
// "trident_launch/round<r>/", so nothing a failed round left behind is read by the next.
//
// Keys (under "trident_launch/"): round<r>/node<k> = node k's host (it joined round r); round<r>/failed = why
// round r failed (the first failure wins), round<r>/killed = the first rank death by a signal (the cause of
// the failures it provokes, as a rule: peers exiting with an error that names it; read in place of
// round<r>/failed when present, as the Supervisor does within a node); round<r>/ok/node<k> = node k's ranks all exited 0 in round r;
// abort = why the job was stopped for good (a launcher signalled, a rendezvous given up): no round follows.
//
// Ownership: owns its store client, made by `connect` on first use and made again after any failed request
// (a client whose connection broke stays broken), so a node whose link was cut rejoins once it is back.
// Blocking: join() and await_success() poll the store until their deadline; failure() and the publish calls
// are single requests bounded by the client's request deadline. Thread-safety: none; the launcher's thread.
// Errors: join() throws TimeoutError (missing = the node ranks that did not join; seq = the round) when its
// deadline passes, StoreError when the store could not be reached until then; the publish calls never throw.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/store/store.h"

namespace trident::launch {

struct RoundsOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string host;            // this node's name in others' messages (TRIDENT_HOST_ID, else the hostname)
  double join_timeout = 600;   // every node must join a round within this many seconds
  double request_timeout = 10;  // connecting again during a round, and each request (the client's deadline)
  double poll_seconds = 0.05;  // how often a waiting launcher looks at the store
  std::string store_where;     // "node 0's store at ADDR:PORT", for messages
};

// Why a round stopped, as a launcher reads it from the store.
struct RoundFailure {
  std::string why;     // "node 1: rank 3 (pid 77) exited with code 7"; empty: no failure known
  bool final = false;  // the job was stopped for good (abort): no restart
};

class JobRounds {
 public:
  // Opens a client to the job's store, waiting for it up to `timeout` seconds; throws StoreError.
  using Connect = std::function<std::unique_ptr<Store>(double timeout)>;
  JobRounds(RoundsOptions options, Connect connect);

  // Joins `round` and waits until every node has joined it. Returns "" then, or why the job was stopped when
  // another node aborted it meanwhile. Round 0's first connection is not retried past its own wait (a
  // wrong token or address is an error at once); later rounds keep reconnecting until the deadline. Prints
  // one line naming the nodes still missing when the wait grows long.
  std::string join(int round);
  // While `round` runs: its cause (the first death by a signal, else the first failure) or the job's abort,
  // if any node published one. Throws StoreError when the store does not answer.
  RoundFailure failure(int round);
  // Records this node's failure of `round` ("node K: " + what); the first of the round wins, and the first
  // death by a signal (`killed`) wins over it.
  void publish_failure(int round, const std::string& what, bool killed = false);
  // Stops the job for good ("node K: " + what); every launcher reads it instead of restarting.
  void publish_abort(const std::string& what);
  // This node's ranks all exited 0 in `round`: marks that and waits until every node's did (returns an empty
  // failure), a failure or abort is published (returns it), or `timeout` passes (returns an empty failure
  // and sets `unfinished` to the nodes not heard from).
  RoundFailure await_success(int round, double timeout, std::vector<int>* unfinished);
  // "node 2 (host emu2)": the host is what it joined round 0 with, when known.
  std::string node_name(int node);
  // The nodes whose key round<r>/<what><k> is absent ("node" or "ok/node"), best effort.
  std::vector<int> absent(int round, const std::string& what);
  // The client (connected on demand); throws StoreError. For the end-of-job barrier.
  Store& store(double timeout);
  void drop_store() { store_.reset(); }

  static std::string key(int round, const std::string& what);
  static constexpr const char* kAbortKey = "trident_launch/abort";

 private:
  RoundsOptions o_;
  Connect connect_;
  std::unique_ptr<Store> store_;
  std::vector<std::string> hosts_;  // each node's host from round 0 ("" until read)
};

// "2", "1, 3" or "0, 1, 2, ... (5 nodes)" for messages.
std::string node_list(const std::vector<int>& nodes);

}  // namespace trident::launch
