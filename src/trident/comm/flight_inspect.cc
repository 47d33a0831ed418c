#include "trident/comm/flight_inspect.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "trident/core/error.h"

namespace trident {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int64_t opt_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  return it->get<int64_t>();
}
std::string opt_str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  return it->get<std::string>();
}

// "0-2", "0,1", "0,2-4"
std::string rank_list(std::vector<int> r) {
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j >= i + 2 ? fmt::format("{}-{}", r[i], r[j]) : j == i + 1 ? fmt::format("{},{}", r[i], r[j])
                                                                       : fmt::format("{}", r[i]);
    i = j + 1;
  }
  return out;
}
std::string ranks_word(const std::vector<int>& r) {
  return fmt::format("{} {}", r.size() == 1 ? "rank" : "ranks", rank_list(r));
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.1f} s", s);
  return fmt::format("{:.1f} ms", s * 1e3);
}

std::string call_name(const DumpedCall& c) {
  if (c.seq > 0) return fmt::format("{} #{}", c.op, c.seq);
  return fmt::format("{} {} rank {} (tag {})", c.op, c.op == "send" ? "to" : "from", c.peer, c.tag);
}

// What a rank issued, as a mismatch sentence shows it: "all_reduce(count=4, float32, sum)".
std::string signature(const DumpedCall& c, bool with_count = true) {
  std::string s = c.op + "(";
  if (with_count) s += fmt::format("count={}, ", c.count);
  s += c.dtype;
  if (!c.redop.empty()) s += ", " + c.redop;
  if (c.root >= 0) s += fmt::format(", root {}", c.root);
  return s + ")";
}

std::string shorten(const std::string& s, size_t n = 240) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

// One group as merged over every rank's dump.
struct Merged {
  std::string name;
  int generation = 0, size = 0;
  std::vector<int> ranks;                            // global rank of each group rank
  std::map<int, const DumpedGroup*> by_rank;         // group rank -> its ring
  std::map<int, const RankDump*> dump_of;            // group rank -> its file
  int global(int r) const { return r < static_cast<int>(ranks.size()) ? ranks[static_cast<size_t>(r)] : r; }
  std::string label() const {
    std::vector<int> all;
    for (int r = 0; r < size; ++r) all.push_back(global(r));
    return fmt::format("group '{}' ({})", name, ranks_word(all));
  }
};

std::vector<Merged> merge(const std::vector<RankDump>& dumps) {
  std::map<std::tuple<std::string, int, int>, Merged> m;
  for (const auto& d : dumps)
    for (const auto& g : d.groups) {
      Merged& x = m[{g.name, g.generation, g.size}];
      x.name = g.name, x.generation = g.generation, x.size = g.size;
      if (x.ranks.empty() && !g.ranks.empty()) x.ranks = g.ranks;
      if (!x.by_rank.count(g.rank)) x.by_rank[g.rank] = &g, x.dump_of[g.rank] = &d;
    }
  std::vector<Merged> out;
  for (auto& [k, v] : m) out.push_back(std::move(v));
  // The world group first, then by name.
  std::stable_sort(out.begin(), out.end(), [](const Merged& a, const Merged& b) {
    return (a.name == "world") > (b.name == "world");
  });
  return out;
}

const DumpedCall* find_seq(const DumpedGroup& g, uint64_t seq) {
  for (const auto& c : g.calls)
    if (c.seq == seq) return &c;
  return nullptr;
}
uint64_t max_seq(const DumpedGroup& g) {
  uint64_t m = 0;
  for (const auto& c : g.calls) m = std::max(m, c.seq);
  return m;
}
int64_t arrival_us(const DumpedCall& c) { return c.start_us ? c.start_us : c.enqueue_us; }

// The first collective whose signatures differ between ranks.
bool find_mismatch(const Merged& g, std::vector<InspectFinding>& out, uint64_t* at) {
  std::set<uint64_t> seqs;
  for (auto& [r, dg] : g.by_rank)
    for (const auto& c : dg->calls)
      if (c.seq) seqs.insert(c.seq);
  for (uint64_t s : seqs) {
    std::map<std::string, std::vector<int>> issued;  // signature -> global ranks
    for (auto& [r, dg] : g.by_rank)
      if (const DumpedCall* c = find_seq(*dg, s)) issued[signature(*c, c->op != "all_gatherv")].push_back(g.global(r));
    if (issued.size() < 2) continue;
    std::vector<std::string> parts;
    for (auto& [sig, rs] : issued) parts.push_back(fmt::format("{} issued {}", ranks_word(rs), sig));
    InspectFinding f{InspectFinding::Kind::kMismatch, g.name, s, {}, {}};
    // The cause: the smallest set of ranks that issued the same thing.
    const auto& fewest = std::min_element(issued.begin(), issued.end(), [](auto& a, auto& b) {
                           return a.second.size() < b.second.size();
                         })->second;
    f.ranks = fewest;
    f.text = fmt::format("collective #{} of {} mismatched: {}.", s, g.label(), fmt::join(parts, "; "));
    out.push_back(std::move(f));
    *at = s;
    return true;
  }
  return false;
}

// One collective that did not complete on some rank that issued it: true when it explains something (a
// finding was added), false when it was only in flight when a rank dumped (it completed on another rank).
bool explain_stuck(const Merged& g, uint64_t stuck, std::vector<InspectFinding>& out) {
  std::vector<int> never, unknown, waiting, no_dump, done;
  std::vector<double> waits;
  const DumpedCall* example = nullptr;
  std::map<std::string, std::vector<int>> errors;  // error type -> ranks
  std::string first_error;
  for (int r = 0; r < g.size; ++r) {
    auto it = g.by_rank.find(r);
    if (it == g.by_rank.end()) {
      no_dump.push_back(g.global(r));
      continue;
    }
    const DumpedCall* c = find_seq(*it->second, stuck);
    if (!c) {
      if (max_seq(*it->second) < stuck) never.push_back(g.global(r));  // sorted out below by dump time
      continue;  // else: older than its ring
    }
    if (c->state == "completed") {
      done.push_back(g.global(r));
      continue;
    }
    example = example ? example : c;
    waiting.push_back(g.global(r));
    const int64_t until = c->end_us ? c->end_us : g.dump_of.at(r)->dump_time_us;
    waits.push_back(static_cast<double>(until - arrival_us(*c)) / 1e6);
    if (!c->error_type.empty()) {
      errors[c->error_type].push_back(g.global(r));
      if (first_error.empty()) first_error = c->error;
    }
  }
  if (!example) return false;
  // Dumps are not taken at one instant (SIGUSR1 of a live job): a rank that dumped before the first waiting
  // rank arrived says nothing about this collective.
  int64_t first_arrival = 0;
  for (auto& [r, dg] : g.by_rank)
    if (const DumpedCall* c = find_seq(*dg, stuck); c && c->state != "completed")
      if (!first_arrival || arrival_us(*c) < first_arrival) first_arrival = arrival_us(*c);
  std::erase_if(never, [&](int gr) {
    for (auto& [r, d] : g.dump_of)
      if (g.global(r) == gr && d->dump_time_us < first_arrival) return unknown.push_back(gr), true;
    return false;
  });
  if (errors.empty() && !done.empty()) return false;  // it completed elsewhere: in flight at a rank's dump
  const std::string what = fmt::format("{} #{} of {}", example->op, stuck, g.label());
  std::string wait_text;
  if (!waits.empty()) {
    const auto [lo, hi] = std::minmax_element(waits.begin(), waits.end());
    wait_text = *hi - *lo <= 0.1 * *hi + 0.05 ? seconds_text(*hi)
                                              : fmt::format("{} to {}", seconds_text(*lo), seconds_text(*hi));
  }
  std::string ending;
  if (!errors.empty()) {
    std::vector<std::string> e;
    for (auto& [type, rs] : errors) e.push_back(fmt::format("{} on {}", type, ranks_word(rs)));
    ending = fmt::format(" and failed ({})", fmt::join(e, ", "));
  } else {
    ending = waiting.size() == 1 ? " and was still waiting at its dump" : " and were still waiting at their dumps";
  }
  InspectFinding f{InspectFinding::Kind::kHang, g.name, stuck, {}, {}};
  if (!never.empty()) {
    f.ranks = never;
    f.text = fmt::format("{} never entered {}; {} waited {}{}.", ranks_word(never), what, ranks_word(waiting),
                         wait_text, ending);
    // Where the missing ranks were instead: an unfinished call of theirs in another group, else their last call.
    for (int gr : never) {
      for (auto& [r, dg] : g.by_rank) {
        if (g.global(r) != gr) continue;
        const RankDump* d = g.dump_of.at(r);
        std::string where;
        for (const auto& og : d->groups)
          for (const auto& c : og.calls)
            if (c.state == "started" || c.state == "queued")
              where = fmt::format(" Rank {} was in {} of group '{}' instead ({} since {} before its dump).", gr,
                                  call_name(c), og.name, c.state,
                                  seconds_text(static_cast<double>(d->dump_time_us - arrival_us(c)) / 1e6));
        if (where.empty() && !dg->calls.empty()) {
          const DumpedCall& last = dg->calls.back();
          where = fmt::format(" Rank {}'s last call in the group was {} ({}, {} before its dump).", gr,
                              call_name(last), last.state,
                              seconds_text(static_cast<double>(d->dump_time_us - (last.end_us ? last.end_us
                                                                                                 : arrival_us(last))) /
                                           1e6));
        }
        f.text += where;
      }
    }
    if (!no_dump.empty()) f.text += fmt::format(" {} left no dump.", ranks_word(no_dump));
    if (!unknown.empty()) f.text += fmt::format(" {} dumped before it began.", ranks_word(unknown));
  } else if (!no_dump.empty()) {
    f.ranks = no_dump;
    f.text = fmt::format("{} waited {} in {}{}; {} left no dump, so whether {} entered it is unknown (a rank that "
                         "died writes none: look for PeerDiedError and its exit status).",
                         ranks_word(waiting), wait_text, what, ending, ranks_word(no_dump),
                         no_dump.size() == 1 ? "it" : "they");
  } else if (errors.empty()) {
    f.kind = InspectFinding::Kind::kInFlight;
    f.ranks = waiting;
    f.text = fmt::format("{} was in progress on {} ({}) when {} dumped{}; nothing shows a rank stuck.", what,
                         ranks_word(waiting), wait_text, waiting.size() == 1 ? "it" : "they",
                         unknown.empty() ? "" : fmt::format(" ({} dumped before it began)", ranks_word(unknown)));
  } else {
    f.kind = InspectFinding::Kind::kFailure;
    f.ranks = waiting;
    f.text = fmt::format("every rank entered {}; it did not complete on {} (waited {}){}{}", what,
                         ranks_word(waiting), wait_text, ending,
                         first_error.empty() ? "." : fmt::format(": {}", shorten(first_error)));
  }
  out.push_back(std::move(f));
  return true;
}

// The oldest collective that did not complete and that a dump explains (skipping ones merely in flight).
void find_hang(const Merged& g, uint64_t mismatch_seq, std::vector<InspectFinding>& out) {
  std::set<uint64_t> open;
  for (auto& [r, dg] : g.by_rank)
    for (const auto& c : dg->calls)
      if (c.seq && c.state != "completed") open.insert(c.seq);
  for (uint64_t s : open) {
    if (s == mismatch_seq) return;  // the mismatch finding explains it
    if (explain_stuck(g, s, out)) return;
  }
}

void find_slowest(const Merged& g, int last_k, std::vector<InspectFinding>& out) {
  if (g.size < 2 || static_cast<int>(g.by_rank.size()) != g.size || last_k <= 0) return;
  std::set<uint64_t> common;
  for (const auto& c : g.by_rank.begin()->second->calls)
    if (c.seq && c.state == "completed") common.insert(c.seq);
  for (auto& [r, dg] : g.by_rank) {
    std::set<uint64_t> mine;
    for (const auto& c : dg->calls)
      if (c.seq && c.state == "completed" && arrival_us(c)) mine.insert(c.seq);
    std::set<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::inserter(both, both.end()));
    common.swap(both);
  }
  if (common.empty()) return;
  std::vector<uint64_t> seqs(common.begin(), common.end());
  if (static_cast<int>(seqs.size()) > last_k) seqs.erase(seqs.begin(), seqs.end() - last_k);
  std::vector<double> late(static_cast<size_t>(g.size), 0.0);
  std::vector<int> last(static_cast<size_t>(g.size), 0);
  for (uint64_t s : seqs) {
    std::vector<int64_t> t(static_cast<size_t>(g.size));
    for (auto& [r, dg] : g.by_rank) t[static_cast<size_t>(r)] = arrival_us(*find_seq(*dg, s));
    const int64_t first = *std::min_element(t.begin(), t.end());
    const auto lastit = std::max_element(t.begin(), t.end());
    ++last[static_cast<size_t>(lastit - t.begin())];
    for (int r = 0; r < g.size; ++r) late[static_cast<size_t>(r)] += static_cast<double>(t[static_cast<size_t>(r)] - first);
  }
  const double n = static_cast<double>(seqs.size());
  const int worst = static_cast<int>(std::max_element(late.begin(), late.end()) - late.begin());
  std::vector<std::string> each;
  for (int r = 0; r < g.size; ++r)
    each.push_back(fmt::format("rank {} {}", g.global(r), seconds_text(late[static_cast<size_t>(r)] / n / 1e6)));
  std::set<std::string> hosts;
  for (auto& [r, d] : g.dump_of) hosts.insert(d->host);
  InspectFinding f{InspectFinding::Kind::kSlowest, g.name, 0, {g.global(worst)}, {}};
  f.text = fmt::format("slowest to arrive in {} over its last {} completed collectives (#{}-#{}): rank {}, on "
                       "average {} after the first rank and last in {} of {} (mean lateness: {}){}.",
                       g.label(), seqs.size(), seqs.front(), seqs.back(), g.global(worst),
                       seconds_text(late[static_cast<size_t>(worst)] / n / 1e6), last[static_cast<size_t>(worst)],
                       seqs.size(), fmt::join(each, ", "),
                       hosts.size() > 1 ? fmt::format("; the ranks are on {} hosts, so lateness includes the offset "
                                                      "between their clocks",
                                                      hosts.size())
                                        : "");
  out.push_back(std::move(f));
}

// Point-to-point calls that never completed (a pipeline waiting on a stage), when no collective explains it.
void find_p2p(const Merged& g, std::vector<InspectFinding>& out) {
  for (auto& [r, dg] : g.by_rank)
    for (const auto& c : dg->calls) {
      if (c.seq || c.state == "completed") continue;
      const int64_t until = c.end_us ? c.end_us : g.dump_of.at(r)->dump_time_us;
      const double waited = static_cast<double>(until - arrival_us(c)) / 1e6;
      InspectFinding f{c.state == "failed" ? InspectFinding::Kind::kFailure
                       : waited >= 1.0     ? InspectFinding::Kind::kHang
                                           : InspectFinding::Kind::kInFlight,
                       g.name, 0, {g.global(r)}, {}};
      f.text = fmt::format("rank {}'s {} of {} did not complete ({} after {}){}.", g.global(r), call_name(c),
                           g.label(), c.state, seconds_text(static_cast<double>(until - arrival_us(c)) / 1e6),
                           c.error.empty() ? "" : fmt::format(": {}", shorten(c.error)));
      out.push_back(std::move(f));
      break;  // the oldest one per rank
    }
}

}  // namespace

RankDump parse_flight_dump(const std::string& text, const std::string& file) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large
    TRIDENT_THROW(IoError,
                  "flight-recorder dump '{}' is not valid JSON (truncated or corrupt: {}); a dump is written to a "
                  "temporary file and renamed, so a cut-off one was copied or edited after it was written",
                  file, e.what());
  }
  RankDump d;
  d.file = file;
  try {
    if (!doc.is_object() || doc.value("format", std::string()) != "trident-flight-recorder")
      TRIDENT_THROW(IoError, "'{}' is not a trident flight-recorder dump (no \"format\": \"trident-flight-recorder\")",
                    file);
    const int version = doc.at("version").get<int>();
    if (version != 1)
      TRIDENT_THROW(IoError, "flight-recorder dump '{}' has version {}; this trident reads version 1", file, version);
    d.rank = doc.at("rank").get<int>();
    d.pid = doc.at("pid").get<int>();
    d.host = doc.at("host").get<std::string>();
    d.reason = doc.at("reason").get<std::string>();
    d.dump_time_us = doc.at("dump_time_us").get<int64_t>();
    for (const auto& jg : doc.at("groups")) {
      DumpedGroup g;
      g.name = jg.at("name").get<std::string>();
      g.generation = jg.at("generation").get<int>();
      g.rank = jg.at("rank").get<int>();
      g.size = jg.at("size").get<int>();
      g.ranks = jg.at("ranks").get<std::vector<int>>();
      g.backend = jg.at("backend").get<std::string>();
      g.issued = jg.at("issued").get<uint64_t>();
      g.capacity = jg.at("capacity").get<uint64_t>();
      if (g.size < 1 || g.rank < 0 || g.rank >= g.size || (!g.ranks.empty() && g.ranks.size() != static_cast<size_t>(g.size)))
        TRIDENT_THROW(IoError, "flight-recorder dump '{}': group '{}' has rank {} of size {} and {} global ranks", file,
                      g.name, g.rank, g.size, g.ranks.size());
      for (const auto& jr : jg.at("records")) {
        DumpedCall c;
        c.id = jr.at("id").get<uint64_t>();
        c.seq = jr.at("seq").get<uint64_t>();
        c.op = jr.at("op").get<std::string>();
        c.count = jr.at("count").get<uint64_t>();
        c.bytes = jr.at("bytes").get<uint64_t>();
        c.dtype = jr.at("dtype").get<std::string>();
        c.redop = opt_str(jr, "redop");
        c.root = jr.at("root").get<int>();
        c.peer = jr.at("peer").get<int>();
        c.tag = jr.at("tag").get<uint32_t>();
        c.algo = opt_str(jr, "algo");
        c.state = jr.at("state").get<std::string>();
        c.enqueue_us = opt_int(jr, "enqueue_us");
        c.start_us = opt_int(jr, "start_us");
        c.end_us = opt_int(jr, "end_us");
        c.error_type = opt_str(jr, "error_type");
        c.error = opt_str(jr, "error");
        g.calls.push_back(std::move(c));
      }
      d.groups.push_back(std::move(g));
    }
  } catch (const json::exception& e) {
    TRIDENT_THROW(IoError, "flight-recorder dump '{}': a field is missing or has the wrong type: {}", file, e.what());
  }
  return d;
}

std::vector<RankDump> load_flight_dumps(const std::string& dir_in) {
  std::error_code ec;
  if (!fs::exists(dir_in, ec))
    TRIDENT_THROW(IoError, "inspect: folder '{}' does not exist (pass the folder the ranks dumped to: "
                           "TRIDENT_FLIGHT_RECORDER_DIR, or a trident train run's out_dir)", dir_in);
  if (!fs::is_directory(dir_in, ec)) TRIDENT_THROW(IoError, "inspect: '{}' is not a folder", dir_in);
  auto dumps_in = [](const fs::path& dir) {
    std::vector<fs::path> files;
    std::error_code e;
    for (const auto& entry : fs::directory_iterator(dir, e)) {
      const std::string n = entry.path().filename().string();
      if (entry.is_regular_file(e) && n.size() > 5 && n.ends_with(".json") &&
          (n.starts_with("rank_") || n.starts_with("pid_")))
        files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    return files;
  };
  std::vector<fs::path> files = dumps_in(dir_in);
  if (files.empty() && fs::is_directory(fs::path(dir_in) / "flight_recorder", ec))
    files = dumps_in(fs::path(dir_in) / "flight_recorder");
  if (files.empty())
    TRIDENT_THROW(IoError,
                  "inspect: no flight-recorder dumps (rank_<R>.json) in '{}'. Ranks write them when a collective fails "
                  "(deadline, dead peer, mismatch), on SIGTERM or SIGUSR1, or on request, into "
                  "TRIDENT_FLIGHT_RECORDER_DIR (trident train: <out_dir>/flight_recorder)",
                  dir_in);
  std::vector<RankDump> out;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    if (!in) TRIDENT_THROW(IoError, "inspect: cannot read '{}'", p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(parse_flight_dump(ss.str(), p.string()));
  }
  std::stable_sort(out.begin(), out.end(), [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  return out;
}

InspectReport inspect_flight_dumps(const std::vector<RankDump>& dumps, int last_k) {
  InspectReport rep;
  for (const auto& d : dumps) {
    uint64_t calls = 0;
    for (const auto& g : d.groups) calls += g.calls.size();
    rep.dumps.push_back(fmt::format("rank {} ({}, pid {}): {} group{}, {} calls recorded; dumped on {}", d.rank,
                                    d.host, d.pid, d.groups.size(), d.groups.size() == 1 ? "" : "s", calls, d.reason));
  }
  const std::vector<Merged> groups = merge(dumps);
  std::vector<InspectFinding> problems, slow;
  for (const auto& g : groups) {
    uint64_t mismatch_seq = 0;
    find_mismatch(g, problems, &mismatch_seq);
    const size_t before = problems.size();
    find_hang(g, mismatch_seq, problems);
    if (problems.size() == before && !mismatch_seq) find_p2p(g, problems);
    find_slowest(g, last_k, slow);
  }
  // A rank that never entered a collective explains the rest: those first, then mismatches, then failures.
  std::stable_sort(problems.begin(), problems.end(), [](const InspectFinding& a, const InspectFinding& b) {
    auto order = [](const InspectFinding& f) {
      return f.kind == InspectFinding::Kind::kHang       ? 0
             : f.kind == InspectFinding::Kind::kMismatch ? 1
             : f.kind == InspectFinding::Kind::kFailure  ? 2
                                                         : 3;
    };
    return order(a) < order(b);
  });
  rep.findings = std::move(problems);
  for (auto& f : slow) rep.findings.push_back(std::move(f));
  return rep;
}

std::string InspectReport::text() const {
  std::string s = fmt::format("{} dump{}:\n", dumps.size(), dumps.size() == 1 ? "" : "s");
  for (const auto& d : dumps) s += "  " + d + "\n";
  bool any_problem = false;
  for (const auto& f : findings)
    any_problem |= f.kind != InspectFinding::Kind::kSlowest && f.kind != InspectFinding::Kind::kInFlight;
  if (!any_problem) s += "no collective is stuck, mismatched or failed in the recorded calls.\n";
  for (const auto& f : findings) s += f.text + "\n";
  return s;
}

void write_flight_trace(const std::vector<RankDump>& dumps, const std::string& path) {
  int64_t t0 = 0;
  for (const auto& d : dumps)
    for (const auto& g : d.groups)
      for (const auto& c : g.calls)
        if (const int64_t t = c.enqueue_us ? c.enqueue_us : c.start_us; t && (!t0 || t < t0)) t0 = t;
  std::map<std::string, int> tids;
  json events = json::array();
  for (const auto& d : dumps) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", d.rank},
                      {"args", {{"name", fmt::format("rank {} ({})", d.rank, d.host)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", d.rank}, {"args", {{"sort_index", d.rank}}}});
    for (const auto& g : d.groups) {
      const std::string key = fmt::format("{}#{}", g.name, g.generation);
      auto [it, fresh] = tids.emplace(key, static_cast<int>(tids.size()) + 1);
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", d.rank}, {"tid", it->second},
                        {"args", {{"name", g.generation ? key : g.name}}}});
      for (const auto& c : g.calls) {
        const int64_t begin = arrival_us(c);
        if (!begin) continue;
        const int64_t end = c.end_us ? c.end_us : d.dump_time_us;
        json args = {{"seq", c.seq}, {"state", c.state}, {"count", c.count}, {"bytes", c.bytes}, {"dtype", c.dtype}};
        if (!c.algo.empty()) args["algo"] = c.algo;
        if (!c.redop.empty()) args["redop"] = c.redop;
        if (c.root >= 0) args["root"] = c.root;
        if (c.start_us && c.enqueue_us) args["queued_us"] = c.start_us - c.enqueue_us;
        if (!c.error.empty()) args["error"] = c.error_type + ": " + c.error;
        events.push_back({{"ph", "X"}, {"name", call_name(c)}, {"cat", g.name}, {"pid", d.rank}, {"tid", it->second},
                          {"ts", begin - t0}, {"dur", std::max<int64_t>(end - begin, 0)}, {"args", std::move(args)}});
      }
    }
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) TRIDENT_THROW(IoError, "inspect: cannot write trace '{}'", tmp);
    out << doc.dump();
    if (!out.flush()) TRIDENT_THROW(IoError, "inspect: writing trace '{}' failed (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) TRIDENT_THROW(IoError, "inspect: renaming '{}' to '{}' failed: {}", tmp, path, ec.message());
}

}  // namespace trident
