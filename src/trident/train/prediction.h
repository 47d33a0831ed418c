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
#include "trident/nn/model.h"
#include "trident/parallel/data_parallel.h"

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

}  // namespace trident::train
