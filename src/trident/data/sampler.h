// Batch samplers over a token split. Both are pure functions of (seed, position), so they need no saved
// state beyond the seed for bit-exact resume, and the GLOBAL batch is defined once: data-parallel rank r
// with a per-rank batch b asks for windows [r*b, r*b + b) of the global batch of N*b, and the N shards
// are exactly the windows one process asking for the whole global batch would get.
//
// RandomWindowSampler (nanoGPT's get_batch): window j of the global batch for (step, micro) starts at
//   i = hash(seed, stream, step, micro, j) mod (len - T)   (nanoGPT: torch.randint(len(data) - block_size))
//   x = tokens[i .. i+T-1], y = tokens[i+1 .. i+T].
// EpochSampler: the (len-1)/T non-overlapping windows (window w: x = tokens[wT .. wT+T-1]) in a random
//   order per epoch; set_epoch() selects the permutation. The permutation is computed per index (a 4-round
//   Feistel network keyed by (seed, epoch) over the next even power of two, cycle-walking into range), so
//   the sampler holds no per-window state: its memory does not grow with the corpus.
//
// Ownership: samplers hold a TokenSpan (which keeps the dataset alive). Blocking: never.
// Thread-safety: const methods are safe concurrently; set_epoch() is not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/data/dataset.h"

namespace trident::data {

// Streams keep independent draws apart (training batches, evaluation batches of each split, sampling).
inline constexpr uint64_t kStreamTrain = 1;
inline constexpr uint64_t kStreamEvalTrain = 2;
inline constexpr uint64_t kStreamEvalVal = 3;
inline constexpr uint64_t kStreamEpoch = 4;
inline constexpr uint64_t kStreamGenerate = 5;

class RandomWindowSampler {
 public:
  RandomWindowSampler(TokenSpan data, int block_size, uint64_t seed, uint64_t stream = kStreamTrain);
  size_t window_start(int64_t step, int64_t micro, int64_t j) const;
  // Windows [rank_offset, rank_offset + count) of the global batch of `global_batch` windows; x and y
  // receive count * block_size tokens each (row-major [count, T]).
  void sample_batch(int64_t step, int64_t micro, int global_batch, int rank_offset, int count, int32_t* x,
                    int32_t* y) const;
  int block_size() const { return block_size_; }

 private:
  TokenSpan data_;
  int block_size_;
  uint64_t seed_, stream_;
};

class EpochSampler {
 public:
  EpochSampler(TokenSpan data, int block_size, uint64_t seed);
  int64_t num_windows() const { return num_windows_; }
  int64_t batches_per_epoch(int global_batch) const { return num_windows_ / global_batch; }  // drops the tail
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // Start token of the k-th window in this epoch's order.
  size_t window_start(int64_t k) const;
  // Windows [rank_offset, rank_offset + count) of batch `batch` (global batch `global_batch`) of this epoch.
  void sample_batch(int64_t batch, int global_batch, int rank_offset, int count, int32_t* x, int32_t* y) const;

 private:
  TokenSpan data_;
  int block_size_;
  uint64_t seed_;
  int64_t num_windows_;
  int64_t epoch_ = -1;
  int half_bits_ = 1;  // the Feistel domain is 2^(2 * half_bits_) >= num_windows_
};

enum class SamplerKind { kRandom, kEpoch };
SamplerKind parse_sampler_kind(const std::string& name);  // "random" | "epoch"

// What the trainer uses: the global micro-batch number g = step * accumulation + micro selects the batch
// (for the epoch sampler, epoch = g / batches_per_epoch). Its position is fully given by (step, micro).
class TrainSampler {
 public:
  TrainSampler(SamplerKind kind, TokenSpan data, int block_size, uint64_t seed, int accumulation, int global_batch);
  void sample(int64_t step, int micro, int rank_offset, int count, int32_t* x, int32_t* y);
  // Where the next batch comes from, for checkpoints and logs.
  nlohmann::json state(int64_t next_step) const;
  // Throws InvalidArgument when a checkpoint's sampler state does not match this sampler's configuration.
  void check_state(const nlohmann::json& j) const;

 private:
  SamplerKind kind_;
  RandomWindowSampler random_;
  EpochSampler epoch_;
  uint64_t seed_;
  int accumulation_, global_batch_;
};

}  // namespace trident::data
