#include "trident/parallel/pipeline.h"

#include <fmt/format.h>

#include <exception>

#include "trident/comm/work.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"

namespace trident::parallel {

namespace {
constexpr int kAct = 0, kGrad = 1;
}  // namespace

struct PipelineEngine::Pending {
  std::shared_ptr<Work> work;
  std::vector<float> buf;
  const char* name = "";
  double bytes = 0;
  int mb = -1, chunk = -1;
};

PipelineEngine::PipelineEngine(std::vector<Stage*> chunks, std::shared_ptr<ProcessGroup> pp_group,
                               PipelineOptions options)
    : chunks_(std::move(chunks)), pp_(std::move(pp_group)), opt_(options) {
  P_ = pp_ ? pp_->size() : 1;
  p_ = pp_ ? pp_->rank() : 0;
  const int v = opt_.virtual_stages, m = opt_.microbatches;
  schedule_ = make_schedule(opt_.schedule, P_, m, v);  // validates P, m, v
  TRIDENT_CHECK(static_cast<int>(chunks_.size()) == v, InvalidArgument,
                "pipeline rank {}: {} model chunks given for {} virtual stages per rank", p_, chunks_.size(), v);
  const int S = P_ * v;
  for (int c = 0; c < v; ++c) {
    TRIDENT_CHECK(chunks_[c] != nullptr, InvalidArgument, "pipeline rank {}: chunk {} is null", p_, c);
    const int s = vstage(c);
    TRIDENT_CHECK(chunks_[c]->is_first() == (s == 0), InvalidArgument,
                  "pipeline rank {} chunk {} is virtual stage {} of {}, but its Stage says is_first() = {}", p_, c, s,
                  S, chunks_[c]->is_first());
    TRIDENT_CHECK(chunks_[c]->is_last() == (s == S - 1), InvalidArgument,
                  "pipeline rank {} chunk {} is virtual stage {} of {}, but its Stage says is_last() = {}", p_, c, s, S,
                  chunks_[c]->is_last());
  }
  next_ = (p_ + 1) % P_;
  prev_ = (p_ - 1 + P_) % P_;
}

PipelineEngine::~PipelineEngine() {
  // Only a failed step leaves transfers behind; their groups are aborted, so these finish at once.
  drain_after_failure();
}

uint32_t PipelineEngine::tag(int kind, int stage, int mb) const {
  const uint64_t S = static_cast<uint64_t>(P_) * opt_.virtual_stages;
  return static_cast<uint32_t>((kind * S + stage) * opt_.microbatches + mb);
}

std::vector<float> PipelineEngine::acquire(size_t n) {
  std::vector<float> b;
  if (!pool_.empty()) {
    b = std::move(pool_.back());
    pool_.pop_back();
  }
  b.resize(n);
  return b;
}

void PipelineEngine::release(std::vector<float>&& buf) {
  if (buf.capacity() > 0) pool_.push_back(std::move(buf));
}

void PipelineEngine::fail_all(const std::string& reason) {
  failed_ = true;
  if (pp_ && P_ > 1) {
    try {
      pp_->abort(reason);
    } catch (...) {
    }
  }
}

void PipelineEngine::drain_after_failure() {
  for (auto& s : sends_) {
    try {
      s->work->wait();
    } catch (...) {
    }
  }
  sends_.clear();
  for (auto& [t, r] : recvs_) {
    try {
      r->work->wait();
    } catch (...) {
    }
  }
  recvs_.clear();
  local_.clear();
}

double PipelineEngine::run(const int32_t* tokens, const int32_t* targets, int B, int T, bool backward,
                           float loss_scale) {
  TRIDENT_CHECK(!failed_, InvalidArgument,
                "pipeline rank {}: an earlier step failed and aborted the pipeline groups; rebuild the job", p_);
  const int m = opt_.microbatches, v = opt_.virtual_stages, S = P_ * v;
  TRIDENT_CHECK(B >= 1 && T >= 1, InvalidArgument, "pipeline: batch {} x {} positions must be positive", B, T);
  TRIDENT_CHECK(B % m == 0, InvalidArgument,
                "pipeline: the batch of {} rows does not split into {} microbatches (--microbatches must divide the "
                "per-rank batch size)",
                B, m);
  const int rows = B / m;
  const float mb_scale = loss_scale / static_cast<float>(m);
  const std::vector<Action> actions = backward ? schedule_[p_] : forward_only(schedule_)[p_];
  stats_ = {};
  for (Stage* c : chunks_) {
    TRIDENT_CHECK(c->activation_numel(rows, T) > 0, InvalidArgument, "pipeline: a stage reports zero activation");
  }

  // Receives this rank will need, in action order.
  struct Need {
    size_t action;
    int kind, chunk, mb;
  };
  std::vector<Need> needs;
  if (P_ > 1)
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      const int s = vstage(a.chunk);
      if (a.type == Action::kForward && s > 0) needs.push_back({i, kAct, a.chunk, a.mb});
      if (a.type == Action::kBackward && s < S - 1) needs.push_back({i, kGrad, a.chunk, a.mb});
    }
  size_t next_need = 0;

  auto post_recvs_until = [&](size_t action_index) {
    while (next_need < needs.size() && needs[next_need].action <= action_index) {
      const Need& n = needs[next_need++];
      const int s = vstage(n.chunk);
      const size_t count = chunks_[n.chunk]->activation_numel(rows, T);
      auto p = std::make_unique<Pending>();
      p->buf = acquire(count);
      p->bytes = static_cast<double>(count * sizeof(float));
      p->mb = n.mb;
      p->chunk = n.chunk;
      uint32_t t;
      if (n.kind == kAct) {
        p->name = "recv_act";
        t = tag(kAct, s - 1, n.mb);
        p->work = pp_->recv_async(p->buf.data(), count, DType::kFloat32, prev_, t);
      } else {
        p->name = "recv_grad";
        t = tag(kGrad, s + 1, n.mb);
        p->work = pp_->recv_async(p->buf.data(), count, DType::kFloat32, next_, t);
      }
      recvs_[t] = std::move(p);
    }
  };
  // The data of (kind, from-stage, mb): received (waited on here) or handed over locally.
  auto take = [&](int kind, int from_stage, int mb) -> std::vector<float> {
    const uint32_t t = tag(kind, from_stage, mb);
    if (P_ == 1) {
      auto it = local_.find(t);
      TRIDENT_CHECK(it != local_.end(), InvalidArgument, "pipeline: internal: no local hand-off for tag {}", t);
      std::vector<float> b = std::move(it->second);
      local_.erase(it);
      return b;
    }
    auto it = recvs_.find(t);
    TRIDENT_CHECK(it != recvs_.end(), InvalidArgument, "pipeline: internal: receive for tag {} was not posted", t);
    Pending& r = *it->second;
    {
      ScopedSpan span(SpanKind::kComm, r.name, r.mb, r.chunk, r.bytes);
      r.work->wait();
    }
    ++stats_.recvs;
    stats_.bytes_received += r.bytes;
    std::vector<float> b = std::move(r.buf);
    recvs_.erase(it);
    return b;
  };
  auto finish_send = [&](Pending& s) {
    ScopedSpan span(SpanKind::kComm, s.name, s.mb, s.chunk, s.bytes);
    s.work->wait();
  };
  auto reap_sends = [&](bool all) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (all || (*it)->work->completed()) {
        finish_send(**it);
        release(std::move((*it)->buf));
        it = sends_.erase(it);
      } else {
        ++it;
      }
    }
  };
  // Sends (or hands over) the data of (kind, from-stage, mb).
  auto give = [&](int kind, int chunk, int mb, std::vector<float>&& buf) {
    const int s = vstage(chunk);
    const uint32_t t = tag(kind, s, mb);
    if (P_ == 1) {
      local_[t] = std::move(buf);
      return;
    }
    auto p = std::make_unique<Pending>();
    p->buf = std::move(buf);
    p->bytes = static_cast<double>(p->buf.size() * sizeof(float));
    p->mb = mb;
    p->chunk = chunk;
    p->name = kind == kAct ? "send_act" : "send_grad";
    p->work = pp_->send_async(p->buf.data(), p->buf.size(), DType::kFloat32, kind == kAct ? next_ : prev_, t);
    ++stats_.sends;
    stats_.bytes_sent += p->bytes;
    sends_.push_back(std::move(p));
  };

  double loss_sum = 0;
  try {
    for (size_t i = 0; i < actions.size(); ++i) {
      post_recvs_until(i + kRecvLookahead);
      const Action& a = actions[i];
      Stage& st = *chunks_[a.chunk];
      const int s = vstage(a.chunk);
      const size_t off = static_cast<size_t>(a.mb) * rows * T;
      if (a.type == Action::kForward) {
        std::vector<float> in;
        if (s > 0) in = take(kAct, s - 1, a.mb);
        std::vector<float> out;
        if (s < S - 1) out = acquire(st.activation_numel(rows, T));
        double loss;
        {
          ScopedSpan span(SpanKind::kCompute, "forward", a.mb, a.chunk);
          loss = st.forward(a.mb, tokens + off, targets + off, s > 0 ? in.data() : nullptr,
                            s < S - 1 ? out.data() : nullptr, rows, T, mb_scale, backward);
        }
        if (s == S - 1) loss_sum += loss;
        release(std::move(in));
        if (s < S - 1) give(kAct, a.chunk, a.mb, std::move(out));
      } else {
        std::vector<float> dout;
        if (s < S - 1) dout = take(kGrad, s + 1, a.mb);
        std::vector<float> din;
        if (s > 0) din = acquire(st.activation_numel(rows, T));
        {
          ScopedSpan span(SpanKind::kCompute, "backward", a.mb, a.chunk);
          st.backward(a.mb, s < S - 1 ? dout.data() : nullptr, s > 0 ? din.data() : nullptr);
        }
        release(std::move(dout));
        if (s > 0) give(kGrad, a.chunk, a.mb, std::move(din));
      }
      reap_sends(false);
    }
    reap_sends(true);
    TRIDENT_CHECK(recvs_.empty() && local_.empty(), InvalidArgument,
                  "pipeline: internal: {} receives / {} hand-offs left over after the step", recvs_.size(),
                  local_.size());
    double loss = loss_sum / m;
    if (P_ > 1) pp_->broadcast(&loss, 1, DType::kFloat64, P_ - 1);
    return loss;
  } catch (const std::exception& e) {
    fail_all(fmt::format("pipeline rank {} failed: {}", p_, e.what()));
    drain_after_failure();
    throw;
  }
}

}  // namespace trident::parallel
