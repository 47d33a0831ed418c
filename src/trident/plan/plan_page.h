// The figures of `trident plan --html FILE` and `trident simulate --sweep ... --html FILE`, as specs for
// dashboard/page_file.h's render_figures (plan/ does not draw; tools/ joins the two).
//
// Pure functions; thread-safe; no errors of their own.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "trident/plan/planner.h"

namespace trident::plan {

// For each candidate layout, in the order given (bars numbered 1.. as the table's rows): the memory of its
// most loaded rank by component (params, grads, optimizer, master, activations, buffers; GB) beside the
// usable device memory, the step split into compute, exposed communication and pipeline bubble (s) beside
// the predicted step, and the bytes each GPU sends per step by kind of communication (GB); then a table of
// the layouts. `recommended`: the layout the planner recommends (marked in the table), or null.
nlohmann::json layout_figures(const TrainSpec& t, const ClusterSpec& c, const std::vector<Evaluation>& evals,
                              const Evaluation* recommended);

// Step time, tokens/s and scaling efficiency against the GPU count, one line per mode (strong, weak), from
// `trident simulate`'s sweep rows ({mode, gpus, step_time_s, tokens_per_s, efficiency}).
nlohmann::json scaling_figures(const nlohmann::json& sweep, const std::string& subtitle);

}  // namespace trident::plan
