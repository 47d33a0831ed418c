#include "trident/train/run_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "trident/core/error.h"
#include "trident/plan/hardware.h"

namespace trident::train {

RunPlan plan_run(const TrainConfig& cfg, int vocab_size, int dp, int zero_stage) {
  RunPlan r;
  r.spec.model = plan_model_spec(cfg, vocab_size);
  r.spec.precision = cfg.param_dtype == "bfloat16" ? plan::Precision::kMixed : plan::Precision::kFp32;
  plan::Layout& l = r.layout;
  l.tp = cfg.tp;
  l.pp = cfg.pp;
  l.dp = std::max(1, dp);
  l.zero = zero_stage;
  l.micro_batch = cfg.batch_size;
  l.microbatches = cfg.pp > 1 ? cfg.resolved_microbatches() : cfg.gradient_accumulation_steps;
  if (cfg.pp > 1) l.micro_batch = std::max(1, cfg.batch_size / l.microbatches);
  l.recompute = cfg.model.activation_checkpointing ? plan::Recompute::kFull : plan::Recompute::kNone;
  plan::Schedule sched = plan::Schedule::k1F1B;
  if (cfg.pp > 1 && plan::parse_schedule(cfg.schedule, &sched)) l.schedule = sched;
  l.interleave = l.schedule == plan::Schedule::kInterleaved ? cfg.virtual_stages : 1;
  l.offload = cfg.offload == "optimizer";
  r.spec.global_batch = l.dp * l.micro_batch * l.microbatches;
  return r;
}

plan::MemoryCheck check_device_memory(const TrainConfig& cfg, int vocab_size, int dp, int zero_stage,
                                      const std::string& device) {
  const RunPlan run = plan_run(cfg, vocab_size, dp, zero_stage);
  const int gpus = run.layout.tp * run.layout.pp * run.layout.dp;
  const plan::ClusterSpec cluster =
      plan::make_cluster(plan::HardwareCatalog::builtin(), device, gpus, gpus, "", "", "", run.spec.precision);
  plan::MemoryCheck mc = plan::check_memory(run.spec, cluster, run.layout);
  if (!mc.fits)
    throw OutOfMemory(
        ::trident::detail::with_location(
            fmt::format("{} ({} x {}, {} parameters, {} sequences of {} tokens per rank and micro-step) does not fit: "
                        "{}",
                        run.spec.model.name, gpus, device, run.spec.model.total_params(), cfg.batch_size,
                        cfg.model.block_size, mc.str()),
            __FILE__, __LINE__),
        static_cast<size_t>(mc.needed_bytes));
  return mc;
}

}  // namespace trident::train
