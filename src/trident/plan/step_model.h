// The model of one training step of this process, from calibrated figures: what `trident train` prints
// before it trains ("prediction: ...") and the ratios it prints beside the measured figures after. The
// calibration itself runs on the real model and group (train/prediction.h); everything here is arithmetic
// on its results, shared with the planner (exposed_after_overlap, model.h's activations and FLOPs,
// comm_cost.h's bytes per rank). docs/ARCHITECTURE.md ("The model of step time") gives the reasoning.
//
// Ownership: plain values. Blocking: none. Thread-safety: pure functions. Timeouts: none. Errors:
// predict, predict_model_parallel, replay_shared_cores and schedule_peak_activation_bytes throw
// InvalidArgument naming the input that does not fit.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/parallel/schedule.h"

namespace trident::plan {

// Communication that `backward_s` of compute can hide: what does not fit under it, and at least the last
// bucket (`last_bucket_fraction` of the volume), which starts only when backward ends. The planner and the
// run-time prediction both charge data-parallel gradient collectives this way.
double exposed_after_overlap(double comm_s, double backward_s, double last_bucket_fraction);

// ---- data parallelism (one model replica per rank) ----

struct Calibration {
  double forward_backward_s = 0;     // one forward+backward of one micro-batch (B x T)
  double optimizer_s_per_param = 0;  // AdamW + gradient-norm time per parameter
  double allreduce_bus_Bps = 0;      // bytes sent per rank / all-reduce time (0 when N = 1)
  nlohmann::json to_json() const;
};

struct PredictionInput {
  size_t num_params = 0;  // the model's flat buffer (Model::num_params)
  int world = 1;
  int rank = 0;
  int zero_stage = 0;     // 0 ddp, 1 zero1, 2 zero2, 3 zero3 (DataParallel's strategy)
  bool overlap = true;
  size_t bucket_bytes = 25u << 20;
  int batch = 1, block = 1, accum = 1;              // per-rank micro-batch, sequence, accumulation
  int layers = 1, hidden = 1, heads = 1, vocab = 1;  // the model's shapes (for activations and FLOPs)
  bool activation_checkpointing = false;            // only each layer's input is stored
  int storage_bytes = 4;  // bytes per stored parameter/gradient: 4 float32, 2 bfloat16 (--param_dtype)
  Calibration cal;
};

struct Prediction {
  std::map<std::string, double> memory_bytes;  // DataParallel::memory() categories + "activations"
  std::map<std::string, double> comm_bytes;    // kind -> bytes sent by this rank per step
  double compute_s = 0, comm_s = 0, exposed_comm_s = 0, step_s = 0;
  double model_flops_per_step = 0;             // per rank (6N + attention, planner's count)
  // Peak resident memory of the process: the resident size measured when the model, data and the
  // trainer's own AdamW exist (before calibration) + rss_growth(). 0 when not set.
  double peak_rss = 0;
  double persistent_bytes() const;             // all but activations (what DataParallel::memory() reports)
  double memory_total() const;
  double comm_total() const;
  nlohmann::json to_json() const;              // {"type":"prediction", ...}
  std::string summary() const;                 // "prediction: step X ms (compute A, comm B exposed C), ..."
};

Prediction predict(const PredictionInput& in);

// What training adds to the resident size measured before calibration (model, data and the trainer's AdamW
// resident): activations, and with data parallelism DataParallel's optimizer shard, its staging buffer and
// ZeRO's per-step staging of the shard and the gathered flat buffer.
double rss_growth(const PredictionInput& in, const Prediction& p);

struct Measured {
  double step_s = 0;
  std::map<std::string, double> memory_bytes;  // persistent accounting (DataParallel::memory or single rank)
  double peak_rss = 0;
  std::map<std::string, double> comm_bytes;
  double memory_total() const;
  double comm_total() const;
};
// {"type":"measured", ...} with the predicted/measured ratios.
nlohmann::json measured_json(const Prediction& p, const Measured& m);
std::string measured_summary(const Prediction& p, const Measured& m);

// ---- model parallelism (tp x pp x dp) ----

struct StageCalibration {
  // Per virtual stage s = chunk * P + pp_rank (P*v entries), one microbatch: forward and backward seconds
  // (the slowest TP / DP replica of the stage) and the bytes of saved activations it keeps until backward.
  std::vector<double> forward_s, backward_s, activation_bytes;
  double p2p_latency_s = 0;  // one pipeline hand-off (P > 1): latency ...
  double p2p_Bps = 0;        // ... and bandwidth, bytes/s
  double dp_allreduce_bus_Bps = 0;  // DP group, all-reduce of the shard's gradients (0 when dp = 1)
  double optimizer_s_per_param = 0;
  // Processor time (CLOCK_PROCESS_CPUTIME_ID) of the same actions, median: the work itself, without the time
  // the rank was preempted; what replay_shared_cores() runs. Empty when not measured.
  std::vector<double> forward_cpu_s, backward_cpu_s;
  // Cores this run's ranks received while all of them computed at once (sum over the world of CPU / window
  // over the same 10 ms window; median of 3 windows); 0 when not measured (one rank).
  double cores_received = 0;
  // One hand-off between pipeline neighbours while the other ranks compute (the receiver sleeps and must
  // get a core back); measured only when ranks outnumber cores, else 0.
  double handoff_loaded_s = 0;
  // Per pipeline rank: processor time of a real rehearsed step over the sum of its actions' processor
  // times (>= 1; the slowest TP / DP replica); empty when not rehearsed.
  std::vector<double> rehearsal_factor;
  double rehearsal_wall_s = 0;  // mean wall time of one rehearsed step (reported only)
  double seconds = 0;  // wall time the calibration took on this rank
  nlohmann::json to_json() const;
};

struct MpPredictionInput {
  int tp = 1, pp = 1, dp = 1, virtual_stages = 1, microbatches = 1;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::k1F1B;
  int pp_rank = 0;
  size_t num_params = 0;     // this rank's shard (ParallelModel::num_params)
  size_t tied_params = 0;    // floats of the wte shard summed between first and last stage (0: none)
  int zero_stage = 0;        // over the DP group: 0 ddp, 1 zero1
  int batch = 1, block = 1, accum = 1;  // per DP rank (split into microbatches when pp > 1)
  int hidden = 1, local_layers = 1;     // n_embd and the layers of this rank's chunks (TP traffic)
  // Processors the world's ranks share (0: a core per rank). With fewer cores than ranks each pipeline of
  // P ranks gets cores / (tp x dp) of them and is replayed with replay_shared_cores().
  double cores = 0;
  int world = 1;
  StageCalibration cal;
};

struct MpPrediction {
  double pipeline_s = 0;        // replayed makespan of forward+backward (accum x)
  double bubble_fraction = 0;   // replay's idle / makespan, mean over pipeline ranks (the printout's measure)
  double bubble_theory = 0;     // (P-1)/(v m + P-1): model.h's bubble_fraction
  double p2p_s = 0;             // one hand-off
  double tied_sync_s = 0, dp_comm_s = 0, optimizer_s = 0;
  double step_s = 0;            // this rank; the Loop takes the max over ranks
  double step_loaded_s = 0;     // the same with the calibration's background tasks
  double cores = 0;             // the host's processors (MpPredictionInput::cores)
  bool shared_cores = false;    // the pipeline was replayed with replay_shared_cores (more ranks than cores)
  double background = 0;        // other runnable tasks the calibration saw on the host (in step_loaded_s only)
  double wake_s = 0;            // extra latency of a hand-off to a sleeping rank when no core is free
  int inflight = 0;             // microbatches whose activations this rank holds at its peak (all chunks)
  std::map<std::string, double> memory_bytes;  // parameters, gradients, optimizer_state, comm_buffers, activations
  std::map<std::string, double> comm_bytes;    // tp_all_reduce, pp_send_recv, dp_* bytes this rank sends per step
  double peak_rss = 0;
  double memory_total() const;
  double persistent_bytes() const;
  nlohmann::json to_json() const;  // {"type":"prediction", "model_parallel": true, ...}
  std::string summary() const;
};

// parallel::replay() for ranks that share `cores` processors, as the kernel runs them: a started action runs
// to its end; a ready rank waits in a FIFO run queue for a free core (at most ceil(cores) actions at once);
// a rank waiting for a dependency uses no core. `background` = other runnable tasks (a measured mean): the
// run's k ready ranks get cores x k / (k + background) of the machine, shared by its running actions (rate
// at most 1). A rank asleep on a receive joins the queue when its data arrives if a core is free then,
// else `wake_latency` later. With cores >= P and no background it equals parallel::replay(). busy[p] = sum
// over rank p's actions of finish - start. Throws InvalidArgument on a schedule that cannot complete or
// negative inputs.
parallel::ReplayResult replay_shared_cores(const parallel::Schedule& s, int P, int v, const parallel::DurationFn& duration,
                                           double latency, double cores, double wake_latency = 0.0,
                                           double background = 0.0);

// Other runnable tasks (a mean) implied by `received` cores measured while `world` ranks of this run all ran
// on a host of `cores` processors: received = world x min(1, cores / (world + background)). 0 when the run got
// what it would alone (within 5%); never negative.
double background_tasks(double received, int world, double cores);

// Throws InvalidArgument when the calibration does not have P*v stage entries.
MpPrediction predict_model_parallel(const MpPredictionInput& in);

// The step the model gives when the run's ranks receive only `cores_used` cores in all (measured after the
// run: the world's CPU / wall): processor times replayed on shared cores with the background tasks that
// make the replay use that many (bisection), + the prediction's non-pipeline terms. in.cores = 0: the
// plain prediction.
double step_at_cores_used(const MpPredictionInput& in, double cores_used);

// What model-parallel training adds to the resident size measured before calibration: activations and
// DataParallel's optimizer moments over the DP group.
double rss_growth(const MpPredictionInput& in, const MpPrediction& p);

// Peak bytes of saved activations the rank holds walking `actions` (forward of chunk c adds bytes[c],
// backward frees it), and the microbatches in flight at that peak.
double schedule_peak_activation_bytes(const std::vector<parallel::Action>& actions,
                                      const std::vector<double>& bytes_per_chunk, int* inflight = nullptr);

}  // namespace trident::plan
