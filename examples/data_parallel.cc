// A minimal data-parallel training loop: least-squares regression y = X w, each rank on its own shard of
// the data, gradients averaged across ranks every step (what DDP does), so every rank keeps the same w.
// Run: trident launch -n 2 -- ./data_parallel
#include <trident/comm/process_group.h>
#include <trident/core/error.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  try {
    auto pg = trident::init_process_group();
    const int rank = pg->rank(), world = pg->size();
    constexpr int kDim = 16, kRows = 256, kSteps = 200;
    std::vector<float> w_true(kDim);
    for (int j = 0; j < kDim; ++j) w_true[j] = std::sin(float(j));
    std::mt19937 gen(1234 + rank);  // each rank its own shard of the data
    std::normal_distribution<float> normal;
    std::vector<float> x(kRows * kDim), y(kRows);
    for (int i = 0; i < kRows; ++i) {
      float dot = 0;
      for (int j = 0; j < kDim; ++j) dot += (x[i * kDim + j] = normal(gen)) * w_true[j];
      y[i] = dot;
    }
    std::vector<float> w(kDim, 0.0f), grad(kDim);
    float loss = 0;
    for (int step = 0; step < kSteps; ++step) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      loss = 0;
      for (int i = 0; i < kRows; ++i) {
        float err = -y[i];
        for (int j = 0; j < kDim; ++j) err += x[i * kDim + j] * w[j];
        loss += err * err / kRows;
        for (int j = 0; j < kDim; ++j) grad[j] += 2 * err * x[i * kDim + j] / kRows;
      }
      // The data-parallel step: average the gradients (and the loss, for the log) over the ranks.
      pg->all_reduce(grad.data(), kDim, trident::DType::kFloat32, trident::ReduceOp::kAvg);
      pg->all_reduce(&loss, 1, trident::DType::kFloat32, trident::ReduceOp::kAvg);
      for (int j = 0; j < kDim; ++j) w[j] -= 0.05f * grad[j];
    }
    // Every rank must hold the same weights: compare with rank 0's.
    std::vector<float> w0 = w;
    pg->broadcast(w0.data(), kDim, trident::DType::kFloat32, 0);
    if (w0 != w) {
      std::fprintf(stderr, "rank %d: weights diverged from rank 0's\n", rank);
      return 1;
    }
    if (!(loss < 1e-4f)) {
      std::fprintf(stderr, "rank %d: loss %g after %d steps did not converge\n", rank, loss, kSteps);
      return 1;
    }
    if (rank == 0) std::printf("data_parallel: %d ranks, %d steps, final loss %.3g\n", world, kSteps, loss);
    return 0;
  } catch (const trident::Error& e) {
    std::fprintf(stderr, "data_parallel example failed: %s\n", e.what());
    return 1;
  }
}
