// `trident bench store`: many clients rendezvous through one TCPStore, as the ranks of a large job do at
// start-up, and the time it takes. Each client connects (retrying until the server listens), sets its own
// key, adds 1 to a shared counter (the client that brings it to the total sets "go"), waits for "go", reads
// the key of the next client, then joins a second counter-and-key barrier, so every request kind a
// rendezvous uses (set, add, wait on a shared key, get) runs with every client at once. Nothing may be lost:
// each client checks the value it read back, and the run checks both counters and the number of keys.
//
// Ownership: run_store_bench() starts the server in this process (on a socket bound before the clients start,
// so none can miss it), forks `procs` client processes of clients/procs threads each (one TCPStore client and
// connection per thread) and reaps them before it returns. Optionally, `stalled` raw connections each send
// half of a request frame and then hold the connection open until the end, and `vanishing` clients each send
// half of a wait request and disconnect: neither may delay the others. Blocking: until every client finished
// or `timeout` passed (then every client process is killed and the result says so). Errors: a client's
// failure (its message) is returned in the result, never thrown; a server that cannot start throws StoreError.
#pragma once

#include <iosfwd>
#include <string>

#include "trident/comm/store/store.h"

namespace trident::bench {

struct StoreBenchOptions {
  int clients = 1024;
  int procs = 8;          // client processes; clients are spread over them as threads
  int stalled = 0;        // connections that send half a frame and then go quiet
  int vanishing = 0;      // connections that send half a wait request and disconnect
  Seconds timeout = Seconds(120.0);
};

struct StoreBenchResult {
  bool ok = false;
  std::string error;           // the first failure, when !ok
  int clients = 0, procs = 0;
  double total_s = 0;          // from the fork of the clients to the last client's end
  double connect_p50_s = 0, connect_max_s = 0;      // per client: constructor (connect + authenticate)
  double rendezvous_p50_s = 0, rendezvous_max_s = 0;  // per client: set, add, wait, get, second barrier
  int64_t arrived = 0, departed = 0;  // the two shared counters at the end (each must equal clients)
  int64_t keys = 0;                   // keys in the store at the end
};

StoreBenchResult run_store_bench(const StoreBenchOptions& o);
// One line per figure, for the CLI; JSON with every field when json is true.
void print_store_bench(std::ostream& out, const StoreBenchResult& r, bool json);

}  // namespace trident::bench
