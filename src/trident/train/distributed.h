// Training across processes: wraps the single-rank Trainer with a data-parallel strategy (DDP or ZeRO
// stage 1/2, parallel/data_parallel.h) over the world process group from the environment (trident launch,
// torchrun, mpirun or Slurm variables). With one process and no launcher it is the plain Trainer.
//
// batch_size is per rank: N ranks at batch_size b train on the global batch of one process at N x b, and
// rank r takes windows [r b, r b + b) of it (the same windows one process would see). Tokens/s counts all
// ranks. At the end rank 0 prints the memory and communication accounting of the strategy.
#pragma once

#include <string>

#include "trident/train/trainer.h"

namespace trident::train {

struct DistributedOptions {
  std::string parallel = "ddp";  // ddp | zero1 | zero2 (used when there is more than one rank)
  double bucket_mb = 25;
  bool overlap = true;
};

TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks = {});

}  // namespace trident::train
