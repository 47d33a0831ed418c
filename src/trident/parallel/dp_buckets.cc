#include "trident/parallel/dp_buckets.h"

#include <algorithm>

#include "trident/core/timeline.h"

namespace trident::parallel {

BucketLayout reverse_order_buckets(const std::vector<nn::Parameter>& params, size_t n, size_t first_cap, size_t cap) {
  BucketLayout l;
  l.of_param.assign(params.size(), {-1, -1});
  cap = std::max<size_t>(1, cap);
  first_cap = std::clamp<size_t>(first_cap, 1, cap);
  auto& bs = l.buckets;
  // Buckets in reverse parameter order (the order backward produces gradients). A bucket is a contiguous
  // range of the flat buffer because parameters are laid out in order.
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const size_t lo = p.offset, hi = p.offset + p.numel;
    if (bs.empty() || bs.back().end - bs.back().begin >= (bs.size() == 1 ? first_cap : cap)) {
      GradBucket b;
      b.begin = lo;
      b.end = hi;
      bs.push_back(b);
    }
    GradBucket& b = bs.back();
    b.begin = std::min(b.begin, lo);
    b.end = std::max(b.end, hi);
    b.params++;
    const int i = static_cast<int>(bs.size() - 1);
    l.of_param[k] = {i, i};
  }
  // The first bucket also covers the alignment padding after the last parameter, and each bucket the
  // padding between its parameters and the next bucket's, so buckets tile [0, n) exactly.
  if (!bs.empty()) {
    bs.front().end = n;
    for (size_t i = 1; i < bs.size(); ++i) bs[i].end = bs[i - 1].begin;
    bs.back().begin = 0;
  }
  return l;
}

BucketLayout fixed_chunks(const std::vector<nn::Parameter>& params, size_t n, size_t C) {
  BucketLayout l;
  l.of_param.assign(params.size(), {-1, -1});
  for (size_t hi = n; hi > 0;) {
    const size_t lo = hi > C ? hi - C : 0;
    GradBucket b;
    b.begin = lo;
    b.end = hi;
    l.buckets.push_back(b);
    hi = lo;
  }
  // Chunks are in descending order: chunk i covers [n - (i+1)C, n - iC) (the last one from 0).
  auto index_of = [&](size_t e) { return static_cast<int>((n - 1 - e) / C); };
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    if (p.numel == 0) continue;
    const int first = index_of(p.offset + p.numel - 1), last = index_of(p.offset);
    l.of_param[k] = {first, last};
    for (int b = first; b <= last; ++b) l.buckets[b].params++;
  }
  return l;
}

BucketLayout unit_buckets(const std::vector<std::pair<size_t, size_t>>& ranges, const std::vector<int>& params_in,
                          const std::vector<int>& unit_of) {
  BucketLayout l;
  for (size_t i = 0; i < ranges.size(); ++i) {
    GradBucket b;
    b.begin = ranges[i].first;
    b.end = ranges[i].second;
    b.params = params_in[i];
    l.buckets.push_back(b);
  }
  l.of_param.resize(unit_of.size());
  for (size_t k = 0; k < unit_of.size(); ++k) l.of_param[k] = {unit_of[k], unit_of[k]};
  return l;
}

BucketEngine::BucketEngine(BucketLayout layout, bool overlap, Launch launch)
    : buckets_(std::move(layout.buckets)), of_param_(std::move(layout.of_param)), overlap_(overlap),
      launch_(std::move(launch)) {
  for (auto& b : buckets_) b.pending = b.params;
  timings_.assign(buckets_.size(), BucketTiming{});
}

void BucketEngine::launch(GradBucket& b) {
  b.launched_ns = Timeline::now_ns();
  b.launched = true;
  launch_(static_cast<size_t>(&b - buckets_.data()));
}

void BucketEngine::on_grad_ready(size_t param) {
  if (window_begin_ns_ == 0) window_begin_ns_ = Timeline::now_ns();  // backward of the syncing micro-step
  if (param >= of_param_.size()) return;
  const auto [first, last] = of_param_[param];
  if (first < 0) return;
  for (int bi = first; bi <= last; ++bi) {
    GradBucket& b = buckets_[bi];
    if (--b.pending == 0 && overlap_) launch(b);
  }
}

void BucketEngine::release_finished(bool wait, const std::function<void(const GradBucket&)>& release) {
  for (auto& b : buckets_) {
    if (!b.work || b.grads_released) continue;
    if (wait) b.work->wait();
    else if (!b.work->completed()) continue;
    b.work->wait();  // rethrows a failure
    release(b);
    b.grads_released = true;
  }
}

void BucketEngine::finish(bool launch_rest, const std::function<void()>& before_wait) {
  const int64_t window_end = Timeline::now_ns();  // backward is over (before any non-overlapped launch)
  if (launch_rest)
    for (auto& b : buckets_)
      if (!b.launched) launch(b);  // not overlapped
  if (before_wait) before_wait();
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  record_overlap(window_end, Timeline::now_ns());
  for (auto& b : buckets_) {
    b.work.reset();
    b.launched_ns = 0;
    b.grads_released = false;
    b.launched = false;
    b.pending = b.params;
  }
}

// One synced step's overlap: every bucket's collective has finished (its Work is still held).
void BucketEngine::record_overlap(int64_t window_end, int64_t sync_end) {
  OverlapStats o;
  o.window_begin_ns = window_begin_ns_ != 0 ? std::min(window_begin_ns_, window_end) : window_end;
  o.window_end_ns = window_end;
  o.sync_end_ns = sync_end;
  o.steps = 1;
  int64_t comm = 0, hidden = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& b = buckets_[i];
    BucketTiming& t = timings_[i];
    if (!b.work) {
      t = BucketTiming{};
      continue;
    }
    t.launched_ns = b.launched_ns;
    t.started_ns = b.work->started_ns() != 0 ? b.work->started_ns() : b.launched_ns;
    t.finished_ns = std::max(b.work->finished_ns(), t.started_ns);
    comm += t.finished_ns - t.started_ns;
    hidden += std::max<int64_t>(0, std::min(t.finished_ns, window_end) - std::max(t.started_ns, o.window_begin_ns));
  }
  o.backward_s = static_cast<double>(window_end - o.window_begin_ns) * 1e-9;
  o.comm_s = static_cast<double>(comm) * 1e-9;
  o.hidden_s = static_cast<double>(hidden) * 1e-9;
  o.exposed_s = static_cast<double>(sync_end - window_end) * 1e-9;
  last_overlap_ = o;
  overlap_totals_.backward_s += o.backward_s;
  overlap_totals_.comm_s += o.comm_s;
  overlap_totals_.hidden_s += o.hidden_s;
  overlap_totals_.exposed_s += o.exposed_s;
  overlap_totals_.steps += 1;
  window_begin_ns_ = 0;
}

void BucketEngine::drain() noexcept {
  for (auto& b : buckets_)
    if (b.work) {
      try {
        b.work->wait();
      } catch (const std::exception&) {
      }
    }
}

}  // namespace trident::parallel
