// Closing the loop: what the plan predicts `trident train` will cost on this machine, before it trains,
// and the measured figures beside it at the end, so a user sees how far the model is from the run.
//
// The prediction uses the planner's formulas (plan/model.h: activation bytes per layer, model FLOPs) with
// trident's own accounting of data parallelism (parallel/data_parallel.h): per rank, float32 parameters
// and gradients (the whole flat buffer, also under ZeRO-2, which keeps the model's gradient buffer), AdamW
// moments for this rank's shard (ddp: all), a padded staging buffer for ZeRO-2 when the flat size is not a
// multiple of the world size; bytes sent per step under nccl-tests' bus convention (all-reduce
// 2(N-1)/N x size, reduce-scatter and all-gather (N-1)/N x padded size). Step time = compute (calibrated)
// + exposed communication: DDP and ZeRO-1 all-reduce buckets during backward, so only what does not fit
// under the backward share of compute (at least the last bucket) is exposed; ZeRO's reduce-scatter and
// all-gather run after backward and are fully exposed.
//
// Calibration (calibrate()) runs on the real model and the real process group: one warm-up and two timed
// forward_backward calls of one micro-batch, AdamW on a slice of scratch memory, and (N > 1) two
// all-reduces of the gradient buffer (in place; the trainer zeroes gradients before every step), taking
// the faster. Every rank must call calibrate() together (it is collective when pg is non-null).
//
// Model parallelism (tp x pp x dp, predict_model_parallel): the step is the pipeline's makespan from
// parallel::replay() of the run's own schedule (make_schedule) with each virtual stage's calibrated forward
// and backward time of one microbatch (B/m rows; TP all-reduces are inside them, timed on the real
// ParallelModel with every rank computing at the same moment) and a p2p hand-off (latency + bytes /
// bandwidth, from a ping-pong of one activation between pipeline neighbours) on every dependency between
// ranks. With more ranks than cores the replay is replay_shared_cores(): actions run to their end on at most
// `cores` cores, ready ranks queue for one (FIFO), from each action's calibrated processor time. Then the
// tied-embedding gradient sum, the DP all-reduce of the shard (fully exposed: with P > 1 gradients are final
// only after the flush) and the optimizer.
// Memory per rank: the shard's parameters and gradients, the trainer's AdamW moments (+ DataParallel's over
// the DP group), and the activations of the microbatches the schedule keeps in flight (walked action by
// action: GPipe m, 1F1B min(m, P - p)) times each chunk's measured bytes of one microbatch.
//
// Ownership: plain values. Blocking: calibrate() runs compute and collectives on the calling thread.
// Thread-safety: none needed (pure functions apart from calibrate()). No timeouts beyond the group's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "trident/comm/process_group.h"
#include "trident/core/timeline.h"
#include "trident/nn/model.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/parallel/schedule.h"

namespace trident::train {

struct Calibration {
  double forward_backward_s = 0;  // one forward+backward of one micro-batch (B x T)
  double optimizer_s_per_param = 0;  // AdamW + gradient-norm time per parameter
  double allreduce_bus_Bps = 0;   // bytes sent per rank / all-reduce time (0 when N = 1)
  nlohmann::json to_json() const;
};

struct PredictionInput {
  size_t num_params = 0;  // the model's flat buffer (Model::num_params)
  int world = 1;
  int rank = 0;
  parallel::Strategy strategy = parallel::Strategy::kDdp;
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
  // trainer's own AdamW exist (before calibration) + what the prediction adds to it (activations, and with
  // data parallelism its optimizer shard and staging buffer). 0 when not set.
  double peak_rss = 0;
  double persistent_bytes() const;             // all but activations (what DataParallel::memory() reports)
  double memory_total() const;
  double comm_total() const;
  nlohmann::json to_json() const;              // {"type":"prediction", ...}
  std::string summary() const;                 // "prediction: step X ms (compute A, comm B exposed C), ..."
};

Prediction predict(const PredictionInput& in);

// Times the real model (and the real group when pg is non-null and has more than one rank).
Calibration calibrate(nn::Model& model, int batch, int block, int vocab, ProcessGroup* pg);

// Peak (VmHWM) and current (VmRSS) resident set size of this process, bytes; 0 when unknown.
double peak_rss_bytes();
double current_rss_bytes();

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

// ---- model parallelism ----

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
  // Rehearsal: real pipeline steps (the engine running the schedule, hand-offs and all) timed by processor
  // time: per pipeline rank, that CPU over the sum of the processor times of its actions in one step (the
  // switching, waking, copying and cache refills the actions alone do not pay; >= 1), the slowest TP / DP
  // replica; empty when not rehearsed. Replays on shared cores scale each action by its rank's factor.
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
  parallel::Strategy strategy = parallel::Strategy::kDdp;  // over the DP group (ddp | zero1)
  int batch = 1, block = 1, accum = 1;  // per DP rank (split into microbatches when pp > 1)
  int hidden = 1, local_layers = 1;     // n_embd and the layers of this rank's chunks (TP traffic)
  // Processors the world's ranks share (0: a core per rank). With fewer cores than ranks each pipeline of P
  // ranks gets cores / (tp x dp) of them and the pipeline is replayed with replay_shared_cores() from the
  // calibrated processor times x the rehearsal factors (without them, the wall times) and the loaded
  // hand-off's extra wake-up latency. The calibration's background tasks go into step_loaded_s only.
  double cores = 0;
  int world = 1;
  StageCalibration cal;
};

struct MpPrediction {
  double pipeline_s = 0;        // replayed makespan of forward+backward (accum x)
  double bubble_fraction = 0;   // replay's idle / makespan, mean over pipeline ranks (the printout's measure)
  double bubble_theory = 0;     // (P-1)/(v m + P-1)
  double p2p_s = 0;             // one hand-off
  double tied_sync_s = 0, dp_comm_s = 0, optimizer_s = 0;
  double step_s = 0;            // this rank; the Loop takes the max over ranks
  double step_loaded_s = 0;     // the same with the calibration's background tasks (see predict_model_parallel)
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

// parallel::replay() for ranks that share `cores` processors, as the kernel runs them: an action, once on a
// core, runs to its end (millisecond actions fit in a scheduler time slice: the calibration's median action
// takes the same wall and processor time even with 4 ranks on 2 cores); a rank whose action is ready waits
// in a FIFO run queue for a free core (at most ceil(cores) actions run at once); a rank waiting for a
// dependency uses no core. `background` = other runnable tasks on the machine (a measured mean): the run's k
// ready ranks get cores x k / (k + background) of the machine, shared by its running actions (rate at most
// 1). Wake-up: a rank that went to sleep on a receive (its cross-rank dependency arrived after it was free)
// joins the queue when the data arrives if a core is free then (running + queued + background < cores),
// else `wake_latency` later. With cores >= P and no background it equals parallel::replay(); with one core
// the makespan is the total work (plus latencies where nothing can run). busy[p] = sum over rank p's
// actions of finish - start (wall time, as the training timeline measures a span). Throws InvalidArgument
// on a schedule that cannot complete or negative inputs.
parallel::ReplayResult replay_shared_cores(const parallel::Schedule& s, int P, int v, const parallel::DurationFn& duration,
                                           double latency, double cores, double wake_latency = 0.0,
                                           double background = 0.0);

// Other runnable tasks (a mean) implied by `received` cores measured while `world` ranks of this run all ran
// on a host of `cores` processors: received = world x min(1, cores / (world + background)). 0 when the run got
// what it would alone (within 5%); never negative.
double background_tasks(double received, int world, double cores);

// Pure: throws InvalidArgument when the calibration does not have P*v stage entries.
MpPrediction predict_model_parallel(const MpPredictionInput& in);

// Collective over every rank of `mesh` (call together, before training): times each local chunk's forward
// and backward of microbatches of `rows` x `block` (rounds of 2 forwards then their 2 backwards, every rank
// at the same moment: a barrier on the world before each round; one warm-up round, then the median of 16
// actions of each kind), the p2p ping-pong (P > 1) and the DP all-reduce of the gradients (dp > 1);
// all-gathers the per-stage times (max over the TP and DP replicas) so every
// rank returns the same stage vectors. Leaves gradients zero and the stages' activation peaks reset.
// With more than one rank it also measures the cores the run receives (every rank computes over the same
// 3 x 10 ms windows: sum of CPU / window) and, when ranks outnumber `cores` (0: the host's), a hand-off
// while the others compute.
// `rehearse` (optional): runs one real forward+backward step of the run (the pipeline engine's run() over
// `microbatches` microbatches); it is called 1 + 3 times (warm-up, then timed), gradients zeroed after.
StageCalibration calibrate_model_parallel(parallel::ParallelModel& pm, const parallel::DeviceMesh& mesh, int rows,
                                          int block, int vocab, int cores = 0,
                                          const std::function<void()>& rehearse = {}, int microbatches = 1);

// After the run, to tell a model error from a busier machine: the step the model gives when the run's ranks
// receive only `cores_used` cores in all (measured: the world's CPU / wall over the training): the
// processor times replayed on shared cores (replay_shared_cores, cores / (tp x dp) per pipeline) with the
// background tasks that make the replay use that many (bisection), + the prediction's non-pipeline terms.
// in.cores = 0: the plain prediction.
double step_at_cores_used(const MpPredictionInput& in, double cores_used);

// Processor time of this process (CLOCK_PROCESS_CPUTIME_ID), seconds.
double process_cpu_seconds();

// Peak bytes of saved activations the rank holds walking `actions` (forward of chunk c adds bytes[c],
// backward frees it), and the microbatches in flight at that peak.
double schedule_peak_activation_bytes(const std::vector<parallel::Action>& actions,
                                      const std::vector<double>& bytes_per_chunk, int* inflight = nullptr);

// Mean duration of this rank's "forward" and "backward" compute spans per local chunk (Span::chunk) inside
// the windows [t0, t1): the measured per-microbatch times to replay through the schedule. 0 where none.
void mean_chunk_times(const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                      int chunks, std::vector<double>* forward_s, std::vector<double>* backward_s);

}  // namespace trident::train
