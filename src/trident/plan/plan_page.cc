#include "trident/plan/plan_page.h"

#include <fmt/format.h>

#include <set>
#include <string>

namespace trident::plan {

namespace {

constexpr double kPageGB = 1e9;

nlohmann::json bars_figure(const std::string& id, const std::string& title, const std::string& ylabel,
                           const nlohmann::json& labels) {
  return {{"id", id},         {"title", title},
          {"type", "bars"},   {"xlabel", "layout (row of the table)"},
          {"ylabel", ylabel}, {"labels", labels},
          {"parts", nlohmann::json::array()}, {"lines", nlohmann::json::array()}};
}

}  // namespace

nlohmann::json layout_figures(const TrainSpec& t, const ClusterSpec& c, const std::vector<Evaluation>& evals,
                              const Evaluation* recommended) {
  nlohmann::json labels = nlohmann::json::array();
  for (size_t i = 0; i < evals.size(); ++i) labels.push_back(std::to_string(i + 1));
  nlohmann::json mem = bars_figure("memory", "Memory of the most loaded rank by component (GB)", "GB", labels);
  const struct {
    const char* name;
    double MemoryBreakdown::*field;
  } parts[] = {{"params", &MemoryBreakdown::params},       {"grads", &MemoryBreakdown::grads},
               {"optimizer", &MemoryBreakdown::optimizer}, {"master", &MemoryBreakdown::master},
               {"activations", &MemoryBreakdown::activations}, {"buffers", &MemoryBreakdown::buffers}};
  for (const auto& p : parts) {
    nlohmann::json v = nlohmann::json::array();
    for (const Evaluation& e : evals) v.push_back(e.memory.*p.field / kPageGB);
    mem["parts"].push_back({{"label", p.name}, {"values", v}});
  }
  mem["lines"].push_back({{"label", "usable device memory"},
                          {"values", std::vector<double>(evals.size(), c.usable_memory() / kPageGB)}});

  nlohmann::json step = bars_figure("step", "Step time (s): compute, exposed communication, pipeline bubble", "s", labels);
  nlohmann::json compute = nlohmann::json::array(), exposed = nlohmann::json::array(),
                 bubble = nlohmann::json::array(), total = nlohmann::json::array();
  for (const Evaluation& e : evals) {
    double x = 0;
    for (const CommItem& ci : e.comm) x += ci.exposed_s;
    compute.push_back(e.compute_s);
    exposed.push_back(x);
    bubble.push_back(e.bubble_s);
    total.push_back(e.step_time_s);
  }
  step["parts"] = {{{"label", "compute"}, {"values", compute}},
                   {{"label", "exposed communication"}, {"values", exposed}},
                   {{"label", "bubble"}, {"values", bubble}}};
  step["lines"].push_back({{"label", "predicted step"}, {"values", total}});

  nlohmann::json comm = bars_figure("comm", "Bytes each GPU sends per step, by kind (GB)", "GB", labels);
  std::set<std::string> kinds;
  for (const Evaluation& e : evals)
    for (const CommItem& ci : e.comm) kinds.insert(ci.kind);
  for (const std::string& k : kinds) {
    nlohmann::json v = nlohmann::json::array();
    for (const Evaluation& e : evals) {
      double b = 0;
      for (const CommItem& ci : e.comm)
        if (ci.kind == k) b += ci.bytes_per_gpu;
      v.push_back(b / kPageGB);
    }
    comm["parts"].push_back({{"label", k}, {"values", v}});
  }

  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < evals.size(); ++i) {
    const Evaluation& e = evals[i];
    const bool rec = recommended && e.layout.str() == recommended->layout.str();
    rows.push_back({std::to_string(i + 1) + (rec ? " (recommended)" : ""), e.layout.str(),
                    fmt::format("{:.2f}", e.memory.total() / kPageGB), e.fits ? "yes" : "NO",
                    fmt::format("{:.1f}%", 100 * e.bubble_fraction), fmt::format("{:.4f}", e.step_time_s),
                    fmt::format("{:.0f}", e.tokens_per_s), fmt::format("{:.1f}%", 100 * e.mfu)});
  }
  const auto& m = t.model;
  return {{"title", "Parallel layouts: memory, communication and bubble"},
          {"subtitle", fmt::format("model {} ({:.3f} B params), {} x {}, global batch {}", m.name,
                                   m.total_params() / 1e9, c.gpus, c.device, t.global_batch)},
          {"notes",
           {"The planner's predictions (trident plan, docs/PLANNER.md) for each candidate layout, numbered as the "
            "table's rows. Memory is the most loaded rank's (the first or last pipeline stage)."}},
          {"figures", {mem, step, comm}},
          {"tables",
           {{{"title", "Layouts"},
             {"columns", {"#", "layout", "memory GB", "fits", "bubble", "step s", "tokens/s", "MFU"}},
             {"rows", rows}}}}};
}

nlohmann::json scaling_figures(const nlohmann::json& sweep, const std::string& subtitle) {
  const struct {
    const char* id;
    const char* title;
    const char* field;
    double scale;
    bool logy;
  } figs[] = {{"step", "Step time (s)", "step_time_s", 1, true},
              {"throughput", "Tokens per second", "tokens_per_s", 1, true},
              {"efficiency", "Scaling efficiency (%)", "efficiency", 100, false}};
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : figs) {
    nlohmann::json fig = {{"id", f.id},     {"title", f.title}, {"type", "line"},  {"xlabel", "GPUs"},
                          {"ylabel", f.title}, {"logx", true},  {"logy", f.logy}, {"series", nlohmann::json::array()}};
    for (const char* mode : {"strong", "weak"}) {
      nlohmann::json s = {{"label", mode}, {"x", nlohmann::json::array()}, {"y", nlohmann::json::array()}};
      for (const auto& r : sweep)
        if (r.value("mode", "") == mode) {
          s["x"].push_back(r.value("gpus", 0));
          s["y"].push_back(r.value(f.field, 0.0) * f.scale);
        }
      if (!s["x"].empty()) fig["series"].push_back(std::move(s));
    }
    out.push_back(std::move(fig));
  }
  return {{"title", "Scaling: step time, throughput and efficiency against the GPU count"},
          {"subtitle", subtitle},
          {"notes", {"trident simulate's sweep: strong scaling keeps the global batch, weak scaling the batch per "
                     "data-parallel rank; TP and PP are kept and DP grows."}},
          {"figures", out}};
}

}  // namespace trident::plan
