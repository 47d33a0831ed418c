#include "trident/comm/tuning.h"

#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trident/comm/algorithms/algorithm.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {

const TuningEntry* TuningTable::find(OpKind op, Algo algo) const {
  for (const auto& e : entries)
    if (e.op == op && e.algo == algo) return &e;
  return nullptr;
}

std::optional<double> TuningTable::predict(OpKind op, Algo algo, double bytes) const {
  const TuningEntry* e = find(op, algo);
  if (!e || e->points.empty()) return std::nullopt;
  const auto& p = e->points;
  if (bytes <= p.front().bytes) return p.front().seconds;
  if (bytes >= p.back().bytes) return p.back().bytes > 0 ? p.back().seconds * bytes / p.back().bytes : p.back().seconds;
  size_t i = 1;
  while (p[i].bytes < bytes) ++i;
  const TuningPoint& a = p[i - 1];
  const TuningPoint& b = p[i];
  // Log-log interpolation; a zero-byte point (barrier) interpolates linearly instead.
  if (a.bytes <= 0) return a.seconds + (b.seconds - a.seconds) * (bytes - a.bytes) / (b.bytes - a.bytes);
  const double f = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
  return std::exp(std::log(a.seconds) + f * (std::log(b.seconds) - std::log(a.seconds)));
}

std::string tuning_to_json(const TuningTable& t) {
  nlohmann::ordered_json j;
  j["version"] = t.version;
  j["host"] = t.host;
  j["date"] = t.date;
  j["transport"] = t.transport;
  j["world_size"] = t.world_size;
  j["dtype"] = t.dtype;
  j["entries"] = nlohmann::ordered_json::array();
  for (const auto& e : t.entries) {
    nlohmann::ordered_json je;
    je["op"] = op_name(e.op);
    je["algo"] = algo_name(e.algo);
    std::vector<uint64_t> bytes;
    std::vector<double> us;
    for (const auto& p : e.points) bytes.push_back(static_cast<uint64_t>(p.bytes)), us.push_back(p.seconds * 1e6);
    je["bytes"] = bytes;
    je["p50_us"] = us;
    j["entries"].push_back(je);
  }
  return j.dump(1) + "\n";
}

TuningTable parse_tuning(const std::string& text, const std::string& source) {
  using json = nlohmann::json;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    TRIDENT_THROW(InvalidArgument, "tuning file '{}' is not valid JSON; rewrite it with `trident bench comm --tune {}`",
                  source, source);
  auto fail = [&](const std::string& what) {
    TRIDENT_THROW(InvalidArgument, "tuning file '{}': {}; rewrite it with `trident bench comm --tune {}`", source, what,
                  source);
  };
  if (!j.is_object()) fail("the top level is not a JSON object");
  TuningTable t;
  if (!j.contains("version") || !j["version"].is_number_integer()) fail("no integer \"version\"");
  t.version = j["version"].get<int>();
  if (t.version != 1) fail(fmt::format("version {} is not supported (this trident reads version 1)", t.version));
  auto str = [&](const char* key, bool required) -> std::string {
    if (!j.contains(key)) {
      if (required) fail(fmt::format("no \"{}\"", key));
      return {};
    }
    if (!j[key].is_string()) fail(fmt::format("\"{}\" is not a string", key));
    return j[key].get<std::string>();
  };
  t.host = str("host", false);
  t.date = str("date", false);
  t.transport = str("transport", true);
  if (t.transport != "shm" && t.transport != "tcp" && t.transport != "shm+tcp")
    fail(fmt::format("transport '{}' is not one of shm, tcp, shm+tcp", t.transport));
  if (j.contains("dtype")) t.dtype = str("dtype", false);
  if (!j.contains("world_size") || !j["world_size"].is_number_integer()) fail("no integer \"world_size\"");
  t.world_size = j["world_size"].get<int>();
  if (t.world_size < 1) fail(fmt::format("world_size {} is below 1", t.world_size));
  if (!j.contains("entries") || !j["entries"].is_array()) fail("no \"entries\" array");
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const json& je = j["entries"][i];
    const std::string where = fmt::format("entries[{}]", i);
    if (!je.is_object() || !je.contains("op") || !je["op"].is_string() || !je.contains("algo") ||
        !je["algo"].is_string())
      fail(where + " lacks string fields \"op\" and \"algo\"");
    TuningEntry e;
    try {
      e.op = parse_op(je["op"].get<std::string>());
      e.algo = parse_algo(je["algo"].get<std::string>());
    } catch (const InvalidArgument& ex) {
      fail(fmt::format("{}: {}", where, ex.what()));
    }
    if (!find_algorithm(e.op, e.algo))
      fail(fmt::format("{}: {} has no algorithm '{}'", where, op_name(e.op), algo_name(e.algo)));
    if (t.find(e.op, e.algo)) fail(fmt::format("{}: {} {} is listed twice", where, op_name(e.op), algo_name(e.algo)));
    if (!je.contains("bytes") || !je["bytes"].is_array() || !je.contains("p50_us") || !je["p50_us"].is_array())
      fail(where + " lacks arrays \"bytes\" and \"p50_us\"");
    const json& jb = je["bytes"];
    const json& jt = je["p50_us"];
    if (jb.empty() || jb.size() != jt.size())
      fail(fmt::format("{}: \"bytes\" ({} values) and \"p50_us\" ({} values) must be non-empty and equally long",
                       where, jb.size(), jt.size()));
    for (size_t k = 0; k < jb.size(); ++k) {
      if (!jb[k].is_number() || !jt[k].is_number()) fail(fmt::format("{}: value {} is not a number", where, k));
      TuningPoint p{jb[k].get<double>(), jt[k].get<double>() * 1e-6};
      if (!std::isfinite(p.bytes) || p.bytes < 0) fail(fmt::format("{}: bytes[{}] = {} is not a size", where, k, p.bytes));
      if (!std::isfinite(p.seconds) || p.seconds <= 0)
        fail(fmt::format("{}: p50_us[{}] = {} is not a positive time", where, k, p.seconds * 1e6));
      if (!e.points.empty() && p.bytes <= e.points.back().bytes)
        fail(fmt::format("{}: bytes are not strictly ascending at index {}", where, k));
      e.points.push_back(p);
    }
    t.entries.push_back(std::move(e));
  }
  return t;
}

TuningTable load_tuning_file(const std::string& path) {
  std::ifstream f(path);
  if (!f)
    TRIDENT_THROW(InvalidArgument,
                  "tuning file '{}' (TRIDENT_TUNING_FILE) cannot be read: {}; write it with `trident bench comm --tune "
                  "{}` or unset TRIDENT_TUNING_FILE",
                  path, detail::errno_string(errno), path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_tuning(ss.str(), path);
}

void save_tuning_file(const std::string& path, const TuningTable& t) {
  std::ofstream f(path);
  if (!f) TRIDENT_THROW(IoError, "--tune: cannot open '{}' for writing", path);
  f << tuning_to_json(t);
  if (!f) TRIDENT_THROW(IoError, "--tune: failed writing '{}'", path);
}

namespace {
std::mutex g_mu;
}

std::shared_ptr<const TuningTable> tuning_from_env() {
  const std::string path = env::tuning_file();
  if (path.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  static std::map<std::string, std::shared_ptr<const TuningTable>> cache;
  auto it = cache.find(path);
  if (it != cache.end()) return it->second;
  auto t = std::make_shared<const TuningTable>(load_tuning_file(path));
  cache[path] = t;
  return t;
}

void warn_tuning_not_covered(const TuningTable& t, const std::string& path, const std::string& transport, int world) {
  std::lock_guard<std::mutex> lock(g_mu);
  static std::set<std::string> warned;
  if (!warned.insert(fmt::format("{}|{}|{}", path, transport, world)).second) return;
  log_warn("tuning file '{}' covers {} rank(s) over {}, not this group's {} rank(s) over {}: such groups choose "
           "algorithms by the cost model (run `trident bench comm --tune FILE --nproc {} --transport {}` to measure)",
           path, t.world_size, t.transport, world, transport, world, transport == "shm+tcp" ? "auto" : transport);
}

}  // namespace trident
