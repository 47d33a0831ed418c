#include "trident/parallel/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "trident/comm/process_group.h"
#include "trident/core/error.h"

namespace trident::parallel {

namespace {

SpanKind kind_from_name(const std::string& s) {
  if (s == "compute") return SpanKind::kCompute;
  if (s == "comm") return SpanKind::kComm;
  if (s == "idle") return SpanKind::kIdle;
  TRIDENT_THROW(InvalidArgument, "span kind '{}' is not compute, comm or idle", s);
}

// Total length of the union of [a, b) intervals.
int64_t union_length(std::vector<std::pair<int64_t, int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur0 = 0, cur1 = 0;
  bool open = false;
  for (auto [a, b] : iv) {
    if (b <= a) continue;
    if (!open || a > cur1) {
      if (open) total += cur1 - cur0;
      cur0 = a;
      cur1 = b;
      open = true;
    } else {
      cur1 = std::max(cur1, b);
    }
  }
  if (open) total += cur1 - cur0;
  return total;
}

}  // namespace

RankProfile profile_spans(const std::vector<Span>& spans, int64_t t0_ns, int64_t t1_ns) {
  RankProfile r;
  if (t1_ns <= t0_ns) {
    if (spans.empty()) return r;
    t0_ns = std::numeric_limits<int64_t>::max();
    t1_ns = std::numeric_limits<int64_t>::min();
    for (const Span& s : spans) {
      t0_ns = std::min(t0_ns, s.t0_ns);
      t1_ns = std::max(t1_ns, s.t1_ns);
    }
  }
  r.window_s = (t1_ns - t0_ns) * 1e-9;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const Span& s : spans) {
    int64_t a = std::max(s.t0_ns, t0_ns), b = std::min(s.t1_ns, t1_ns);
    if (b < a) continue;  // outside the window (zero-length spans inside it still count as spans)
    double d = (b - a) * 1e-9;
    if (s.kind == SpanKind::kCompute) {
      r.compute_s += d;
      ++r.compute_spans;
    } else if (s.kind == SpanKind::kComm) {
      r.comm_s[s.name] += d;
      r.comm_total_s += d;
      r.comm_bytes += s.bytes;
      ++r.comm_spans;
    }
    if (s.kind != SpanKind::kIdle) busy.emplace_back(a, b);
  }
  r.idle_s = r.window_s - union_length(std::move(busy)) * 1e-9;
  if (r.window_s > 0) r.bubble_fraction = 1.0 - r.compute_s / r.window_s;
  if (r.compute_s > 0) r.bubble_ratio = (r.window_s - r.compute_s) / r.compute_s;
  return r;
}

nlohmann::json spans_to_json(const std::vector<Span>& spans) {
  nlohmann::json a = nlohmann::json::array();
  for (const Span& s : spans)
    a.push_back({{"kind", span_kind_name(s.kind)}, {"name", s.name}, {"t0", s.t0_ns}, {"t1", s.t1_ns},
                 {"mb", s.microbatch}, {"chunk", s.chunk}, {"bytes", s.bytes}});
  return a;
}

std::vector<Span> spans_from_json(const nlohmann::json& j) {
  std::vector<Span> out;
  for (const auto& o : j) {
    Span s;
    s.kind = kind_from_name(o.at("kind").get<std::string>());
    s.name = o.at("name").get<std::string>();
    s.t0_ns = o.at("t0").get<int64_t>();
    s.t1_ns = o.at("t1").get<int64_t>();
    s.microbatch = o.value("mb", -1);
    s.chunk = o.value("chunk", -1);
    s.bytes = o.value("bytes", 0.0);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::vector<Span>> gather_spans(ProcessGroup& group, const std::vector<Span>& mine, int root) {
  const int n = group.size();
  std::string text = spans_to_json(mine).dump();
  int64_t len = static_cast<int64_t>(text.size());
  std::vector<int64_t> lens(n);
  group.all_gather(&len, lens.data(), 1, DType::kInt64);
  const size_t width = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
  text.resize(width, ' ');
  std::vector<uint8_t> all(group.rank() == root ? width * n : 0);
  group.gather(text.data(), all.data(), width, DType::kUInt8, root);
  std::vector<std::vector<Span>> out;
  if (group.rank() != root) return out;
  out.resize(n);
  for (int r = 0; r < n; ++r) {
    std::string t(reinterpret_cast<const char*>(all.data()) + width * r, static_cast<size_t>(lens[r]));
    out[r] = spans_from_json(nlohmann::json::parse(t));
  }
  return out;
}

nlohmann::json chrome_trace(const std::vector<std::vector<Span>>& per_rank, int64_t t0_ns) {
  nlohmann::json ev = nlohmann::json::array();
  const char* threads[] = {"compute", "comm", "idle"};
  for (size_t r = 0; r < per_rank.size(); ++r) {
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"tid", 0},
                  {"args", {{"name", fmt::format("rank {}", r)}}}});
    ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"tid", 0}, {"args", {{"sort_index", r}}}});
    for (int k = 0; k < 3; ++k)
      ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", k}, {"args", {{"name", threads[k]}}}});
    for (const Span& s : per_rank[r]) {
      nlohmann::json args = nlohmann::json::object();
      if (s.microbatch >= 0) args["mb"] = s.microbatch;
      if (s.chunk >= 0) args["chunk"] = s.chunk;
      if (s.bytes > 0) args["bytes"] = s.bytes;
      std::string name = s.name;
      if (s.microbatch >= 0) name += fmt::format(" mb{}", s.microbatch);
      if (s.chunk >= 0) name += fmt::format(" c{}", s.chunk);
      ev.push_back({{"ph", "X"}, {"name", name}, {"cat", span_kind_name(s.kind)}, {"pid", r},
                    {"tid", static_cast<int>(s.kind)}, {"ts", (s.t0_ns - t0_ns) / 1e3},
                    {"dur", (s.t1_ns - s.t0_ns) / 1e3}, {"args", args}});
    }
  }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
}

void write_chrome_trace(ProcessGroup& group, const std::string& path, int64_t t0_ns) {
  auto all = gather_spans(group, timeline().spans(), 0);
  if (group.rank() != 0) return;
  std::ofstream f(path);
  if (!f) TRIDENT_THROW(IoError, "cannot write the Chrome trace '{}': check that its folder exists", path);
  f << chrome_trace(all, t0_ns).dump() << "\n";
  if (!f) TRIDENT_THROW(IoError, "writing the Chrome trace '{}' failed (disk full?)", path);
}

nlohmann::json summarize(const std::vector<std::vector<Span>>& per_rank, int64_t t0_ns, int64_t t1_ns) {
  nlohmann::json ranks = nlohmann::json::array();
  double max_b = 0, sum_b = 0, max_c = 0, max_w = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    RankProfile p = profile_spans(per_rank[r], t0_ns, t1_ns);
    ranks.push_back({{"rank", r}, {"window_s", p.window_s}, {"compute_s", p.compute_s}, {"comm_s", p.comm_s},
                     {"comm_total_s", p.comm_total_s}, {"idle_s", p.idle_s}, {"bubble_fraction", p.bubble_fraction},
                     {"bubble_ratio", p.bubble_ratio}, {"comm_bytes", p.comm_bytes}});
    max_b = std::max(max_b, p.bubble_fraction);
    sum_b += p.bubble_fraction;
    max_c = std::max(max_c, p.compute_s);
    max_w = std::max(max_w, p.window_s);
  }
  return {{"ranks", ranks},
          {"max_bubble_fraction", max_b},
          {"mean_bubble_fraction", per_rank.empty() ? 0.0 : sum_b / per_rank.size()},
          {"compute_s_max", max_c},
          {"step_window_s", max_w}};
}

nlohmann::json summarize(ProcessGroup& group, const std::vector<Span>& mine, int64_t t0_ns, int64_t t1_ns) {
  auto all = gather_spans(group, mine, 0);
  if (group.rank() != 0) return nullptr;
  return summarize(all, t0_ns, t1_ns);
}

std::string format_summary(const nlohmann::json& summary) {
  std::string out;
  if (!summary.is_object() || !summary.contains("ranks")) return out;
  for (const auto& r : summary["ranks"]) {
    double w = r["window_s"].get<double>();
    auto pct = [&](double x) { return w > 0 ? 100.0 * x / w : 0.0; };
    std::string comm;
    for (const auto& [name, s] : r["comm_s"].items())
      comm += fmt::format("{}{} {:.3f}", comm.empty() ? "" : ", ", name, s.get<double>());
    out += fmt::format("rank {}: compute {:.3f} s ({:.0f}%), comm {:.3f} s ({:.0f}%{}{}), idle {:.3f} s, bubble {:.1f}%\n",
                       r["rank"].get<int>(), r["compute_s"].get<double>(), pct(r["compute_s"].get<double>()),
                       r["comm_total_s"].get<double>(), pct(r["comm_total_s"].get<double>()),
                       comm.empty() ? "" : ": ", comm, r["idle_s"].get<double>(),
                       100.0 * r["bubble_fraction"].get<double>());
  }
  return out;
}

}  // namespace trident::parallel
