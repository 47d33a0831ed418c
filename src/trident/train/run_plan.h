// The planner's view of a `trident train` run (plan/planner.h), built from its config: the step's
// description and layout, and the device-memory check `trident train --device cuda` makes before it
// allocates anything. Apart from config.h so that what parses a config (and its fuzz target) does not link
// the planner and the hardware catalog.
#pragma once

#include <string>

#include "trident/plan/planner.h"
#include "trident/train/config.h"

namespace trident::train {

// The planner's description of this run (plan/planner.h): the model, the global batch over `dp` data-parallel
// ranks, the stored precision (param_dtype: float32, or bfloat16 with float32 master weights), and the layout
// (tp, pp, dp, ZeRO stage `zero_stage`, micro-batch, accumulation or microbatches, activation checkpointing,
// schedule, --offload).
struct RunPlan {
  plan::TrainSpec spec;
  plan::Layout layout;
};
RunPlan plan_run(const TrainConfig& cfg, int vocab_size, int dp, int zero_stage);
// The planner's device memory for one rank of this run on `device` (a GPU of the hardware catalog, e.g.
// "h200"): plan::check_memory of plan_run on a cluster of tp x pp x dp such GPUs. Throws OutOfMemory (bytes:
// what is needed) naming the bytes needed and usable and the flags that would fit when it does not fit.
// `trident train --device cuda` calls it before it allocates anything.
plan::MemoryCheck check_device_memory(const TrainConfig& cfg, int vocab_size, int dp, int zero_stage,
                                      const std::string& device);

}  // namespace trident::train
