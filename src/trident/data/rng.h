// Counter-based random numbers: every draw is a pure function of (seed, stream, counter), so a generator's
// whole state is three integers that a checkpoint saves and restores for bit-exact resume, and any draw
// (e.g. window j of step s) can be computed directly without replaying the ones before it.
//
// Ownership: value type. Blocking: never. Thread-safety: const functions are safe; next_*() mutate.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace trident::data {

// SplitMix64's finalizer: a bijective 64-bit mixer with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Hash of a tuple of keys: each key is folded through the mixer in turn (order matters).
inline uint64_t hash_keys(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  uint64_t h = mix64(seed ^ 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ (a + 0x632be59bd9b4e019ull));
  h = mix64(h ^ (b + 0x8cb92ba72f3d8dd7ull));
  h = mix64(h ^ (c + 0x4f1bbcdcbfa53e0bull));
  h = mix64(h ^ (d + 0xd6e8feb86659fd93ull));
  return h;
}
// Uniform integer in [0, n) from 64 random bits (Lemire's multiply-high; bias < n / 2^64).
inline uint64_t bounded(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}
// Uniform double in [0, 1) with 53 random bits.
inline double unit_double(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

class Rng {
 public:
  Rng() = default;
  Rng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  uint64_t next_u64() { return hash_keys(seed_, stream_, counter_++); }
  uint64_t next_below(uint64_t n) { return bounded(next_u64(), n); }
  double next_double() { return unit_double(next_u64()); }

  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t counter() const { return counter_; }

  nlohmann::json state() const {
    return {{"kind", "trident-counter-rng"}, {"seed", seed_}, {"stream", stream_}, {"counter", counter_}};
  }
  void load_state(const nlohmann::json& j) {
    seed_ = j.at("seed").get<uint64_t>();
    stream_ = j.at("stream").get<uint64_t>();
    counter_ = j.at("counter").get<uint64_t>();
  }
  bool operator==(const Rng& o) const = default;

 private:
  uint64_t seed_ = 0;
  uint64_t stream_ = 0;
  uint64_t counter_ = 0;
};

}  // namespace trident::data
