// Model-parallel training (cfg.tp x cfg.pp > 1): the device mesh over the world, this rank's shard of the
// model, the pipeline engine, data parallelism over the mesh's dp group, checkpoints of the logical model,
// and the per-rank time report (train/distributed.h describes the behaviour). Internal to train/.
//
// Blocking: collectives over the world (every rank calls). Thread-safety: the training thread only.
#pragma once

#include <memory>

#include "trident/comm/process_group.h"
#include "trident/parallel/parallel_model.h"
#include "trident/train/distributed.h"
#include "trident/train/trainer.h"

namespace trident::train {

// One model-parallel run over `world` (tp x pp x dp ranks).
TrainResult train_model_parallel(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks,
                                 std::shared_ptr<ProcessGroup> world);
// Throws InvalidArgument unless opts.parallel is one model parallelism composes with.
void require_strategy_for_model_parallel(const DistributedOptions& opts);
// The layout of the rank at (tp_rank, pp_rank) of cfg's mesh.
parallel::ModelLayout layout_of(const TrainConfig& cfg, int tp_rank, int pp_rank);

}  // namespace trident::train
