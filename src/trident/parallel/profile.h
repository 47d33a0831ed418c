// Where the time went: turns the timeline's spans (core/timeline.h) into per-rank compute / communication /
// idle seconds and the pipeline bubble of a step, gathers every rank's spans into one Chrome-trace JSON file
// (chrome://tracing, Perfetto), and summarizes all ranks for the end-of-training printout.
//
// Definitions (window = [t0, t1) of a step or of a run; spans are clipped to it):
//   compute_s     sum of compute spans ("forward", "backward", ...)
//   comm_s[name]  sum of communication spans by name ("recv_act", "all_reduce(tp)", ...): time the rank
//                 WAITED on communication (comm nested inside compute counts in both)
//   idle_s        window minus the union of all spans
//   bubble_fraction = 1 - compute_s / window  (GPipe/1F1B with uniform stages: (P-1)/(m+P-1))
//   bubble_ratio    = (window - compute_s) / compute_s  (Megatron-LM's bubble time / ideal time: (P-1)/m)
//
// Ownership: plain values. Thread-safety: the pure functions are reentrant; the group functions are
// collectives over `group` (every rank calls, same order) and block with the group's timeout. Errors:
// communication errors of the group propagate; write_chrome_trace throws IoError when the file cannot be
// written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/core/timeline.h"

namespace trident {
class ProcessGroup;
}

namespace trident::parallel {

struct RankProfile {
  double window_s = 0;
  double compute_s = 0;
  std::map<std::string, double> comm_s;  // by span name
  double comm_total_s = 0;
  double idle_s = 0;
  double bubble_fraction = 0;
  double bubble_ratio = 0;
  double comm_bytes = 0;  // sum of comm spans' bytes
  int compute_spans = 0, comm_spans = 0;
};

// t1_ns <= t0_ns: the window is [first span start, last span end).
RankProfile profile_spans(const std::vector<Span>& spans, int64_t t0_ns = 0, int64_t t1_ns = 0);

// Spans <-> JSON (one object per span: kind, name, t0, t1, mb, chunk, bytes).
nlohmann::json spans_to_json(const std::vector<Span>& spans);
std::vector<Span> spans_from_json(const nlohmann::json& j);

// Collective: every rank's spans, on `root` (index = group rank); other ranks get an empty vector.
// Variable sizes: lengths are all-gathered first, then each rank's JSON text, padded to the longest.
std::vector<std::vector<Span>> gather_spans(ProcessGroup& group, const std::vector<Span>& mine, int root = 0);

// One Chrome trace of per-rank spans: "X" events (ts/dur in microseconds from t0_ns), pid = rank,
// tid by kind (0 compute, 1 comm, 2 idle, named by metadata events), args {mb, chunk, bytes}.
nlohmann::json chrome_trace(const std::vector<std::vector<Span>>& per_rank, int64_t t0_ns);
// Collective: gathers timeline().spans() of every rank to rank 0 of `group`, which writes ONE file.
void write_chrome_trace(ProcessGroup& group, const std::string& path, int64_t t0_ns);

// {"ranks": [{rank, window_s, compute_s, comm_s: {name: s}, comm_total_s, idle_s, bubble_fraction,
//   bubble_ratio, comm_bytes}...], "max_bubble_fraction", "mean_bubble_fraction", "compute_s_max",
//   "step_window_s"} over the window [t0, t1) (t1 <= t0: each rank's own span range).
nlohmann::json summarize(const std::vector<std::vector<Span>>& per_rank, int64_t t0_ns = 0, int64_t t1_ns = 0);
// Collective: gathers the spans to rank 0 and summarizes there; other ranks get null.
nlohmann::json summarize(ProcessGroup& group, const std::vector<Span>& mine, int64_t t0_ns = 0, int64_t t1_ns = 0);
// "rank 0: compute 1.23 s (61%), comm 0.40 s (recv_act 0.3, send_grad 0.1), idle 0.38 s, bubble 38%" lines.
std::string format_summary(const nlohmann::json& summary);

}  // namespace trident::parallel
