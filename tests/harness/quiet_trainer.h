// Trainer hooks whose progress lines and records go to /dev/null (tests of the training loop).
#pragma once

#include <cstdio>

#include "trident/train/trainer.h"

namespace trident::testing {

inline train::TrainerHooks quiet_hooks() {
  train::TrainerHooks h;
  static std::FILE* devnull = std::fopen("/dev/null", "w");
  h.out = devnull;
  return h;
}

}  // namespace trident::testing
