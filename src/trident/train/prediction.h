// Closing the loop: what the plan predicts `trident train` will cost on this machine, before it trains,
// and the measured figures beside it at the end (issue 7 item 5).
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
// ParallelModel with every rank computing at the same moment, so ranks that share cores are timed sharing
// them) and a p2p hand-off (latency + bytes / bandwidth, from a ping-pong of one activation between pipeline
// neighbours) on every dependency between ranks; with more ranks than cores the replay shares the cores
// (replay_shared_cores). Then the tied-embedding gradient sum, the DP all-reduce of the shard (fully
// exposed: with P > 1 gradients are final only after the flush) and the optimizer.
// Memory per rank: the shard's parameters and gradients, the trainer's AdamW moments (+ DataParallel's over
// the DP group), and the activations of the microbatches the schedule keeps in flight (walked action by
// action: GPipe m, 1F1B min(m, P - p)) times each chunk's measured bytes of one microbatch.
//
// Ownership: plain values. Blocking: calibrate() runs compute and collectives on the calling thread.
// Thread-safety: none needed (pure functions apart from calibrate()). No timeouts beyond the group's.
#pragma once

#include <cstddef>
#include <cstdint>
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
  // ranks gets cores / (tp x dp) of them and the pipeline is replayed with replay_shared_cores(), from the
  // calibrated times x cores / world (they were timed with every rank of the world running at once).
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
  bool shared_cores = false;    // the pipeline was replayed with replay_shared_cores (more ranks than cores)
  int inflight = 0;             // microbatches whose activations this rank holds at its peak (all chunks)
  std::map<std::string, double> memory_bytes;  // parameters, gradients, optimizer_state, comm_buffers, activations
  std::map<std::string, double> comm_bytes;    // tp_all_reduce, pp_send_recv, dp_* bytes this rank sends per step
  double peak_rss = 0;
  double memory_total() const;
  double persistent_bytes() const;
  nlohmann::json to_json() const;  // {"type":"prediction", "model_parallel": true, ...}
  std::string summary() const;
};

// parallel::replay() for ranks that share `cores` processors (processor sharing: the running actions each
// progress at min(1, cores / running) of their calibrated speed; a rank waiting for a dependency uses no
// core). With cores >= P it equals parallel::replay(); with one core the makespan is the total work (plus
// latencies where nothing can run). busy[p] = sum over rank p's actions of finish - start (wall time, as the
// training timeline measures a span). Throws InvalidArgument on a schedule that cannot complete.
parallel::ReplayResult replay_shared_cores(const parallel::Schedule& s, int P, int v, const parallel::DurationFn& duration,
                                           double latency, double cores);

// Pure: throws InvalidArgument when the calibration does not have P*v stage entries.
MpPrediction predict_model_parallel(const MpPredictionInput& in);

// Collective over every rank of `mesh` (call together, before training): times each local chunk's forward
// and backward of microbatches of `rows` x `block` (rounds of 2 forwards then their 2 backwards, every rank
// at the same moment: a barrier on the world before each round; one warm-up round, then the median of 16
// actions of each kind), the p2p ping-pong (P > 1) and the DP all-reduce of the gradients (dp > 1);
// all-gathers the per-stage times (max over the TP and DP replicas) so every
// rank returns the same stage vectors. Leaves gradients zero and the stages' activation peaks reset.
StageCalibration calibrate_model_parallel(parallel::ParallelModel& pm, const parallel::DeviceMesh& mesh, int rows,
                                          int block, int vocab);

// Peak bytes of saved activations the rank holds walking `actions` (forward of chunk c adds bytes[c],
// backward frees it), and the microbatches in flight at that peak.
double schedule_peak_activation_bytes(const std::vector<parallel::Action>& actions,
                                      const std::vector<double>& bytes_per_chunk, int* inflight = nullptr);

// Mean duration of this rank's "forward" and "backward" compute spans per local chunk (Span::chunk) inside
// the windows [t0, t1): the measured per-microbatch times to replay through the schedule. 0 where none.
void mean_chunk_times(const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                      int chunks, std::vector<double>* forward_s, std::vector<double>* backward_s);

}  // namespace trident::train
