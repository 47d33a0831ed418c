// Event-driven simulator of training steps of a parallel layout on a cluster.
//
// Every simulated rank has a compute stream and a communication stream; tasks run in stream order once
// their dependencies are done. Collectives start when every simulated member has reached them, spend
// their alpha (latency) term, then move their per-rank volume as a fluid flow over the members' links;
// a link's bandwidth is split evenly among the flows crossing it, and a flow goes at the pace of its
// most loaded link. Point-to-point transfers (pipeline activations and gradients) are flows from the
// sender's out-link to the receiver's in-link. Volumes and latencies come from the same cost model as
// the planner (comm_cost.h: the native backend's cost model), compute times from the same FLOP counts (model.h).
//
// Symmetry: without stragglers or degraded links every tensor- and data-parallel peer of a pipeline stage
// behaves identically, so only one representative rank per stage is simulated (exact under the model:
// each rank owns its links). With a straggler or a degraded link every rank is simulated.
//
// simulate() is a pure function of its options (plus the optional trace file it writes): no shared
// state, thread-safe, never blocks on anything but the trace file.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/plan/planner.h"

namespace trident::plan {

struct Straggler {
  int rank = 0;
  double factor = 1;  // compute takes factor x longer
};
struct DegradedLink {
  int node = 0;
  double factor = 1;  // the node's inter-node links run at factor x bandwidth
};

// One action of a pipeline schedule: forward or backward of microbatch `mb` on model chunk `chunk`.
struct PipelineAction {
  bool fwd;
  int mb;
  int chunk;
};
// The program of pipeline stage `stage` of `pp` for `m` microbatches: the pipeline engine's own schedule
// (parallel::make_schedule: GPipe, 1F1B, or interleaved 1F1B over `v` model chunks per stage, which needs
// m % pp == 0); with one stage, every forward then every backward. Throws InvalidArgument as make_schedule.
std::vector<PipelineAction> pipeline_schedule(Schedule s, int pp, int stage, int m, int v);

struct SimOptions {
  TrainSpec train;
  ClusterSpec cluster;
  Layout layout;
  int steps = 1;
  double bucket_bytes = 25e6;  // DDP / ZeRO-1/2 gradient bucket
  Algo algorithm = Algo::kAuto;  // for DP collectives, where the op has it (comm/types.h names)
  std::vector<Straggler> stragglers;
  std::vector<DegradedLink> degraded;
  bool exploit_symmetry = true;
  std::string trace_path;     // Chrome trace JSON; empty = none
  int trace_max_ranks = 64;   // sample of ranks traced when more are simulated
};

struct SimResult {
  double step_time_s = 0;  // makespan / steps
  double tokens_per_s = 0;
  double mfu = 0;
  double tflops_per_gpu = 0;
  int simulated_ranks = 0;
  bool used_symmetry = false;
  long events = 0;
  double compute_busy_s = 0;  // per step, busiest simulated rank
  double comm_busy_s = 0;     // per step, that rank's communication stream occupied (transfers + waits for peers)
  int slowest_rank = 0;
  nlohmann::json to_json() const;
};

// Throws InvalidArgument on a bad layout, straggler rank or node index.
SimResult simulate(const SimOptions& opt);

// Parses "rank:R:factor" / "node:N:factor"; throws InvalidArgument naming `flag`.
Straggler parse_straggler(const std::string& s, const std::string& flag);
DegradedLink parse_degraded(const std::string& s, const std::string& flag);

struct ScalingPoint {
  int gpus = 0;
  Layout layout;
  SimResult result;
  double efficiency = 0;  // throughput(N) / (N/N0 x throughput(N0))
};
// Runs simulate() over `gpu_counts` keeping TP and PP and growing DP. Strong scaling keeps the global
// batch (each DP rank gets global/DP sequences, split into microbatches of the layout's size when PP>1);
// weak scaling keeps the per-DP-rank batch. Counts that do not divide are skipped.
std::vector<ScalingPoint> scaling_sweep(const SimOptions& base, const std::vector<int>& gpu_counts, bool strong);

}  // namespace trident::plan
