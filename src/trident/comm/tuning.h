// Measured algorithm selection, for machines where the cost model's choice is not the fastest. `trident bench
// comm --tune FILE` measures every algorithm of every collective on this machine and writes a tuning file; a
// process group whose (transport, world size) the file covers picks, per call, the algorithm with the least
// measured time instead of the one the alpha-beta cost model (comm/cost/cost.h) predicts.
//
// For each (op, algorithm) the file records the median (p50) latency of the blocking call at a few sizes (by
// default 8 B, 128 B, 2 KiB, 32 KiB, 512 KiB, 8 MiB; size as size_bytes() in comm/collective.h counts
// it). predict() interpolates between the two nearest measured sizes linearly in log(bytes) and log(time);
// below the smallest size it takes the smallest size's time; above the largest it scales the largest size's
// time in proportion to bytes. docs/ARCHITECTURE.md ("Where the numbers come from") says why a table and
// not a fitted alpha and beta.
//
// File (JSON): {"version": 1, "host": ..., "date": ..., "transport": "shm"|"tcp"|"shm+tcp",
//   "world_size": N, "dtype": "float32",
//   "entries": [{"op": "all_reduce", "algo": "ring", "bytes": [8, ...], "p50_us": [3.1, ...]}, ...]}
// `bytes` strictly ascending, times positive. A file that cannot be read or parsed, or breaks these rules,
// is an InvalidArgument naming the file and the fault. A group whose transport or world size differs from
// the file's logs one warning per (transport, world size) and uses the cost model.
//
// Ownership: a TuningTable is a value; tuning_from_env() returns a shared, immutable table. Blocking:
// file I/O only when a table is loaded. Thread-safety: tuning_from_env() and the warning are guarded by a
// mutex; a const TuningTable may be read from any thread. Timeouts: none (no communication).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trident/comm/types.h"

namespace trident {

struct TuningPoint {
  double bytes = 0;    // size as size_bytes() (comm/collective.h) counts it
  double seconds = 0;  // measured p50 of the blocking call
};

struct TuningEntry {
  OpKind op = OpKind::kAllReduce;
  Algo algo = Algo::kRing;
  std::vector<TuningPoint> points;  // bytes strictly ascending, at least one
};

struct TuningTable {
  int version = 1;
  std::string host;
  std::string date;
  std::string transport;  // "shm", "tcp" or "shm+tcp"
  int world_size = 0;
  std::string dtype = "float32";
  std::vector<TuningEntry> entries;

  const TuningEntry* find(OpKind op, Algo algo) const;
  // Predicted seconds of (op, algo) at `bytes` (see the header comment); nullopt when not measured.
  std::optional<double> predict(OpKind op, Algo algo, double bytes) const;
  // Whether this table applies to a group of `world` ranks over `transport`.
  bool covers(const std::string& transport, int world) const { return transport == this->transport && world == world_size; }
};

std::string tuning_to_json(const TuningTable& t);
// `source` names the text's origin in errors (a file path).
TuningTable parse_tuning(const std::string& text, const std::string& source);
TuningTable load_tuning_file(const std::string& path);
void save_tuning_file(const std::string& path, const TuningTable& t);

// The table TRIDENT_TUNING_FILE names, parsed once per path per process; nullptr when the variable is
// unset. Throws InvalidArgument (naming the file) when it is missing or invalid.
std::shared_ptr<const TuningTable> tuning_from_env();
// Logs, once per process per (transport, world), that `t` does not cover such a group.
void warn_tuning_not_covered(const TuningTable& t, const std::string& path, const std::string& transport, int world);

}  // namespace trident
