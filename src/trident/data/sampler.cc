#include "trident/data/sampler.h"

#include "trident/core/error.h"
#include "trident/data/rng.h"

namespace trident::data {

namespace {
void copy_window(const TokenSpan& data, size_t start, int T, int32_t* x, int32_t* y) {
  data.copy(start, static_cast<size_t>(T), x);
  data.copy(start + 1, static_cast<size_t>(T), y);
}
}  // namespace

RandomWindowSampler::RandomWindowSampler(TokenSpan data, int block_size, uint64_t seed, uint64_t stream)
    : data_(std::move(data)), block_size_(block_size), seed_(seed), stream_(stream) {
  TRIDENT_CHECK(block_size > 0, InvalidArgument, "block_size must be positive, got {}", block_size);
  if (data_.size <= static_cast<size_t>(block_size)) {
    TRIDENT_THROW(InvalidArgument,
                  "the split has {} tokens, too few for windows of block_size {} (need at least {}); use more text "
                  "or a smaller block_size",
                  data_.size, block_size, block_size + 1);
  }
}

size_t RandomWindowSampler::window_start(int64_t step, int64_t micro, int64_t j) const {
  uint64_t bits = hash_keys(seed_, stream_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro),
                            static_cast<uint64_t>(j));
  return static_cast<size_t>(bounded(bits, data_.size - static_cast<size_t>(block_size_)));
}

void RandomWindowSampler::sample_batch(int64_t step, int64_t micro, int global_batch, int rank_offset, int count,
                                       int32_t* x, int32_t* y) const {
  TRIDENT_CHECK(rank_offset >= 0 && count >= 0 && rank_offset + count <= global_batch, InvalidArgument,
                "sampler shard [{}, {}) is outside the global batch of {}", rank_offset, rank_offset + count,
                global_batch);
  const int T = block_size_;
  for (int b = 0; b < count; ++b) {
    size_t start = window_start(step, micro, rank_offset + b);
    copy_window(data_, start, T, x + static_cast<size_t>(b) * T, y + static_cast<size_t>(b) * T);
  }
}

EpochSampler::EpochSampler(TokenSpan data, int block_size, uint64_t seed)
    : data_(std::move(data)), block_size_(block_size), seed_(seed) {
  TRIDENT_CHECK(block_size > 0, InvalidArgument, "block_size must be positive, got {}", block_size);
  num_windows_ = data_.size == 0 ? 0 : static_cast<int64_t>((data_.size - 1) / static_cast<size_t>(block_size));
  if (num_windows_ == 0) {
    TRIDENT_THROW(InvalidArgument, "the split has {} tokens, too few for one window of block_size {}", data_.size,
                  block_size);
  }
  while ((int64_t{1} << (2 * half_bits_)) < num_windows_) ++half_bits_;
}

void EpochSampler::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
}

size_t EpochSampler::window_start(int64_t k) const {
  TRIDENT_CHECK(epoch_ >= 0, InvalidArgument, "EpochSampler: call set_epoch() before sampling");
  TRIDENT_CHECK(k >= 0 && k < num_windows_, InvalidArgument, "window {} is outside the epoch of {} windows", k,
                num_windows_);
  // A bijection of [0, 4^half_bits) (balanced Feistel), applied until the value lands in [0, num_windows):
  // restricted to [0, num_windows) that is a bijection too (cycle walking).
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t v = static_cast<uint64_t>(k);
  do {
    uint64_t l = v >> half_bits_, r = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = hash_keys(seed_, kStreamEpoch, static_cast<uint64_t>(epoch_), round, r) & mask;
      uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    v = (l << half_bits_) | r;
  } while (v >= static_cast<uint64_t>(num_windows_));
  return static_cast<size_t>(v) * static_cast<size_t>(block_size_);
}

void EpochSampler::sample_batch(int64_t batch, int global_batch, int rank_offset, int count, int32_t* x,
                                int32_t* y) const {
  TRIDENT_CHECK(rank_offset >= 0 && count >= 0 && rank_offset + count <= global_batch, InvalidArgument,
                "sampler shard [{}, {}) is outside the global batch of {}", rank_offset, rank_offset + count,
                global_batch);
  TRIDENT_CHECK(global_batch <= num_windows_, InvalidArgument,
                "a global batch of {} windows does not fit in an epoch of {} windows", global_batch, num_windows_);
  const int T = block_size_;
  for (int b = 0; b < count; ++b) {
    size_t start = window_start(batch * global_batch + rank_offset + b);
    copy_window(data_, start, T, x + static_cast<size_t>(b) * T, y + static_cast<size_t>(b) * T);
  }
}

SamplerKind parse_sampler_kind(const std::string& name) {
  if (name == "random") return SamplerKind::kRandom;
  if (name == "epoch") return SamplerKind::kEpoch;
  TRIDENT_THROW(InvalidArgument, "unknown sampler '{}'; allowed: random, epoch", name);
}

TrainSampler::TrainSampler(SamplerKind kind, TokenSpan data, int block_size, uint64_t seed, int accumulation,
                           int global_batch)
    : kind_(kind),
      random_(data, block_size, seed, kStreamTrain),
      epoch_(data, block_size, seed),
      seed_(seed),
      accumulation_(accumulation),
      global_batch_(global_batch) {
  if (kind_ == SamplerKind::kEpoch && epoch_.batches_per_epoch(global_batch) == 0) {
    TRIDENT_THROW(InvalidArgument, "the epoch sampler needs at least {} windows per epoch (global batch), the split has {}",
                  global_batch, epoch_.num_windows());
  }
}

void TrainSampler::sample(int64_t step, int micro, int rank_offset, int count, int32_t* x, int32_t* y) {
  if (kind_ == SamplerKind::kRandom) {
    random_.sample_batch(step, micro, global_batch_, rank_offset, count, x, y);
    return;
  }
  int64_t g = step * accumulation_ + micro;
  int64_t bpe = epoch_.batches_per_epoch(global_batch_);
  epoch_.set_epoch(g / bpe);
  epoch_.sample_batch(g % bpe, global_batch_, rank_offset, count, x, y);
}

nlohmann::json TrainSampler::state(int64_t next_step) const {
  nlohmann::json j{{"kind", kind_ == SamplerKind::kRandom ? "random" : "epoch"},
                   {"seed", seed_},
                   {"next_step", next_step},
                   {"accumulation", accumulation_},
                   {"global_batch", global_batch_}};
  if (kind_ == SamplerKind::kEpoch) {
    int64_t g = next_step * accumulation_;
    int64_t bpe = epoch_.batches_per_epoch(global_batch_);
    j["epoch"] = g / bpe;
    j["batch_in_epoch"] = g % bpe;
  }
  return j;
}

void TrainSampler::check_state(const nlohmann::json& j) const {
  auto want = state(j.value("next_step", int64_t{0}));
  for (const char* key : {"kind", "seed", "accumulation", "global_batch"}) {
    if (j.value(key, nlohmann::json()) != want[key]) {
      std::string hint = "resume with the same settings";
      if (std::string(key) == "global_batch") {
        // The global batch is batch_size (per data-parallel rank) x data-parallel ranks: another world size
        // resumes the same run when batch_size keeps the product.
        hint = fmt::format(
            "the global batch is batch_size x data-parallel ranks: to resume on another number of ranks, set "
            "--batch_size to {} / ranks",
            j.value(key, nlohmann::json()).dump());
      }
      TRIDENT_THROW(InvalidArgument, "the checkpoint's data sampler has {}={} but this run has {}={}; {}", key,
                    j.value(key, nlohmann::json()).dump(), key, want[key].dump(), hint);
    }
  }
}

}  // namespace trident::data
