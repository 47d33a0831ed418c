// Training across processes: wraps the single-rank Trainer with a data-parallel strategy (DDP or ZeRO
// stage 1, 2 or 3, parallel/data_parallel.h) over the world process group from the environment (trident launch,
// torchrun, mpirun or Slurm variables). With one process and no launcher it is the plain Trainer.
//
// batch_size is per rank: N ranks at batch_size b train on the global batch of one process at N x b, and
// rank r takes windows [r b, r b + b) of it (the same windows one process would see). Tokens/s counts all
// ranks. At the end rank 0 prints the memory and communication accounting of the strategy.
//
// Model parallelism (cfg.tp * cfg.pp > 1): the world becomes a DeviceMesh tp x pp x dp (parallel/mesh.h;
// dp = 0 infers world / (tp * pp)); each rank builds its shard of the model (parallel/parallel_model.h,
// initialised with the single-process model of the same seed) and, with pp > 1, drives it through the
// PipelineEngine (cfg.schedule, cfg.microbatches, cfg.virtual_stages). Tensor- and pipeline-parallel
// peers read the same batch (the trainer sees the DATA-parallel rank and size); with dp > 1 gradients
// are averaged over the dp group by DataParallel (ddp or zero1; zero2 and zero3 are refused), after the pipeline
// flush. Clipping uses the global norm over the tp x pp shards (each logical element counted once), so
// the run follows the single-process run on the same global batch. Checkpoints hold the LOGICAL model
// (gathered to world rank 0, nanoGPT names and full shapes, optimizer moments likewise): they load in a
// single process and under any other layout, and --resume may change the layout. At the end world rank 0
// prints where each rank's time went (compute, tensor-parallel communication, pipeline transfers,
// data-parallel communication, bubble) and writes cfg.trace (a Chrome trace, one track per rank).
// The sample at the end is generated on world rank 0 from the gathered logical model.
//
// Errors: a layout that cannot shard the model or does not match the world throws InvalidArgument before
// any communication (check_parallel_layout lets a launcher refuse it before starting ranks).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/parallel/mesh_shape.h"
#include "trident/train/trainer.h"

namespace trident::train {

struct DistributedOptions {
  std::string parallel = "ddp";  // ddp | zero1 | zero2 | zero3 (used when there is more than one rank)
  // The world group's backend (comm/init.cc's table): native (trident's own; device buffers moved by the
  // group, comm/device_memory.h), mpi (under mpirun) or nccl (one GPU per rank, --device cuda).
  std::string backend = "native";
  double bucket_mb = 25;
  double first_bucket_mb = 1;  // ddp/zero1: the first bucket's size (PyTorch's 1 MiB; 0: as bucket_mb)
  bool overlap = true;
  bool shared_gradients = true;  // DataParallelOptions::shared_gradients (--no-shared-grads turns it off)
};

TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks = {});
// The same over an existing world group (tests run ranks over a FileStore); world may be null for one process.
TrainResult train_distributed(const TrainConfig& cfg, const DistributedOptions& opts, TrainerHooks hooks,
                              std::shared_ptr<ProcessGroup> world);

// The metrics record of the mesh a run trains on: {"type": "mesh", tp, pp, dp, order, "ranks": [{rank, tp, pp,
// dp}...]} in world-rank order, each coordinate from parallel::mesh_coord (the arithmetic the DeviceMesh
// builds its groups with), so a reader shows where each rank sat without knowing the axis order's rule.
// A data-parallel run is tp 1 x pp 1 x dp world. With `hosts` (one per world rank, rank_hosts()), each rank
// also names the host it runs on ("host"), which the dashboard groups its link matrix by.
nlohmann::json mesh_record(const parallel::MeshShape& shape, const std::vector<std::string>& hosts = {});

// Each rank's host identity (TRIDENT_HOST_ID, else the hostname: what the native backend's ranks exchanged
// when the group formed), by group rank; empty for no group, or where the backend does not report its peers (MPI, NCCL).
std::vector<std::string> rank_hosts(const ProcessGroup* pg);

// TrainerHooks::gather_ranks over `world` (an all-gather of float64s; collective).
std::function<std::vector<double>(const std::vector<double>&)> gather_ranks_over(std::shared_ptr<ProcessGroup> world);

// Checks the backend against the device (nccl needs cuda); throws InvalidArgument naming the fix. Pure.
void check_backend(const TrainConfig& cfg, const DistributedOptions& opts);
// Checks the model-parallel layout of cfg against a world size and the model (vocab_size: the tokenizer's;
// the model pads it as model_config_json does); throws InvalidArgument saying what would divide. Pure.
void check_parallel_layout(const TrainConfig& cfg, const DistributedOptions& opts, int world_size, int vocab_size);

}  // namespace trident::train
