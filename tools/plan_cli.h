// Options shared by `trident plan` and `trident simulate` (model, cluster, layout), defined once here;
// the functions are implemented in cmd_plan.cc.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "trident/plan/hardware.h"
#include "trident/plan/planner.h"

namespace trident::cli {

struct PlanCommon {
  std::string model;
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0, ffn = 0, kv_heads = 0;
  std::string gpu = "h100-sxm";
  int gpus = 0, gpus_per_node = 0, nodes = 0;
  std::string node, intra_link, inter_link;
  int global_batch = 512;
  int micro_batch = 1;
  std::string precision = "mixed";
  bool sequence_parallel = false;
  double headroom = 0.10;
  std::string catalog;
  int tp = 0, pp = 0, dp = 0, zero = -1, microbatches = 0, interleave = 1;
  std::string recompute, schedule;
  bool json = false;
  std::string html;  // --html FILE: the figure page (plan: the layouts; simulate: the sweep)
  std::string offload = "none";  // plan --offload: none | optimizer (Layout::offload)
};
void add_plan_common_options(CLI::App* c, PlanCommon* o);
plan::HardwareCatalog load_catalog(const PlanCommon& o);
plan::TrainSpec resolve_train(const PlanCommon& o);
plan::ClusterSpec resolve_cluster(const PlanCommon& o, const plan::HardwareCatalog& cat, const plan::TrainSpec& t);
bool has_layout(const PlanCommon& o);
plan::Layout resolve_layout(const PlanCommon& o, const plan::TrainSpec& t, const plan::ClusterSpec& c);

}  // namespace trident::cli
