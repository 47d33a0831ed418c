#include "trident/bench/bench_page.h"

#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

#include "trident/core/error.h"

namespace trident::bench {

namespace {

// The peers' own table rows (../shared/peers/mpi_bench, gloo_bench) name collectives their way.
const std::map<std::string, std::string>& peer_op_names() {
  static const std::map<std::string, std::string> names = {{"allreduce", "all_reduce"},
                                                           {"allgather", "all_gather"},
                                                           {"reducescatter", "reduce_scatter"},
                                                           {"bcast", "broadcast"},
                                                           {"broadcast", "broadcast"}};
  return names;
}

nlohmann::json peer_table_records(std::istream& in) {
  nlohmann::json recs = nlohmann::json::array();
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<std::string> p;
    for (std::string w; ls >> w;) p.push_back(w);
    if (p.size() != 9 || p[1].empty() || p[1].find_first_not_of("0123456789") != std::string::npos) continue;
    const size_t us = p[0].find('_');
    const auto op = peer_op_names().find(p[0].substr(0, us));
    if (op == peer_op_names().end()) continue;
    nlohmann::json r = {{"op", op->second}, {"size", std::stoull(p[1])}};
    try {
      r["time_us"] = std::stod(p[4]);
      r["busbw"] = std::stod(p[7]);
    } catch (const std::exception&) {
      continue;  // a header or a line of another shape
    }
    if (us != std::string::npos) r["algo"] = p[0].substr(us + 1);
    recs.push_back(std::move(r));
  }
  return recs;
}

bool plottable(const nlohmann::json& r) {
  return r.is_object() && r.contains("op") && r["op"].is_string() && r.contains("size") &&
         r["size"].is_number() && r["size"].get<double>() > 0 && r.contains("busbw") && r["busbw"].is_number();
}

// The line a record belongs to, named as the busbw PNGs in docs/img name theirs, so old and new figures read alike.
std::string series_of(const std::string& label, const nlohmann::json& r) {
  if (!r.contains("algo") || !r["algo"].is_string() || r["algo"] == label) return label;
  if (r.contains("algo_forced") && r["algo_forced"].is_boolean() && !r["algo_forced"].get<bool>())
    return label + " auto";
  return label + " " + r["algo"].get<std::string>();
}

}  // namespace

BusbwSource busbw_source(const std::string& label, const std::vector<BenchRecord>& records) {
  BusbwSource s{label, nlohmann::json::array()};
  for (const BenchRecord& r : records) s.records.push_back(nlohmann::json(record_json(r)));
  return s;
}

BusbwSource load_busbw_source(const std::string& spec, const std::string& flag) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    TRIDENT_THROW(InvalidArgument,
                  "{} '{}' is not LABEL=FILE: name the line and the file, e.g. {} openmpi=out/bench-peers/openmpi_tcp.json",
                  flag, spec, flag);
  BusbwSource s{spec.substr(0, eq), nlohmann::json::array()};
  const std::string path = spec.substr(eq + 1);
  std::ifstream in(path);
  if (!in)
    TRIDENT_THROW(IoError, "{} {}: cannot read '{}': {}; give an existing file", flag, s.label, path,
                  detail::errno_string(errno));
  const int head = (in >> std::ws).peek();
  if (head == '[' || head == '{') {
    nlohmann::json data = nlohmann::json::parse(in, nullptr, false);
    if (data.is_discarded())
      TRIDENT_THROW(InvalidArgument, "{} {}: '{}' is not valid JSON; give a `trident bench comm --json` file", flag,
                    s.label, path);
    if (data.is_object()) data = data.value("rows", nlohmann::json::array());
    if (data.is_array())
      for (auto& r : data)
        if (plottable(r)) s.records.push_back(std::move(r));
  } else {
    s.records = peer_table_records(in);
  }
  if (s.records.empty())
    TRIDENT_THROW(InvalidArgument,
                  "{} {}: '{}' holds no records with op, size > 0 and busbw; give a `trident bench comm --json` file "
                  "or a peer's table (mpi_bench, gloo_bench)",
                  flag, s.label, path);
  return s;
}

nlohmann::json busbw_figures(const std::vector<BusbwSource>& sources, const std::string& subtitle) {
  // op -> series -> size -> the best busbw over placements
  std::map<std::string, std::map<std::string, std::map<double, double>>> data;
  for (const BusbwSource& src : sources)
    for (const auto& r : src.records) {
      if (!plottable(r)) continue;
      auto& at = data[r["op"].get<std::string>()][series_of(src.label, r)];
      const double size = r["size"].get<double>(), busbw = r["busbw"].get<double>();
      const auto it = at.find(size);
      if (it == at.end() || busbw > it->second) at[size] = busbw;
    }
  nlohmann::json spec = {{"title", "Bus bandwidth against size"},
                         {"subtitle", subtitle},
                         {"notes",
                          {"busbw in GB/s (1 GB = 1e9 B) with nccl-tests' bus factors; size in bytes as nccl-tests "
                           "counts it. One line per source and algorithm (dashed: the backend's own choice); where a "
                           "size ran in place and out of place, the faster is shown."}},
                         {"figures", nlohmann::json::array()}};
  for (const auto& [op, series] : data) {
    nlohmann::json fig = {{"id", "busbw-" + op},       {"title", op + ": bus bandwidth"},
                          {"type", "line"},           {"xlabel", "size (bytes)"},
                          {"ylabel", "busbw (GB/s)"}, {"logx", true},
                          {"xformat", "bytes"},       {"series", nlohmann::json::array()}};
    for (const auto& [name, points] : series) {
      nlohmann::json s = {{"label", name}, {"x", nlohmann::json::array()}, {"y", nlohmann::json::array()}};
      if (name.size() > 5 && name.ends_with(" auto")) s["dash"] = true;
      for (const auto& [size, busbw] : points) {
        s["x"].push_back(size);
        s["y"].push_back(busbw);
      }
      fig["series"].push_back(std::move(s));
    }
    spec["figures"].push_back(std::move(fig));
  }
  return spec;
}

}  // namespace trident::bench
