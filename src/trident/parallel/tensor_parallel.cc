#include "trident/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trident/core/error.h"
#include "trident/core/timeline.h"

namespace trident::parallel {

ShardRange shard_range(int64_t n, int rank, int size) {
  TRIDENT_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument, "shard_range: rank {} of {} is invalid",
                rank, size);
  TRIDENT_CHECK(n % size == 0, InvalidArgument, "shard_range: {} elements do not split evenly over {} ranks", n,
                size);
  const int64_t per = n / size;
  return {per * rank, per * (rank + 1)};
}

TpComm::TpComm(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  if (group_) {
    rank_ = group_->rank();
    size_ = group_->size();
  }
}

void TpComm::all_reduce(float* buf, size_t n, ReduceOp op, int microbatch, int chunk) {
  if (size_ <= 1 || n == 0) return;
  // Bytes this rank sends under a bandwidth-optimal all-reduce: 2 (T-1)/T x size (DESIGN.md).
  const double bytes = 2.0 * (size_ - 1) / size_ * static_cast<double>(n) * sizeof(float);
  ScopedSpan span(SpanKind::kComm, "all_reduce(tp)", microbatch, chunk, bytes);
  group_->all_reduce(buf, n, DType::kFloat32, op);
}

void TpComm::all_reduce_sum(float* buf, size_t n, int microbatch, int chunk) {
  all_reduce(buf, n, ReduceOp::kSum, microbatch, chunk);
}
void TpComm::all_reduce_max(float* buf, size_t n, int microbatch, int chunk) {
  all_reduce(buf, n, ReduceOp::kMax, microbatch, chunk);
}

void TpComm::all_gather(const float* send, float* recv, size_t n, int microbatch, int chunk) {
  if (size_ <= 1) {
    if (n > 0 && recv != send) std::memcpy(recv, send, n * sizeof(float));
    return;
  }
  const double bytes = static_cast<double>(size_ - 1) * static_cast<double>(n) * sizeof(float);
  ScopedSpan span(SpanKind::kComm, "all_gather(tp)", microbatch, chunk, bytes);
  group_->all_gather(send, recv, n, DType::kFloat32);
}

void add_bias(float* out, const float* bias, int N, int C) {
  if (bias == nullptr) return;
  for (int i = 0; i < N; ++i) {
    float* o = out + static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) o[j] += bias[j];
  }
}

void vocab_parallel_embedding_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0,
                                      int64_t vl, int64_t V, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const int64_t tok = tokens[i];
    TRIDENT_CHECK(tok >= 0 && tok < V, InvalidArgument,
                  "embedding: token {} at position {} is outside the vocabulary [0, {}); check the data and "
                  "vocab_size",
                  tok, i, V);
    float* o = out + static_cast<size_t>(i) * C;
    if (tok >= v0 && tok < v0 + vl) std::memcpy(o, wte_shard + static_cast<size_t>(tok - v0) * C, sizeof(float) * C);
    else std::memset(o, 0, sizeof(float) * C);
  }
}

void vocab_parallel_embedding_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0,
                                       int64_t vl, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const int64_t tok = tokens[i];
    if (tok < v0 || tok >= v0 + vl) continue;
    float* d = dwte_shard + static_cast<size_t>(tok - v0) * C;
    const float* g = dout + static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) d[j] += g[j];
  }
}

double vocab_parallel_cross_entropy(float* dlogits, const float* logits, const int32_t* targets, int N, int64_t vl,
                                    int64_t v0, int64_t V, float dscale, TpComm& tp, int microbatch, int chunk) {
  std::vector<float> mx(N);
  std::vector<float> st(2 * static_cast<size_t>(N));  // [sum of exp | target logit]
  for (int i = 0; i < N; ++i) {
    TRIDENT_CHECK(targets[i] >= 0 && targets[i] < V, InvalidArgument,
                  "cross-entropy: target {} at position {} is outside the vocabulary [0, {})", targets[i], i, V);
    const float* row = logits + static_cast<size_t>(i) * vl;
    float m = -INFINITY;
    for (int64_t j = 0; j < vl; ++j) m = std::max(m, row[j]);
    mx[i] = m;
  }
  tp.all_reduce_max(mx.data(), mx.size(), microbatch, chunk);
  // Pass 2: local sums of exp (kept in dlogits when wanted, so the gradient needs no second exp).
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * vl;
    const int64_t t = targets[i] - v0;
    st[N + i] = (t >= 0 && t < vl) ? row[t] : 0.0f;  // read before dlogits (which may alias) overwrites it
    float* e = dlogits != nullptr ? dlogits + static_cast<size_t>(i) * vl : nullptr;
    double s = 0;
    for (int64_t j = 0; j < vl; ++j) {
      const float x = std::exp(row[j] - mx[i]);
      if (e != nullptr) e[j] = x;
      s += x;
    }
    st[i] = static_cast<float>(s);
  }
  tp.all_reduce_sum(st.data(), st.size(), microbatch, chunk);
  double total = 0;
  for (int i = 0; i < N; ++i) {
    total += std::log(static_cast<double>(st[i])) + mx[i] - st[N + i];
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(i) * vl;
      const float k = static_cast<float>(dscale / static_cast<double>(st[i]));
      for (int64_t j = 0; j < vl; ++j) d[j] *= k;
      const int64_t t = targets[i] - v0;
      if (t >= 0 && t < vl) d[t] -= dscale;
    }
  }
  return total;
}

}  // namespace trident::parallel
