// The dashboard's server-sent events: one text/event-stream per page, for all its runs, that pushes each
// run's new metrics records as metrics.jsonl grows and the runs' summaries (status, restarts, steps) when
// they change, so the page needs no polling.
//
// Events (each a JSON object on one data: line):
//   event: runs     {"runs": [RunFolder::summary()...]}, first, then whenever a summary changes
//   event: records  {"run": i, "generation", "next", "reset", "records"}: RunFolder::records_since's answer
//                   for run i; every records event carries an id: the stream's cursor after it
//   event: health   the same for run i's health.jsonl (RunFolder::health_since), with an id likewise
// The id ("S:G.N.H.M,G.N.H.M,...": S the server's instance number, then each run's metrics generation and
// next record index and its health generation and next round, in run order; "G.N" alone, an id of a page
// from before health rounds were streamed, starts the health rounds over) is what a browser sends back as
// Last-Event-ID when it reconnects: the stream then resumes after the last record it delivered, with no gap and no duplicate. A run whose file was rewritten
// meanwhile (another generation), or an id from another server process (a restarted dashboard), starts that
// run (or every run) over with reset: true. A malformed id is the caller's 400 (parse_last_event_id).
//
// Memory: a stream holds its cursor and the last summaries it sent; the records live once, in the
// RunFolders, and an event carries at most `batch_records` of them (a first load: the thinned history).
//
// Ownership: the server owns the StreamHub; a stream borrows the hub and the RunFolders, which outlive it
// (the server joins its workers before destroying them). Thread-safety: StreamHub's methods are safe from
// any thread; an EventStream is its connection's worker's. Blocking: pump() waits up to one tick on the
// hub (stop() wakes it). Timeouts: a client that stops reading fails a write after the server's write
// timeout, and a client that went away fails the next keep-alive comment: either ends its stream.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trident::dashboard {

class RunFolder;

struct StreamCursor {
  uint64_t generation = 0;  // 0: nothing delivered yet (the first event is the run's thinned history)
  uint64_t next = 0;        // records of that generation delivered
  uint64_t health_generation = 0, health_next = 0;  // the same for health.jsonl
};

// The cursors of a Last-Event-ID, or nullopt with `error` saying what is wrong (for a 400). An id of
// another server instance (not `server_id`) gives fresh cursors: that server's generations mean nothing here.
std::optional<std::vector<StreamCursor>> parse_last_event_id(std::string_view id, uint64_t server_id, size_t runs,
                                                             std::string& error);
std::string format_event_id(uint64_t server_id, const std::vector<StreamCursor>& cursors);

struct StreamOptions {
  int tick_ms = 250;             // how often a stream looks for new records
  int keepalive_ms = 2000;       // a comment after this long without an event (finds departed clients)
  int summary_ms = 1000;         // how often a quiet stream compares the runs' summaries
  size_t batch_records = 500;    // records per event when resuming (a long gap comes in several events)
  size_t first_max_points = 2000;  // step records of a run's first event (downsample_indices)
};

// What the server's streams share: the stop signal and the count of open streams.
class StreamHub {
 public:
  explicit StreamHub(int max_streams) : max_streams_(max_streams) {}
  bool try_enter();  // false when max_streams are open (the caller answers 503)
  void leave();
  int active() const;
  void stop();  // wakes every stream, which then ends
  bool stopping() const;
  void wait_for(std::chrono::milliseconds d);  // until d passed or stop()

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int max_streams_;
  int active_ = 0;
  bool stopping_ = false;
};

class EventStream {
 public:
  EventStream(std::vector<RunFolder*> runs, std::vector<StreamCursor> from, uint64_t server_id,
              StreamOptions options, StreamHub& hub);
  // One round: writes what is new through `write` (false: the client is gone), then waits up to a tick
  // unless more records are pending. Returns false when the stream should end.
  bool pump(const std::function<bool(const std::string&)>& write);

 private:
  std::vector<RunFolder*> runs_;
  std::vector<StreamCursor> cursors_;
  uint64_t server_id_;
  StreamOptions o_;
  StreamHub& hub_;
  bool started_ = false;
  std::string last_summaries_;
  std::chrono::steady_clock::time_point last_write_, last_summary_;
};

}  // namespace trident::dashboard
