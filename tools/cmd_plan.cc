// `trident plan`: memory, communication, bubble, step time and MFU of parallel layouts from the cost
// model (src/trident/plan/), and a recommendation. Also holds the model/cluster options shared with
// `trident simulate` (PlanCommon, declared in plan_cli.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "plan_cli.h"
#include "trident/core/error.h"
#include "trident/dashboard/page_file.h"
#include "trident/plan/model.h"
#include "trident/plan/plan_page.h"
#include "trident/plan/planner.h"

namespace trident::cli {

// The catalog directory compiled in: <source tree>/share/trident/hardware (entries there add to and
// override the built-in ones, which are compiled into the binary).
std::string default_catalog_dir() {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "share" / "trident" / "hardware").string();
}

void add_plan_common_options(CLI::App* c, PlanCommon* o) {
  // The one catalog of named shapes (plan/model.h), which `trident train --model NAME` reads too.
  std::string names;
  for (const auto& n : plan::model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  c->add_option("--model", o->model, "model preset (the catalog `trident train --model` reads too): " + names);
  c->add_option("--layers", o->layers, "transformer layers (custom model, or override a preset)");
  c->add_option("--hidden", o->hidden, "hidden size");
  c->add_option("--heads", o->heads, "attention heads");
  c->add_option("--kv-heads", o->kv_heads, "key/value heads (grouped-query attention)");
  c->add_option("--ffn", o->ffn, "MLP hidden size (default 4 x hidden)");
  c->add_option("--vocab", o->vocab, "vocabulary size");
  c->add_option("--seq", o->seq, "sequence length");
  c->add_option("--gpu", o->gpu, "GPU (a100-40gb, a100-80gb, h100-sxm, h200) or host (this-machine)");
  c->add_option("--gpus", o->gpus, "total GPUs (default: --nodes x --gpus-per-node, or 8)");
  c->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node = NVLink domain (default: the node shape's)");
  c->add_option("--nodes", o->nodes, "nodes (alternative to --gpus)");
  c->add_option("--node", o->node, "node shape: dgx-a100, dgx-h100 (default by GPU)");
  c->add_option("--intra-link", o->intra_link, "link inside a node (nvlink3, nvlink4, nvswitch-a100, nvswitch-h100, pcie4-x16, pcie5-x16, shm)");
  c->add_option("--inter-link", o->inter_link, "link between nodes, per NIC (ib-hdr, ib-ndr, eth-100g, eth-400g, tcp-loopback)");
  c->add_option("--global-batch", o->global_batch, "sequences per optimizer step")->capture_default_str();
  c->add_option("--micro-batch", o->micro_batch, "sequences per microbatch")->capture_default_str();
  c->add_option("--precision", o->precision, "mixed (bf16 + fp32 master) or fp32")->capture_default_str();
  c->add_flag("--sequence-parallel", o->sequence_parallel, "Megatron sequence parallelism with TP");
  c->add_option("--headroom", o->headroom, "fraction of GPU memory kept free")->capture_default_str();
  c->add_option("--catalog", o->catalog, "directory of hardware *.json files adding to the built-in catalog (default: " +
                                             default_catalog_dir() + " when present)");
  c->add_option("--tp", o->tp, "tensor-parallel degree (evaluates one layout)");
  c->add_option("--pp", o->pp, "pipeline stages");
  c->add_option("--dp", o->dp, "data-parallel degree (default: the rest)");
  c->add_option("--zero", o->zero, "ZeRO stage 0-3");
  c->add_option("--microbatches", o->microbatches, "microbatches per step per DP rank (default: global / (dp x micro))");
  c->add_option("--recompute", o->recompute, "activation recomputation: none, selective, full");
  c->add_option("--schedule", o->schedule, "pipeline schedule: gpipe, 1f1b, interleaved");
  c->add_option("--interleave", o->interleave, "virtual stages per rank for --schedule interleaved")->capture_default_str();
  c->add_flag("--json", o->json, "print JSON");
}

plan::HardwareCatalog load_catalog(const PlanCommon& o) {
  plan::HardwareCatalog cat = plan::HardwareCatalog::builtin();
  if (!o.catalog.empty())
    cat.load_dir(o.catalog, true);
  else
    cat.load_dir(default_catalog_dir(), false);
  return cat;
}

plan::TrainSpec resolve_train(const PlanCommon& o) {
  plan::TrainSpec t;
  if (!o.model.empty()) {
    t.model = plan::model_preset(o.model);
  } else {
    if (o.layers <= 0 || o.hidden <= 0 || o.heads <= 0)
      TRIDENT_THROW(InvalidArgument, "give --model PRESET or --layers, --hidden and --heads (plus --vocab, --seq)");
    t.model.name = "custom";
  }
  auto& m = t.model;
  if (o.layers) m.layers = o.layers;
  if (o.hidden) m.hidden = o.hidden;
  if (o.heads) m.heads = o.heads;
  if (o.kv_heads) m.kv_heads = o.kv_heads;
  if (o.ffn) m.ffn_hidden = o.ffn;
  if (o.vocab) m.vocab = o.vocab;
  if (o.seq) m.seq = o.seq;
  if (m.layers <= 0 || m.hidden <= 0 || m.heads <= 0 || m.vocab <= 0 || m.seq <= 0)
    TRIDENT_THROW(InvalidArgument, "--layers, --hidden, --heads, --vocab and --seq must be > 0");
  if (m.hidden % m.heads != 0)
    TRIDENT_THROW(InvalidArgument, "--hidden {} must be divisible by --heads {}", m.hidden, m.heads);
  if (m.heads % m.kv() != 0)
    TRIDENT_THROW(InvalidArgument, "--kv-heads {} must divide --heads {}", m.kv(), m.heads);
  if (o.global_batch < 1) TRIDENT_THROW(InvalidArgument, "--global-batch {}: must be >= 1", o.global_batch);
  t.global_batch = o.global_batch;
  if (!plan::parse_precision(o.precision, &t.precision))
    TRIDENT_THROW(InvalidArgument, "--precision '{}': allowed mixed, bf16, fp16, fp32", o.precision);
  t.sequence_parallel = o.sequence_parallel;
  return t;
}

plan::ClusterSpec resolve_cluster(const PlanCommon& o, const plan::HardwareCatalog& cat, const plan::TrainSpec& t) {
  int gpus = o.gpus;
  if (gpus == 0 && o.nodes > 0) {
    int gpn = o.gpus_per_node;
    if (gpn == 0) {
      plan::ClusterSpec probe = plan::make_cluster(cat, o.gpu, 1, 0, o.node, o.intra_link, o.inter_link, t.precision);
      gpn = probe.gpus_per_node;
    }
    gpus = o.nodes * gpn;
  }
  if (gpus == 0) gpus = 8;
  if (o.gpus > 0 && o.nodes > 0 && o.gpus_per_node > 0 && o.gpus != o.nodes * o.gpus_per_node)
    TRIDENT_THROW(InvalidArgument, "--gpus {} != --nodes {} x --gpus-per-node {}", o.gpus, o.nodes, o.gpus_per_node);
  if (o.headroom < 0 || o.headroom >= 1) TRIDENT_THROW(InvalidArgument, "--headroom {}: allowed [0, 1)", o.headroom);
  plan::ClusterSpec c = plan::make_cluster(cat, o.gpu, gpus, o.gpus_per_node, o.node, o.intra_link, o.inter_link, t.precision);
  c.memory_headroom = o.headroom;
  return c;
}

bool has_layout(const PlanCommon& o) {
  return o.tp || o.pp || o.dp || o.zero >= 0 || o.microbatches || !o.recompute.empty() || !o.schedule.empty();
}

plan::Layout resolve_layout(const PlanCommon& o, const plan::TrainSpec& t, const plan::ClusterSpec& c) {
  plan::Layout l;
  l.tp = o.tp ? o.tp : 1;
  l.pp = o.pp ? o.pp : 1;
  if (l.tp < 1) TRIDENT_THROW(InvalidArgument, "--tp {}: must be >= 1", l.tp);
  if (l.pp < 1) TRIDENT_THROW(InvalidArgument, "--pp {}: must be >= 1", l.pp);
  if (o.dp) {
    l.dp = o.dp;
  } else {
    if (c.gpus % (l.tp * l.pp) != 0)
      TRIDENT_THROW(InvalidArgument, "--tp {} x --pp {} = {} does not divide --gpus {}", l.tp, l.pp, l.tp * l.pp, c.gpus);
    l.dp = c.gpus / (l.tp * l.pp);
  }
  l.zero = o.zero >= 0 ? o.zero : 0;
  l.micro_batch = o.micro_batch;
  if (o.microbatches) {
    l.microbatches = o.microbatches;
  } else {
    if (l.dp < 1 || l.micro_batch < 1 || t.global_batch % (l.dp * l.micro_batch) != 0)
      TRIDENT_THROW(InvalidArgument, "--global-batch {} is not divisible by --dp {} x --micro-batch {}; change one of them",
                    t.global_batch, l.dp, l.micro_batch);
    l.microbatches = t.global_batch / (l.dp * l.micro_batch);
  }
  if (!o.recompute.empty() && !plan::parse_recompute(o.recompute, &l.recompute))
    TRIDENT_THROW(InvalidArgument, "--recompute '{}': allowed none, selective, full", o.recompute);
  if (!o.schedule.empty() && !plan::parse_schedule(o.schedule, &l.schedule))
    TRIDENT_THROW(InvalidArgument, "--schedule '{}': allowed gpipe, 1f1b, interleaved", o.schedule);
  l.interleave = l.schedule == plan::Schedule::kInterleaved ? o.interleave : 1;
  l.offload = o.offload == "optimizer";
  if (l.schedule == plan::Schedule::kInterleaved && l.interleave < 2)
    TRIDENT_THROW(InvalidArgument, "--interleave {}: the interleaved schedule needs >= 2 virtual stages per rank", l.interleave);
  return l;
}

namespace cmd_plan {
namespace {

constexpr double kGB = 1e9;

std::string comm_summary(const plan::Evaluation& e) {
  std::string s;
  for (auto& c : e.comm) {
    std::string kind = c.kind == "tp_all_reduce"         ? "tp"
                       : c.kind == "pp_send_recv"        ? "pp"
                       : c.kind == "dp_all_reduce"       ? "dp"
                       : c.kind == "zero_reduce_scatter" ? "rs"
                       : c.kind == "zero_all_gather"     ? "ag"
                       : c.kind == "zero3_all_gather"    ? "z3ag"
                       : c.kind == "zero3_reduce_scatter" ? "z3rs"
                                                          : c.kind;
    s += fmt::format("{}{} {:.2f}GB@{}", s.empty() ? "" : " ", kind, c.bytes_per_gpu / kGB, c.link);
  }
  return s.empty() ? "-" : s;
}

void print_row(const plan::Evaluation& e) {
  std::printf("%-38s %8.1f %-4s %7.1f%% %9.3f %11.0f %6.1f%%  %s\n", e.layout.str().c_str(), e.memory.total() / kGB,
              e.fits ? "yes" : "NO", 100 * e.bubble_fraction, e.step_time_s, e.tokens_per_s, 100 * e.mfu,
              comm_summary(e).c_str());
}

void print_header(const plan::TrainSpec& t, const plan::ClusterSpec& c) {
  const auto& m = t.model;
  std::printf("model %s: %.3f B params (L=%d h=%d heads=%d vocab=%d seq=%d); global batch %d sequences = %.0f tokens\n",
              m.name.c_str(), m.total_params() / 1e9, m.layers, m.hidden, m.heads, m.vocab, m.seq, t.global_batch,
              double(t.global_batch) * m.seq);
  std::printf("cluster: %d x %s (%d per node, %.1f GB, %.0f TFLOP/s peak %s), intra %s %.0f GB/s, inter %s x%d per node %.1f GB/s\n",
              c.gpus, c.device.c_str(), c.gpus_per_node, c.device_memory_bytes / kGB, c.peak_flops / 1e12,
              plan::to_string(t.precision), c.intra.name.c_str(), c.intra.bandwidth_Bps / kGB, c.nic.name.c_str(),
              c.nics_per_node, c.nic.bandwidth_Bps / kGB);
  std::printf("model FLOPs per iteration: %.4g\n\n", plan::model_flops_per_iteration(m, double(t.global_batch) * m.seq));
  std::printf("%-38s %8s %-4s %8s %9s %11s %7s  %s\n", "layout", "mem GB", "fits", "bubble", "step s", "tokens/s",
              "MFU", "comm per GPU per step");
}

void print_detail(const plan::Evaluation& e) {
  const auto& b = e.memory;
  std::printf("\nmemory per GPU: %.2f GB = params %.2f + grads %.2f + optimizer %.2f + master %.2f + activations %.2f + buffers %.2f\n",
              b.total() / kGB, b.params / kGB, b.grads / kGB, b.optimizer / kGB, b.master / kGB, b.activations / kGB,
              b.buffers / kGB);
  std::printf("host memory per GPU: %.2f GB = optimizer %.2f + master %.2f (%s)\n", b.host_total() / kGB,
              b.host_optimizer / kGB, b.host_master / kGB,
              e.layout.offload ? "optimizer offload" : "no offload: --offload optimizer moves the optimizer state here");
  std::printf("step %.4f s: compute %.4f s, bubble %.4f s (%.1f%%); %.0f tokens/s, %.1f TFLOP/s per GPU, MFU %.1f%%\n",
              e.step_time_s, e.compute_s, e.bubble_s, 100 * e.bubble_fraction, e.tokens_per_s, e.tflops_per_gpu, 100 * e.mfu);
  for (auto& c : e.comm)
    std::printf("  %-22s on %-14s %-18s %9.3f GB/GPU  busy %.4f s  exposed %.4f s\n", c.kind.c_str(), c.link.c_str(),
                c.algorithm.c_str(), c.bytes_per_gpu / kGB, c.time_s, c.exposed_s);
  for (auto& w : e.warnings) std::printf("  warning: %s\n", w.c_str());
}

// The --html page of `evals` (the rows the table shows).
void write_page(const PlanCommon& o, const plan::TrainSpec& t, const plan::ClusterSpec& c,
                const std::vector<plan::Evaluation>& evals, const plan::Evaluation* recommended) {
  dashboard::write_html_file(o.html, dashboard::render_figures(plan::layout_figures(t, c, evals, recommended)),
                             "plan --html");
  if (!o.json) std::printf("\nlayouts page written: %s\n", o.html.c_str());
}

void run_plan(const PlanCommon& o, int top, bool all) {
  if (!o.html.empty()) dashboard::check_html_path(o.html, "--html");
  if (o.offload != "none" && o.offload != "optimizer")
    TRIDENT_THROW(InvalidArgument, "--offload '{}': allowed none, optimizer", o.offload);
  plan::HardwareCatalog cat = load_catalog(o);
  plan::TrainSpec t = resolve_train(o);
  plan::ClusterSpec c = resolve_cluster(o, cat, t);
  if (has_layout(o)) {
    plan::Evaluation e = plan::evaluate(t, c, resolve_layout(o, t, c));
    if (o.json) {
      nlohmann::json j = e.to_json();
      j["model"] = t.model.name;
      j["params"] = t.model.total_params();
      std::cout << j.dump(2) << "\n";
    } else {
      print_header(t, c);
      print_row(e);
      print_detail(e);
    }
    if (!o.html.empty()) write_page(o, t, c, {e}, nullptr);
    set_exit_code(e.fits ? 0 : 3);
    return;
  }
  if (o.micro_batch < 1) TRIDENT_THROW(InvalidArgument, "--micro-batch {}: must be >= 1", o.micro_batch);
  auto evals = plan::enumerate_layouts(t, c, o.micro_batch);
  if (o.offload == "optimizer")  // every candidate with its optimizer state in host memory
    for (auto& e : evals) {
      plan::Layout l = e.layout;
      l.offload = true;
      e = plan::evaluate(t, c, l);
    }
  if (evals.empty())
    TRIDENT_THROW(InvalidArgument, "no layout divides --gpus {} and --global-batch {} with --micro-batch {}; try a global "
                  "batch that is a multiple of the GPU count", c.gpus, t.global_batch, o.micro_batch);
  std::stable_sort(evals.begin(), evals.end(), [](const plan::Evaluation& a, const plan::Evaluation& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_time_s < b.step_time_s;
  });
  plan::Recommendation rec = plan::recommend(t, c, evals);
  if (o.json) {
    nlohmann::json j;
    j["model"] = t.model.name;
    j["params"] = t.model.total_params();
    j["gpus"] = c.gpus;
    j["candidates"] = nlohmann::json::array();
    for (auto& e : evals) j["candidates"].push_back(e.to_json());
    if (rec.found) j["recommended"] = rec.best.to_json();
    j["reasons"] = rec.reasons;
    std::cout << j.dump(2) << "\n";
  } else {
    print_header(t, c);
    int shown = 0;
    for (auto& e : evals) {
      if (!all && shown >= top) break;
      print_row(e);
      ++shown;
    }
    if (!all && int(evals.size()) > top)
      std::printf("... %zu more (--all to list them)\n", evals.size() - size_t(top));
    if (rec.found) {
      std::printf("\nrecommended: %s\n", rec.best.layout.str().c_str());
      print_detail(rec.best);
    }
    std::printf("\nwhy:\n");
    for (auto& r : rec.reasons) std::printf("  - %s\n", r.c_str());
  }
  if (!o.html.empty()) {
    const size_t shown = all ? evals.size() : std::min(evals.size(), static_cast<size_t>(std::max(top, 1)));
    write_page(o, t, c, std::vector<plan::Evaluation>(evals.begin(), evals.begin() + static_cast<long>(shown)),
               rec.found ? &rec.best : nullptr);
  }
  set_exit_code(rec.found ? 0 : 3);
}

void setup(CLI::App& app) {
  auto* c = app.add_subcommand("plan", "predict memory, communication, bubble, step time and MFU of parallel layouts; recommend one");
  auto o = std::make_shared<PlanCommon>();
  auto top = std::make_shared<int>(20);
  auto all = std::make_shared<bool>(false);
  auto list = std::make_shared<bool>(false);
  add_plan_common_options(c, o.get());
  c->add_option("--top", *top, "rows of the table to print")->capture_default_str();
  c->add_flag("--all", *all, "print every candidate");
  c->add_option("--html", o->html,
                "write FILE: one self-contained HTML page (opens offline) of the --top layouts' memory by component, "
                "step split into compute, exposed communication and bubble, and bytes sent by kind");
  c->add_flag("--list-hardware", *list, "print the hardware catalog (built-in + --catalog) as JSON");
  c->add_option("--offload", o->offload,
                "optimizer: each GPU's Adam moments and master weights (its ZeRO shard) in host memory, as `trident "
                "train --offload optimizer`; memory is then printed for the device and the host")
      ->capture_default_str();
  c->callback([o, top, all, list] {
    if (*list) {
      std::cout << load_catalog(*o).to_json().dump(2) << "\n";
      return;
    }
    run_plan(*o, *top, *all);
  });
}

CommandRegistration reg(60, setup);

}  // namespace
}  // namespace cmd_plan
}  // namespace trident::cli
