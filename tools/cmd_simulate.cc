// `trident simulate`: event-driven simulation of training steps of a layout on a cluster (see
// src/trident/plan/simulator.h), with injectable stragglers and degraded links, scaling sweeps and a
// Chrome trace.
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "command.h"
#include "plan_cli.h"
#include "trident/core/error.h"
#include "trident/dashboard/page_file.h"
#include "trident/plan/plan_page.h"
#include "trident/plan/simulator.h"

namespace trident::cli {



namespace cmd_simulate {
namespace {

struct SimCli {
  int steps = 1;
  std::vector<std::string> degrade, straggler;
  std::string trace;
  int trace_ranks = 64;
  std::string sweep;  // "", "strong", "weak", "both"
  std::vector<int> sweep_gpus;
  std::string csv;
  bool no_symmetry = false;
  std::string algo = "auto";
  double bucket_mb = 25;
};

std::vector<int> default_counts(int unit, int max_gpus) {
  std::vector<int> v;
  for (int n = unit; n <= max_gpus; n *= 2) v.push_back(n);
  if (v.empty() || v.back() != max_gpus) v.push_back(max_gpus);
  return v;
}

void run_simulate(const PlanCommon& o, const SimCli& s) {
  if (!o.html.empty()) {
    if (s.sweep.empty())
      TRIDENT_THROW(InvalidArgument, "--html draws the scaling sweep's curves: add --sweep strong, weak or both");
    dashboard::check_html_path(o.html, "--html");
  }
  plan::HardwareCatalog cat = load_catalog(o);
  plan::SimOptions opt;
  opt.train = resolve_train(o);
  opt.cluster = resolve_cluster(o, cat, opt.train);
  if (has_layout(o)) {
    opt.layout = resolve_layout(o, opt.train, opt.cluster);
  } else {
    auto evals = plan::enumerate_layouts(opt.train, opt.cluster, o.micro_batch);
    auto rec = plan::recommend(opt.train, opt.cluster, evals);
    if (!rec.found)
      TRIDENT_THROW(InvalidArgument, "no layout fits this model on {} x {}; give one with --tp --pp --dp --zero", opt.cluster.gpus,
                    opt.cluster.device);
    opt.layout = rec.best.layout;
  }
  opt.steps = s.steps;
  opt.trace_path = s.trace;
  opt.trace_max_ranks = s.trace_ranks;
  opt.exploit_symmetry = !s.no_symmetry;
  opt.bucket_bytes = s.bucket_mb * 1e6;
  if (opt.bucket_bytes <= 0) TRIDENT_THROW(InvalidArgument, "--bucket-mb {}: must be > 0", s.bucket_mb);
  try {
    opt.algorithm = parse_algo(s.algo);
  } catch (const InvalidArgument& e) {
    TRIDENT_THROW(InvalidArgument, "--algo: {}", e.what());
  }
  for (auto& d : s.degrade) opt.degraded.push_back(plan::parse_degraded(d, "--degrade-link"));
  for (auto& x : s.straggler) opt.stragglers.push_back(plan::parse_straggler(x, "--straggler"));

  auto t0 = std::chrono::steady_clock::now();
  plan::SimResult r = plan::simulate(opt);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  plan::Evaluation predicted = plan::evaluate(opt.train, opt.cluster, opt.layout);

  nlohmann::json j;
  j["layout"] = opt.layout.str();
  j["gpus"] = opt.cluster.gpus;
  j["simulated"] = r.to_json();
  j["wall_s"] = wall;
  j["planner_step_time_s"] = predicted.step_time_s;
  if (!o.json) {
    std::printf("simulate %s on %d x %s: %s\n", opt.train.model.name.c_str(), opt.cluster.gpus, opt.cluster.device.c_str(),
                opt.layout.str().c_str());
    std::printf("step time %.4f s (planner's closed form: %.4f s), %.0f tokens/s, %.1f TFLOP/s per GPU, MFU %.1f%%\n",
                r.step_time_s, predicted.step_time_s, r.tokens_per_s, r.tflops_per_gpu, 100 * r.mfu);
    std::printf("busiest rank: compute %.4f s, comm stream occupied %.4f s per step (including waits for peers); last to finish: rank %d\n", r.compute_busy_s,
                r.comm_busy_s, r.slowest_rank);
    std::printf("simulated %d ranks%s, %ld events in %.3f s\n", r.simulated_ranks,
                r.used_symmetry ? " (one representative per pipeline stage; the rest are symmetric)" : "", r.events, wall);
    if (!s.trace.empty()) std::printf("trace: %s (chrome://tracing or https://ui.perfetto.dev)\n", s.trace.c_str());
  }

  if (!s.sweep.empty()) {
    if (s.sweep != "strong" && s.sweep != "weak" && s.sweep != "both")
      TRIDENT_THROW(InvalidArgument, "--sweep '{}': allowed strong, weak, both", s.sweep);
    std::vector<int> counts = s.sweep_gpus.empty() ? default_counts(opt.layout.tp * opt.layout.pp, opt.cluster.gpus)
                                                   : s.sweep_gpus;
    std::ofstream csv;
    if (!s.csv.empty()) {
      const std::filesystem::path parent = std::filesystem::path(s.csv).parent_path();
      std::error_code ec;
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
      if (ec) TRIDENT_THROW(IoError, "--csv: cannot create the folder '{}': {}", parent.string(), ec.message());
      csv.open(s.csv);
      if (!csv)
        TRIDENT_THROW(IoError, "--csv: cannot write '{}': {}; give a writable path", s.csv, detail::errno_string(errno));
      csv << "mode,gpus,tp,pp,dp,micro_batch,microbatches,global_batch,step_time_s,tokens_per_s,mfu,efficiency\n";
    }
    j["sweep"] = nlohmann::json::array();
    for (bool strong : {true, false}) {
      if ((strong && s.sweep == "weak") || (!strong && s.sweep == "strong")) continue;
      auto pts = plan::scaling_sweep(opt, counts, strong);
      if (!o.json) {
        std::printf("\n%s scaling (%s):\n", strong ? "strong" : "weak",
                    strong ? "fixed global batch" : "fixed batch per data-parallel rank");
        std::printf("%7s %5s %9s %12s %12s %7s %10s\n", "gpus", "dp", "batch", "step s", "tokens/s", "MFU", "efficiency");
      }
      for (auto& p : pts) {
        const int gb = p.layout.dp * p.layout.micro_batch * p.layout.microbatches;
        if (!o.json)
          std::printf("%7d %5d %9d %12.4f %12.0f %6.1f%% %9.1f%%\n", p.gpus, p.layout.dp, gb, p.result.step_time_s,
                      p.result.tokens_per_s, 100 * p.result.mfu, 100 * p.efficiency);
        if (csv)
          csv << (strong ? "strong" : "weak") << "," << p.gpus << "," << p.layout.tp << "," << p.layout.pp << ","
              << p.layout.dp << "," << p.layout.micro_batch << "," << p.layout.microbatches << "," << gb << ","
              << p.result.step_time_s << "," << p.result.tokens_per_s << "," << p.result.mfu << "," << p.efficiency << "\n";
        j["sweep"].push_back({{"mode", strong ? "strong" : "weak"},
                              {"gpus", p.gpus},
                              {"dp", p.layout.dp},
                              {"global_batch", gb},
                              {"step_time_s", p.result.step_time_s},
                              {"tokens_per_s", p.result.tokens_per_s},
                              {"mfu", p.result.mfu},
                              {"efficiency", p.efficiency}});
      }
    }
  }
  if (!o.html.empty()) {
    dashboard::write_html_file(
        o.html,
        dashboard::render_figures(plan::scaling_figures(
            j["sweep"], fmt::format("model {}, {} on {} x {}", opt.train.model.name, opt.layout.str(),
                                    opt.cluster.gpus, opt.cluster.device))),
        "simulate --html");
    if (!o.json) std::printf("\nscaling page written: %s\n", o.html.c_str());
  }
  if (o.json) std::cout << j.dump(2) << "\n";
}

void setup(CLI::App& app) {
  auto* c = app.add_subcommand("simulate", "event-driven simulation of training steps of a layout on a cluster");
  auto o = std::make_shared<PlanCommon>();
  auto s = std::make_shared<SimCli>();
  add_plan_common_options(c, o.get());
  c->add_option("--steps", s->steps, "training steps to simulate")->capture_default_str();
  c->add_option("--degrade-link", s->degrade, "node:N:FACTOR: node N's inter-node links at FACTOR x bandwidth (repeatable)");
  c->add_option("--straggler", s->straggler, "rank:R:FACTOR: rank R computes FACTOR x slower (repeatable)");
  c->add_option("--trace", s->trace, "write a Chrome trace JSON of the simulated timeline");
  c->add_option("--trace-ranks", s->trace_ranks, "ranks traced at most (a sample when more are simulated)")->capture_default_str();
  c->add_option("--sweep", s->sweep, "scaling curve over GPU counts: strong, weak or both");
  c->add_option("--sweep-gpus", s->sweep_gpus, "GPU counts of the sweep (default: powers of two from tp x pp to --gpus)")
      ->delimiter(',');
  c->add_option("--csv", s->csv, "write the sweep as CSV");
  c->add_option("--html", o->html,
                "write FILE: one self-contained HTML page (opens offline) of the sweep's step time, tokens/s and "
                "scaling efficiency against the GPU count");
  c->add_flag("--no-symmetry", s->no_symmetry, "simulate every rank even when symmetric");
  c->add_option("--algo", s->algo, "data-parallel collective algorithm (the native backend's names: auto, ring, rd, rh, tree, direct, hier), where the op has it")->capture_default_str();
  c->add_option("--bucket-mb", s->bucket_mb, "gradient bucket size in MB")->capture_default_str();
  c->callback([o, s] { run_simulate(*o, *s); });
}

CommandRegistration reg(61, setup);

}  // namespace
}  // namespace cmd_simulate
}  // namespace trident::cli
