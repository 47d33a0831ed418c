// `trident bench comm`: the collective benchmark in nccl-tests' terms (size, count, type, redop, root, then
// per out-of-place / in-place run: time, algbw, busbw, #wrong, latency min/p50/p99).
//
// Ownership: run_comm_bench() allocates its buffers once at the largest size (pre-faulted, reused for every
// row) and frees them on return; the process group is the caller's. Blocking: runs collectives on `pg`
// (every rank of the group must call it with the same options). Thread-safety: one call per group at a
// time. Timeouts: each collective uses the group's deadline (set with --timeout); a hang anywhere surfaces
// as the comm layer's TimeoutError / PeerDiedError, which run_comm_bench() lets propagate.
//
// Definitions (as nccl-tests' doc/PERFORMANCE.md):
//   size     the bytes nccl-tests counts: all_gather/gather the gathered output, reduce_scatter/scatter and
//            all_to_all the whole per-rank buffer (count-per-rank x world x element size), otherwise the
//            per-rank buffer; count = size / element size.
//   time     per-iteration wall time of the blocking call on each rank (a barrier before the timed loop);
//            the row reports the max over ranks of each rank's mean; min/p50/p99 are each the max over
//            ranks of that rank's percentile.
//   algbw    size / time (GB/s, 1 GB = 1e9 B);  busbw = algbw x the collective's bus factor
//            (bus_factor in comm/collective.h, nccl-tests' factors).
//   --check  every element of every timed iteration is compared with the expected value computed
//            independently on each rank (bench/verifiable.h); inputs are refilled and outputs poisoned before
//            each iteration, untimed, with a barrier after. #wrong is summed over ranks.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trident/comm/tuning.h"
#include "trident/comm/types.h"

namespace trident {
class ProcessGroup;
}

namespace trident::bench {

struct CommBenchOptions {
  std::vector<OpKind> ops = {OpKind::kAllReduce};
  int64_t min_bytes = 8;
  int64_t max_bytes = 64ll << 20;
  int64_t step_factor = 2;
  int iters = 20;
  int warmup = 5;
  DType dtype = DType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  // Algorithms to run: {kAuto} by default; `algo_all` runs every algorithm of each op, then auto.
  std::vector<Algo> algos = {Algo::kAuto};
  bool algo_all = false;
  std::string transport = "auto";  // what was asked for (the group's summary says what was built)
  bool check = false;
  std::string json_path;  // "" = no JSON
  bool inplace = true;
  bool outofplace = true;
  // --buffers: "ordinary" (private anonymous memory, as most callers have) or "shared" (the group's
  // registered memory, ProcessGroup::alloc_shared: zero copy on one host; refused where the group has none).
  std::string buffers = "ordinary";
  // --device: where the buffers of the timed calls live: "cpu", or "cuda" (device memory of this rank's GPU,
  // comm/device_memory.h; inputs are written and outputs checked through host copies outside the timed calls).
  std::string device = "cpu";
  std::optional<double> timeout_s;
  // --tune FILE: rank 0 writes a tuning file (comm/tuning.h) from the p50 latency of every forced-algorithm
  // record (in-place where both placements ran). "" = none.
  std::string tune_path;
};

// One measured (row, placement).
struct BenchRecord {
  OpKind op = OpKind::kAllReduce;
  Algo algo = Algo::kAuto;            // the algorithm that ran (auto resolved)
  bool algo_forced = false;           // false: chosen by the backend
  bool inplace = false;
  size_t size = 0;                    // bytes, nccl-tests' definition
  size_t count = 0;                   // size / element size
  size_t count_per_rank = 0;          // the count argument of the call
  DType dtype = DType::kFloat32;
  bool has_dtype = true;              // false for barrier
  ReduceOp redop = ReduceOp::kSum;
  bool has_redop = false;             // false for ops that do not reduce
  int root = -1;                      // -1 for ops without a root
  double time_us = 0;
  double algbw = 0;                   // GB/s
  double busbw = 0;                   // GB/s
  std::optional<uint64_t> wrong;      // unset without --check
  double lat_min_us = 0, lat_p50_us = 0, lat_p99_us = 0;
  int world_size = 1;
  std::string transport;              // "shm", "tcp", "shm+tcp" or "none" (one rank)
  std::string transport_requested;    // auto | shm | tcp
  std::string buffers = "ordinary";   // ordinary | shared (--buffers)
};

struct CommBenchResult {
  std::vector<BenchRecord> records;
  uint64_t wrong = 0;           // total over every record (0 without --check)
  double avg_busbw = 0;         // mean busbw over the records with a size (nccl-tests' "Avg bus bandwidth")
};

// Parses "--op": a name, a comma-separated list, or "all" (every collective the benchmark knows, in
// nccl-tests' order). Throws InvalidArgument naming `flag` and the allowed values.
std::vector<OpKind> parse_ops(const std::string& text, const std::string& flag = "--op");
// Parses "--algo": a name or comma list (auto included), or "all". Throws InvalidArgument naming `flag`.
std::vector<Algo> parse_algos(const std::string& text, bool* all, const std::string& flag = "--algo");
// The collectives `--op all` runs.
const std::vector<OpKind>& bench_ops();
// Checks the options against each other and the world size; throws InvalidArgument naming the flag.
void validate(const CommBenchOptions& o, int world);

// Runs the benchmark on this rank. Rank 0 writes the table to `out` (other ranks write nothing) and the
// JSON file when asked. Every rank returns the same result.
CommBenchResult run_comm_bench(ProcessGroup& pg, const CommBenchOptions& o, std::ostream& out);

// The tuning table (comm/tuning.h) that `records` measure: per (op, forced algorithm), the p50 latency at
// each size (the in-place record where both placements ran). Auto records are left out.
TuningTable tuning_from_records(const std::vector<BenchRecord>& records, const std::string& transport, int world);
// Options of `bench comm --tune`: every collective with more than one algorithm, every algorithm, sizes
// 8 B .. 8 MiB by factors of 16, in place, few iterations. The CLI applies them before the user's flags.
void apply_tune_defaults(CommBenchOptions& o);

// One record in the --json format (its fields named as above, op/algo/dtype/redop by name).
nlohmann::ordered_json record_json(const BenchRecord& r);
// Writes `records` as a JSON array, one record per line (the --json format; `bench comm --html --peer
// LABEL=FILE` reads it, bench/bench_page.h).
void write_json(const std::string& path, const std::vector<BenchRecord>& records);

}  // namespace trident::bench
