// The prediction loop of a training run (train_distributed and its model-parallel run): calibrates the step
// model (plan/step_model.h) on the real model and group, prints and records the prediction before training,
// and prints and records the measured figures beside it after (the measuring helpers: train/prediction.h).
// Internal to train/.
//
// Ownership: owns its state. Blocking: before*/after* run collectives over the group or mesh they are given
// (every rank calls them). Thread-safety: the training thread only.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/core/timeline.h"
#include "trident/nn/model.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/train/distributed.h"
#include "trident/train/trainer.h"

namespace trident::train {

class PredictionLoop {
 public:
  PredictionLoop();
  ~PredictionLoop();
  PredictionLoop(const PredictionLoop&) = delete;
  PredictionLoop& operator=(const PredictionLoop&) = delete;

  // Data parallelism and one process: after the model is built, before DataParallel hooks it (calibration
  // runs backward on it). pg: the world group, or null for one process.
  void before(const TrainConfig& cfg, Trainer& t, nn::Model& model, ProcessGroup* pg, const DistributedOptions& opts,
              std::FILE* out);
  // At the end: the measured figures (memory and communication per category) beside the prediction.
  void after(const TrainConfig& cfg, Trainer& t, const TrainResult& res, int rank, int world,
             std::map<std::string, double> memory, std::map<std::string, double> comm, std::FILE* out);
  // Model parallelism: after the pipeline engine exists, before DataParallel hooks the model and before the
  // timeline is enabled; `rehearse` runs one step's schedule for the calibration.
  void before_model_parallel(const TrainConfig& cfg, Trainer& t, parallel::ParallelModel& pm,
                             const parallel::DeviceMesh& mesh, const DistributedOptions& opts, std::FILE* out,
                             const std::function<void()>& rehearse = {});
  void after_model_parallel(const TrainConfig& cfg, Trainer& t, const TrainResult& res, parallel::ParallelModel& pm,
                            parallel::DataParallel* dp, const parallel::DeviceMesh& mesh, double measured_bubble,
                            const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                            std::FILE* out);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace trident::train
