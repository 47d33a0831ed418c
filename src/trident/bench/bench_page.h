// The figures of `trident bench comm --html FILE`: bus bandwidth against size, one chart per collective, one
// line per (source, algorithm), this run's records beside peers' results (`--peer LABEL=FILE`), as a spec
// for dashboard/page_file.h's render_figures (the bench layer does not draw; tools/ joins the two).
//
// Pure functions and a file read; thread-safe. Errors: load_busbw_source() throws InvalidArgument for a
// spec that is not LABEL=FILE or a file with no usable records, IoError for a file it cannot read; each
// names the file and the fix.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/bench/comm_bench.h"

namespace trident::bench {

// One source of lines: its label and its records, each with op, size and busbw, and optionally algo,
// algo_forced and inplace (the --json format's fields).
struct BusbwSource {
  std::string label;
  nlohmann::json records = nlohmann::json::array();
};

// This run's records as a source.
BusbwSource busbw_source(const std::string& label, const std::vector<BenchRecord>& records);

// Reads "LABEL=FILE": a JSON array of records (trident's --json files; OpenMPI's rows as
// scripts/run_peers.sh converts them), {"rows": [...]}, or a peer's own table as ../shared/peers' mpi_bench
// and gloo_bench print it ("NAME SIZE COUNT ITERS US_AVG US_MAX ALGBW BUSBW CHECK" rows; Gloo's
// "allreduce_ring" becomes op all_reduce, algorithm ring). `flag` names the option in errors.
BusbwSource load_busbw_source(const std::string& spec, const std::string& flag = "--peer");

// The figure page's spec: per collective (sorted by name), one line per series, where a series is the
// source's label, "LABEL ALGO" for an algorithm it forced, or "LABEL auto" for the backend's own choice
// (dashed). A size measured in both placements shows the faster (the larger busbw). Records without an op,
// a size > 0 or a busbw are left out.
nlohmann::json busbw_figures(const std::vector<BusbwSource>& sources, const std::string& subtitle);

}  // namespace trident::bench
