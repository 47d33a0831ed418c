// Deterministic synthetic training data shared by the training tests: token windows that are a pure
// function of (step, row), so any split of a global batch over ranks sees exactly the rows one process
// would, and a small word corpus with enough structure for the loss to fall.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trident/data/rng.h"

namespace trident::testing {

// Rows [first_row, first_row + rows) of step `step`'s global batch: inputs x and next-token targets y,
// T positions each, tokens in [0, vocab). `mix` selects one of several unrelated streams.
inline void token_windows(int step, int first_row, int rows, int T, int vocab, std::vector<int32_t>* x,
                          std::vector<int32_t>* y, int mix = 7) {
  x->resize(static_cast<size_t>(rows) * T);
  y->resize(static_cast<size_t>(rows) * T);
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t <= T; ++t) {
      uint32_t h = static_cast<uint32_t>((step * 131 + (first_row + r) * 31 + t * 7) * 2654435761u);
      int32_t tok = static_cast<int32_t>((h >> mix) % static_cast<uint32_t>(vocab));
      if (t < T) (*x)[static_cast<size_t>(r) * T + t] = tok;
      if (t > 0) (*y)[static_cast<size_t>(r) * T + t - 1] = tok;
    }
}

// Writes dir/corpus.txt: ~12 kB of words drawn from 16 distinct characters (t h e c a s o n m d g r f .
// space newline; divisible by every TP size the tests use) and returns its path.
inline std::string write_word_corpus(const std::filesystem::path& dir) {
  std::string text;
  data::Rng r(11, 0);
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat ", "and ", "dog ", "ran.\n", "far "};
  while (text.size() < 12000) text += words[r.next_below(10)];
  std::string p = (dir / "corpus.txt").string();
  std::ofstream(p) << text;
  return p;
}

}  // namespace trident::testing
