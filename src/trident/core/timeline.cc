#include "trident/core/timeline.h"

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

ScopedSpan::ScopedSpan(SpanKind kind, const char* name, int microbatch, int chunk, double bytes)
    : on_(timeline().enabled()) {
  if (!on_) return;
  span_.kind = kind;
  span_.name = name;
  span_.microbatch = microbatch;
  span_.chunk = chunk;
  span_.bytes = bytes;
  span_.t0_ns = Timeline::now_ns();
}

ScopedSpan::~ScopedSpan() {
  if (!on_) return;
  span_.t1_ns = Timeline::now_ns();
  timeline().add(std::move(span_));
}

}  // namespace trident
