#include "trident/dashboard/event_stream.h"

#include <charconv>
#include <limits>

#include <nlohmann/json.hpp>

#include "trident/dashboard/run_data.h"

namespace trident::dashboard {

namespace {

// A decimal integer of at most 20 digits within [0, max], the whole of `s`.
bool parse_decimal(std::string_view s, uint64_t max, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out <= max;
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

std::optional<std::vector<StreamCursor>> parse_last_event_id(std::string_view id, uint64_t server_id, size_t runs,
                                                             std::string& error) {
  const auto bad = [&](const std::string& why) {
    error = "Last-Event-ID '" + std::string(id.substr(0, 60)) + "' " + why +
            ": expected the id of one of this dashboard's events (S:G.N,G.N,... with one G.N per run); drop the "
            "header to start over";
    return std::nullopt;
  };
  const size_t colon = id.find(':');
  uint64_t sid = 0;
  if (colon == std::string_view::npos || !parse_decimal(id.substr(0, colon), std::numeric_limits<uint64_t>::max(), sid))
    return bad("has no server number");
  std::vector<StreamCursor> cursors;
  std::string_view rest = id.substr(colon + 1);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    StreamCursor c;
    constexpr uint64_t kMax = std::numeric_limits<uint32_t>::max();
    // "G.N" or "G.N.H.M": two or four decimal fields.
    uint64_t* fields[] = {&c.generation, &c.next, &c.health_generation, &c.health_next};
    size_t nfields = 0;
    for (std::string_view rest_part = part;; ++nfields) {
      const size_t dot = rest_part.find('.');
      if (nfields == 4 || !parse_decimal(rest_part.substr(0, dot), kMax, *fields[nfields])) {
        nfields = 0;
        break;
      }
      if (dot == std::string_view::npos) {
        ++nfields;
        break;
      }
      rest_part = rest_part.substr(dot + 1);
    }
    if (nfields != 2 && nfields != 4) return bad("is malformed");
    cursors.push_back(c);
    if (cursors.size() > runs) break;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (cursors.size() != runs)
    return bad("names " + std::to_string(cursors.size()) + " run(s), this dashboard serves " + std::to_string(runs));
  if (sid != server_id) return std::vector<StreamCursor>(runs);  // another dashboard process: start over
  return cursors;
}

std::string format_event_id(uint64_t server_id, const std::vector<StreamCursor>& cursors) {
  std::string id = std::to_string(server_id) + ":";
  for (size_t i = 0; i < cursors.size(); ++i) {
    if (i > 0) id += ',';
    const StreamCursor& c = cursors[i];
    id += std::to_string(c.generation) + '.' + std::to_string(c.next) + '.' + std::to_string(c.health_generation) +
          '.' + std::to_string(c.health_next);
  }
  return id;
}

bool StreamHub::try_enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || active_ >= max_streams_) return false;
  ++active_;
  return true;
}

void StreamHub::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  --active_;
}

int StreamHub::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

void StreamHub::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

bool StreamHub::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void StreamHub::wait_for(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_; });
}

EventStream::EventStream(std::vector<RunFolder*> runs, std::vector<StreamCursor> from, uint64_t server_id,
                         StreamOptions options, StreamHub& hub)
    : runs_(std::move(runs)), cursors_(std::move(from)), server_id_(server_id), o_(options), hub_(hub) {
  cursors_.resize(runs_.size());
}

bool EventStream::pump(const std::function<bool(const std::string&)>& write) {
  if (hub_.stopping()) return false;
  const auto now = std::chrono::steady_clock::now();
  // Writes the runs' summaries when they changed since the last ones sent.
  const auto send_summaries = [&]() -> std::optional<bool> {
    nlohmann::json s = {{"runs", nlohmann::json::array()}};
    for (RunFolder* r : runs_) s["runs"].push_back(r->summary(30.0, 0.5));
    std::string text = dump(s);
    last_summary_ = now;
    if (text == last_summaries_) return false;
    if (!write("event: runs\ndata: " + text + "\n\n")) return std::nullopt;
    last_summaries_ = std::move(text);
    return true;
  };
  bool more = false, wrote = false;
  if (!started_) {
    // Reconnect after a second (the browser's default is three); the summaries go before any records, so
    // the page knows the runs' names first.
    if (!write("retry: 1000\n\n") || !send_summaries()) return false;
    started_ = true;
    last_write_ = now;
  }
  // Each run's new metrics records, then its new health rounds: one event each, with the cursor after it.
  for (size_t i = 0; i < runs_.size(); ++i) {
    for (const bool health : {false, true}) {
      StreamCursor& c = cursors_[i];
      uint64_t& generation = health ? c.health_generation : c.generation;
      uint64_t& next = health ? c.health_next : c.next;
      // A first event (generation 0, never a log's) is the run's thinned history; later ones are complete.
      nlohmann::json j = health ? runs_[i]->health_since(generation, next, o_.first_max_points, o_.batch_records)
                                : runs_[i]->records_since(generation, next, o_.first_max_points, o_.batch_records);
      const bool reset = j["reset"].get<bool>();
      if (!reset && j["records"].empty()) continue;
      // (A first answer always resets: a run without health.jsonl sends one empty health event.)
      generation = j["generation"].get<uint64_t>();
      next = j["next"].get<uint64_t>();
      more |= !reset && j["records"].size() >= o_.batch_records;
      j["run"] = i;
      if (!write("id: " + format_event_id(server_id_, cursors_) + "\nevent: " + (health ? "health" : "records") +
                 "\ndata: " + dump(j) + "\n\n"))
        return false;
      wrote = true;
    }
  }
  if (wrote || now - last_summary_ >= std::chrono::milliseconds(o_.summary_ms)) {
    const std::optional<bool> sent = send_summaries();
    if (!sent) return false;
    wrote |= *sent;
  }
  if (wrote) {
    last_write_ = now;
  } else if (now - last_write_ >= std::chrono::milliseconds(o_.keepalive_ms)) {
    if (!write(": keep-alive\n\n")) return false;
    last_write_ = now;
  }
  if (!more) hub_.wait_for(std::chrono::milliseconds(o_.tick_ms));
  return !hub_.stopping();
}

}  // namespace trident::dashboard
