#include "trident/core/timeline.h"

#include <cstring>
#include <ctime>

namespace trident {

const char* span_kind_name(SpanKind k) {
  switch (k) {
    case SpanKind::kCompute: return "compute";
    case SpanKind::kComm: return "comm";
    case SpanKind::kIdle: return "idle";
  }
  return "?";
}

int64_t Timeline::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void Timeline::add(Span s) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(std::move(s));
}

std::vector<Span> Timeline::spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

void Timeline::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
}

Timeline& timeline() {
  static Timeline t;
  return t;
}

namespace {
thread_local ThreadWaits t_waits;
thread_local int t_comm_depth = 0;  // kComm spans open on this thread (nested ones are not counted twice)

bool is_pipeline_transfer(const char* name) {
  return std::strncmp(name, "send_", 5) == 0 || std::strncmp(name, "recv_", 5) == 0;
}
}  // namespace

ThreadWaits take_thread_waits() {
  const ThreadWaits w = t_waits;
  t_waits = {};
  return w;
}

ScopedSpan::ScopedSpan(SpanKind kind, const char* name, int microbatch, int chunk, double bytes)
    : on_(timeline().enabled()) {
  if (kind == SpanKind::kComm) {
    comm_ = true;
    if (t_comm_depth++ == 0) {
      counts_wait_ = true;
      pipeline_ = is_pipeline_transfer(name);
      wait_t0_ns_ = Timeline::now_ns();
    }
  }
  if (!on_) return;
  span_.kind = kind;
  span_.name = name;
  span_.microbatch = microbatch;
  span_.chunk = chunk;
  span_.bytes = bytes;
  span_.t0_ns = Timeline::now_ns();
}

ScopedSpan::~ScopedSpan() {
  int64_t t1 = 0;
  if (counts_wait_) {
    t1 = Timeline::now_ns();
    (pipeline_ ? t_waits.pipeline_ns : t_waits.collective_ns) += t1 - wait_t0_ns_;
  }
  if (comm_) --t_comm_depth;
  if (!on_) return;
  span_.t1_ns = t1 != 0 ? t1 : Timeline::now_ns();
  timeline().add(std::move(span_));
}

}  // namespace trident
