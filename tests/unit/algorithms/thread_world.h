// ThreadWorld: a test double of AlgoContext where ranks are std::threads of one process. It exists to
// test the algorithms' logic independently of the transports, and it enforces the AlgoContext contract
// more strictly than any engine needs:
//   - the k-th message rank a posts to rank b is matched with the k-th receive rank b posts from rank a,
//     and their step tags must be equal (so the algorithm is correct both for engines that match by
//     posting order and for engines that match by step);
//   - the receive's size (bytes, or count * element size for irecv_reduce) must equal the send's;
//   - a send buffer must not change between isend() and the wait() that completes it;
//   - at the end of a collective, every message sent was received, every receive was matched, and every
//     request was waited on;
//   - a rank never sends to itself; peers are in range; scratch contents are garbage at entry and each
//     scratch slot is requested at most once per collective;
//   - when every live rank is blocked in wait() and nothing can complete, that is a deadlock, reported at
//     once with what each rank waits for (no timing involved).
// Transfers happen under one global lock, on whichever thread posts the second half of a match, so a
// receive may complete while its owner is doing something else (as with a real engine), but receives
// into one buffer are completed one at a time (as the engine does).
//
// Ownership: a ThreadWorld owns its contexts and scratch for the duration of run(). Blocking: run()
// returns when every rank's body has returned or thrown. Thread-safety: run() is not reentrant.
// Timeouts: a wait() blocked for more than 60 s fails the run (a safety net; deadlocks are detected
// without it).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "trident/comm/algorithms/algorithm.h"

namespace trident::testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int size) : size_(size) {}
  int size() const { return size_; }
  // What every context's chunk_bytes() returns (0: let the algorithm choose).
  void set_chunk_bytes(size_t bytes) { chunk_bytes_ = bytes; }

  struct Result {
    std::vector<std::string> errors;  // contract violations and exceptions, one line each
    size_t messages = 0;              // sends posted by all ranks
    bool ok() const { return errors.empty(); }
    std::string summary() const;  // the errors joined by newlines
  };
  // Runs body(ctx) on size() threads, thread i being rank i; then checks for leftovers.
  Result run(const std::function<void(AlgoContext&)>& body);

 private:
  int size_;
  size_t chunk_bytes_ = 0;
};

}  // namespace trident::testing
