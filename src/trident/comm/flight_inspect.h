// Reading flight-recorder dumps (comm/flight_recorder.h) after a job hung or failed: load every rank's
// rank_<R>.json from a folder, merge the rings by group, and say what happened in words (`trident inspect`):
// which rank never entered which collective while which ranks waited on it, which collective mismatched
// (what each rank issued), which calls failed with which error, and which rank arrived last over the
// recent collectives. The same records become a Chrome trace (chrome://tracing, ui.perfetto.dev).
//
// Pure functions over files: no process group, no threads. Errors: IoError naming the folder or the file
// (missing folder, no dumps, unreadable, truncated or corrupt JSON, a field of the wrong type).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident {

struct DumpedCall {
  uint64_t id = 0, seq = 0;  // seq 0: point-to-point
  std::string op, dtype, redop, algo, state, error_type, error;
  int root = -1, peer = -1;
  uint32_t tag = 0;
  uint64_t count = 0, bytes = 0;
  int64_t enqueue_us = 0, start_us = 0, end_us = 0;  // wall clock; 0 = not reached
};

struct DumpedGroup {
  std::string name;
  int generation = 0;
  int rank = 0, size = 0;   // this rank in the group
  std::vector<int> ranks;   // global rank of each group rank (empty: the group made no call)
  std::string backend;
  uint64_t issued = 0;      // calls issued since the group was made (the ring keeps the last `capacity`)
  uint64_t capacity = 0;
  std::vector<DumpedCall> calls;  // oldest first
};

struct RankDump {
  std::string file;
  int rank = -1;  // global rank
  int pid = 0;
  std::string host, reason;
  int64_t dump_time_us = 0;
  std::vector<DumpedGroup> groups;
};

// Parses one dump; `file` names it in errors.
RankDump parse_flight_dump(const std::string& text, const std::string& file);
// Every rank_*.json / pid_*.json in `dir` (or in dir/flight_recorder, a run's out dir), by rank.
std::vector<RankDump> load_flight_dumps(const std::string& dir);

struct InspectFinding {
  // kHang: a rank never entered a collective others wait in (or left no dump); kMismatch: ranks issued
  // different calls at one sequence number; kFailure: every rank entered and it failed; kInFlight: a call
  // was running at a dump and nothing shows it stuck (a live job's SIGUSR1); kSlowest: arrival lateness.
  enum class Kind { kHang, kMismatch, kFailure, kInFlight, kSlowest };
  Kind kind;
  std::string group;
  uint64_t seq = 0;        // the collective concerned (0: none)
  std::vector<int> ranks;  // global ranks it names as the cause (the rank that never entered, the slowest)
  std::string text;        // one or two sentences
};

struct InspectReport {
  std::vector<std::string> dumps;        // one line per dump: rank, host, why it was written
  std::vector<InspectFinding> findings;  // what happened, most important first
  std::string text() const;              // the dumps, then the findings, as `trident inspect` prints them
};

// Merges the dumps and explains them; `last_k`: how many recent collectives the lateness ranking uses.
InspectReport inspect_flight_dumps(const std::vector<RankDump>& dumps, int last_k = 50);
// The merged records as a Chrome trace: one process per rank, one thread per group.
void write_flight_trace(const std::vector<RankDump>& dumps, const std::string& path);

}  // namespace trident
