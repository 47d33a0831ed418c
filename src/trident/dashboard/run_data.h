// What `trident dashboard` and `trident report` know about a training run: its folder's metrics.jsonl and
// health.jsonl (the health monitor's rounds) read incrementally while the run writes them, plus the run's
// status, restarts, checkpoint configuration and, for a failed or hung run, `trident inspect`'s explanation of its flight-recorder dumps.
//
// MetricsLog: a growing JSON-lines file read from where the last read stopped. An incomplete last line (a
// record being written) waits for the next read; a complete line that is not a JSON object is skipped and
// counted. A file that shrank, or whose bytes just before the read offset changed (the trainer rewrites
// metrics.jsonl when a run restarts from its checkpoint), is read again from the start under a new
// generation number, so a reader that asks "records from N of generation G" is told to start over.
//
// RunFolder: one named run folder. The constructor checks the folder (exists, is a directory, holds
// metrics.jsonl) and throws InvalidArgument naming it and the fix. Every other method never throws on the
// run's data: what cannot be read is reported in the JSON ("error" fields).
//
// Ownership: a RunFolder owns its log. Thread-safety: RunFolder's methods may be called from several threads
// (the HTTP server's workers; one mutex); MetricsLog is one thread's. Blocking: file reads only. No timeouts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident::dashboard {

class MetricsLog {
 public:
  explicit MetricsLog(std::string path);
  // Reads what was appended since the last call (or everything after a rewrite); true when records changed.
  // A missing file reads as empty.
  bool refresh();
  const std::vector<nlohmann::json>& records() const { return records_; }
  uint64_t generation() const { return generation_; }  // goes up each time the file is read again from 0
  size_t bad_lines() const { return bad_lines_; }       // complete lines that were not JSON objects
  int rewrites() const { return rewrites_; }            // times the file was seen rewritten (shrunk or changed)

 private:
  void reset();
  std::string path_;
  uint64_t offset_ = 0;    // bytes consumed: always the end of a complete line
  std::string last_line_;  // the bytes of the last complete line consumed, newline included (rewrite check)
  std::vector<nlohmann::json> records_;
  uint64_t generation_ = 1;
  size_t bad_lines_ = 0;
  int rewrites_ = 0;
};

// Indices of at most `max_points` of `n` points, evenly spread, always including the first and the last.
// max_points < 2 is taken as 2; n <= max_points gives every index.
std::vector<size_t> downsample_indices(size_t n, size_t max_points);

class RunFolder {
 public:
  // `dir`: the run's out_dir; `id`: how the server names it in URLs (its index).
  RunFolder(std::string dir, int id);
  const std::string& dir() const { return dir_; }
  int id() const { return id_; }
  // {id, name, dir, status, restarts, steps, evals, generation, bad_lines, checkpoint, inspect}: status is
  // "finished" (a final or measured record), "failed" / "hung" (flight-recorder dumps; inspect holds their
  // explanation), "running" (metrics written in the last `live_s` seconds) or "stopped".
  // `max_age_s`: a summary of the same records computed that recently is returned as is (the event streams
  // share one instead of each reading the folder).
  nlohmann::json summary(double live_s = 30.0, double max_age_s = 0);
  // {generation, next, reset, records}: the records from index `from` of generation `generation`, or every
  // record (reset: true) when the generation changed or `from` is past the end. The step records of the
  // answer are thinned to at most `max_points` (downsample_indices; other records all come), so a first
  // load of a long run stays small while later polls, which ask for the few new records, get each one.
  // Unless the answer resets, it holds at most `max_records` records (`next` says where the rest begin).
  nlohmann::json records_since(uint64_t generation, size_t from, size_t max_points,
                               size_t max_records = static_cast<size_t>(-1));
  // The same over health.jsonl (the health monitor's rounds, train/health.h; a missing file reads as no
  // records): rounds are thinned to `max_points`, except those that raised events, which always come.
  nlohmann::json health_since(uint64_t generation, size_t from, size_t max_points,
                              size_t max_records = static_cast<size_t>(-1));

 private:
  std::mutex mu_;
  std::string dir_;
  int id_;
  MetricsLog log_;
  MetricsLog health_;  // health.jsonl
  // Record counts by type, kept up to date incrementally (a poll of a long run costs its new records only).
  struct Counts {
    uint64_t generation = 0;
    size_t counted = 0;  // records of that generation counted
    int runs = 0, steps = 0, evals = 0;
    bool finished = false;
  } counts_;
  nlohmann::json cached_;  // the last summary, of `cached_count_` records of generation `cached_generation_`
  uint64_t cached_generation_ = 0;
  size_t cached_count_ = 0;
  std::chrono::steady_clock::time_point cached_at_;
};

}  // namespace trident::dashboard
