#include "trident/dashboard/run_data.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "trident/comm/flight_inspect.h"
#include "trident/core/error.h"

namespace trident::dashboard {

namespace fs = std::filesystem;

MetricsLog::MetricsLog(std::string path) : path_(std::move(path)) {}

void MetricsLog::reset() {
  offset_ = 0;
  last_line_.clear();
  records_.clear();
  bad_lines_ = 0;
  ++generation_;
  ++rewrites_;
}

bool MetricsLog::refresh() {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (offset_ == 0 && records_.empty()) return false;
    reset();  // the file went away: what was read no longer describes it
    return true;
  }
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  bool changed = false;
  if (size < offset_) {
    reset();
    changed = true;
  } else if (offset_ > 0) {
    // The trainer rewrites the file on a restart (fopen "w", the kept records first): if the line that ended
    // at our offset is not there any more, what we read no longer describes the file.
    std::string check(last_line_.size(), '\0');
    in.seekg(static_cast<std::streamoff>(offset_ - last_line_.size()));
    in.read(check.data(), static_cast<std::streamsize>(check.size()));
    if (!in || check != last_line_) {
      reset();
      changed = true;
    }
  }
  if (size == offset_) return changed;
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset_));
  std::string buf(size - offset_, '\0');
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  buf.resize(static_cast<size_t>(in.gcount()));
  size_t pos = 0;
  while (true) {
    const size_t nl = buf.find('\n', pos);
    if (nl == std::string::npos) break;  // an incomplete last line: a record being written
    const std::string_view line(buf.data() + pos, nl - pos);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (rec.is_object()) {
        records_.push_back(std::move(rec));
        changed = true;
      } else {
        ++bad_lines_;
      }
    }
    last_line_.assign(buf, pos, nl + 1 - pos);
    pos = nl + 1;
  }
  offset_ += pos;
  return changed;
}

std::vector<size_t> downsample_indices(size_t n, size_t max_points) {
  max_points = std::max<size_t>(max_points, 2);
  std::vector<size_t> idx;
  if (n <= max_points) {
    idx.resize(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    return idx;
  }
  idx.reserve(max_points);
  // Evenly spaced over [0, n-1]: point k at round(k * (n-1) / (max_points-1)); strictly increasing since
  // the step is above 1.
  for (size_t k = 0; k < max_points; ++k) idx.push_back((k * (n - 1) + (max_points - 1) / 2) / (max_points - 1));
  return idx;
}

RunFolder::RunFolder(std::string dir, int id)
    : dir_(std::move(dir)),
      id_(id),
      log_((fs::path(dir_) / "metrics.jsonl").string()),
      health_((fs::path(dir_) / "health.jsonl").string()) {
  std::error_code ec;
  if (!fs::exists(dir_, ec))
    TRIDENT_THROW(InvalidArgument, "run folder '{}' does not exist: name the out_dir of a `trident train` run", dir_);
  if (!fs::is_directory(dir_, ec))
    TRIDENT_THROW(InvalidArgument, "run folder '{}' is not a directory: name the out_dir of a `trident train` run",
                  dir_);
  if (!fs::is_regular_file(fs::path(dir_) / "metrics.jsonl", ec))
    TRIDENT_THROW(InvalidArgument,
                  "run folder '{}' holds no metrics.jsonl: not the out_dir of a `trident train` run (or the run has "
                  "not started writing yet; start the dashboard after the run's first step)",
                  dir_);
  log_.refresh();
}

namespace {

// The latest checkpoint's configuration ({step, model, sampler, optimizer}), or {} without one.
nlohmann::json checkpoint_config(const fs::path& dir) {
  std::ifstream latest(dir / "latest");
  std::string name;
  if (!(latest >> name) || name.find('/') != std::string::npos || name.find("..") != std::string::npos) return {};
  std::ifstream in(dir / name / "checkpoint.json");
  if (!in) return {};
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return {{"error", "unreadable " + name + "/checkpoint.json"}};
  nlohmann::json out = {{"name", name}};
  for (const char* k : {"step", "model", "sampler", "optimizer"})
    if (j.contains(k)) out[k] = j[k];
  return out;
}

bool has_flight_dumps(const fs::path& dir) {
  std::error_code ec;
  for (const fs::path& d : {dir / "flight_recorder", dir}) {
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if ((f.rfind("rank_", 0) == 0 || f.rfind("pid_", 0) == 0) && it->path().extension() == ".json") return true;
    }
    ec.clear();
  }
  return false;
}

}  // namespace

nlohmann::json RunFolder::summary(double live_s, double max_age_s) {
  std::lock_guard<std::mutex> lock(mu_);
  log_.refresh();
  const auto& recs = log_.records();
  const auto now = std::chrono::steady_clock::now();
  if (!cached_.is_null() && cached_generation_ == log_.generation() && cached_count_ == recs.size() &&
      std::chrono::duration<double>(now - cached_at_).count() < max_age_s)
    return cached_;
  Counts& c = counts_;
  if (c.generation != log_.generation()) c = Counts{log_.generation()};
  for (; c.counted < recs.size(); ++c.counted) {
    const auto t = recs[c.counted].find("type");
    if (t == recs[c.counted].end() || !t->is_string()) continue;
    const std::string& type = t->get_ref<const std::string&>();
    c.runs += type == "run";
    c.steps += type == "step";
    c.evals += type == "eval";
    c.finished |= type == "final" || type == "measured";
  }
  const int runs = c.runs, steps = c.steps, evals = c.evals;
  const bool finished = c.finished;
  const fs::path dir(dir_);
  nlohmann::json j = {{"id", id_},
                      {"name", dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string()},
                      {"dir", dir_},
                      {"steps", steps},
                      {"evals", evals},
                      {"generation", log_.generation()},
                      {"bad_lines", log_.bad_lines()},
                      // A resumed run keeps the earlier runs' "run" records and adds its own; a run restarted
                      // from scratch rewrites the file, which the log counts.
                      {"restarts", std::max(runs - 1, log_.rewrites())},
                      {"checkpoint", checkpoint_config(dir)}};
  std::string status = "stopped";
  if (has_flight_dumps(dir)) {
    try {
      const auto report = inspect_flight_dumps(load_flight_dumps(dir_));
      j["inspect"] = report.text();
      bool hang = false;
      for (const auto& f : report.findings) hang |= f.kind == InspectFinding::Kind::kHang;
      status = hang ? "hung" : "failed";
    } catch (const std::exception& e) {
      j["inspect"] = std::string("flight-recorder dumps unreadable: ") + e.what();
      status = "failed";
    }
  }
  if (finished) {
    status = "finished";
  } else if (status == "stopped") {
    std::error_code ec;
    const auto mtime = fs::last_write_time(dir / "metrics.jsonl", ec);
    if (!ec) {
      const double age = std::chrono::duration<double>(fs::file_time_type::clock::now() - mtime).count();
      if (age < live_s) status = "running";
    }
  }
  j["status"] = status;
  cached_ = j;
  cached_generation_ = log_.generation();
  cached_count_ = recs.size();
  cached_at_ = now;
  return j;
}

namespace {

// RunFolder::records_since's answer from `log`: records for which `thinned` holds are downsampled to
// `max_points`, the others all come.
template <typename Thinned>
nlohmann::json answer_since(MetricsLog& log, uint64_t generation, size_t from, size_t max_points, size_t max_records,
                            Thinned thinned) {
  log.refresh();
  const auto& recs = log.records();
  const bool reset = generation != log.generation() || from > recs.size();
  if (reset) from = 0;
  const size_t end = reset ? recs.size() : from + std::min(max_records, recs.size() - from);
  std::vector<size_t> thin_at;  // indices (into recs) of the thinned records of the answer
  for (size_t i = from; i < end; ++i)
    if (thinned(recs[i])) thin_at.push_back(i);
  std::vector<char> keep(end - from, 1);
  if (thin_at.size() > max_points) {
    for (size_t i : thin_at) keep[i - from] = 0;
    for (size_t k : downsample_indices(thin_at.size(), max_points)) keep[thin_at[k] - from] = 1;
  }
  nlohmann::json out = {{"generation", log.generation()},
                        {"next", end},
                        {"reset", reset},
                        {"records", nlohmann::json::array()}};
  for (size_t i = from; i < end; ++i)
    if (keep[i - from]) out["records"].push_back(recs[i]);
  return out;
}

}  // namespace

nlohmann::json RunFolder::records_since(uint64_t generation, size_t from, size_t max_points, size_t max_records) {
  std::lock_guard<std::mutex> lock(mu_);
  return answer_since(log_, generation, from, max_points, max_records,
                      [](const nlohmann::json& r) { return r.value("type", "") == "step"; });
}

nlohmann::json RunFolder::health_since(uint64_t generation, size_t from, size_t max_points, size_t max_records) {
  std::lock_guard<std::mutex> lock(mu_);
  // A round that raised a warning is never thinned out: the page marks it on the time axis.
  return answer_since(health_, generation, from, max_points, max_records,
                      [](const nlohmann::json& r) { return !r.contains("events"); });
}

}  // namespace trident::dashboard
