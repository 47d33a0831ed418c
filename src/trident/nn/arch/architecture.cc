// The table of architectures (one descriptor file each beside this one) and what they share.
#include "trident/nn/arch/architecture.h"

#include <fmt/ranges.h>

#include "trident/core/error.h"

namespace trident::nn {

const Architecture& gpt_architecture();
const Architecture& llama_architecture();
const Architecture& mlp_architecture();

namespace {
const std::vector<const Architecture*>& table() {
  static const std::vector<const Architecture*> t = {&gpt_architecture(), &llama_architecture(),
                                                     &mlp_architecture()};
  return t;
}
}  // namespace

std::vector<std::pair<int, int>> Architecture::unit_spans(const ModelConfig&, int l0, int l1, int) const {
  std::vector<std::pair<int, int>> out;
  for (int l = l0; l < l1; ++l) out.emplace_back(l, 1);
  return out;
}

const Architecture& architecture(const std::string& kind) {
  for (const Architecture* a : table())
    if (kind == a->kind()) return *a;
  TRIDENT_THROW(InvalidArgument, "model kind '{}' is unknown; trident's architectures are {}", kind,
                fmt::join(architecture_kinds(), ", "));
}

std::vector<std::string> architecture_kinds() {
  std::vector<std::string> out;
  for (const Architecture* a : table()) out.emplace_back(a->kind());
  return out;
}

ParamDecl make_decl(std::string name, std::vector<int64_t> shape, Role role, int layer, Split split, bool normal,
                    double init, int sections) {
  return ParamDecl{std::move(name), std::move(shape), split, sections, layer, role, normal, init};
}

std::string divisors_text(int64_t g, int limit) {
  std::vector<int64_t> d;
  for (int64_t x = 1; x <= limit && x <= g; ++x)
    if (g % x == 0) d.push_back(x);
  return fmt::format("{}", fmt::join(d, ", "));
}

void check_vocab_split(const ModelConfig& c, int T, int64_t g) {
  const int64_t V = c.vocab_size;
  TRIDENT_CHECK(V == 0 || V % T == 0, InvalidArgument,
                "model layout: tensor-parallel size {} does not divide vocab_size {} (the embedding and head are "
                "split by vocabulary rows); pad vocab_size to a multiple of {} (e.g. {}) or use a tensor-parallel "
                "size in {{{}}}",
                T, V, T, (V + T - 1) / T * T, divisors_text(g, 1 << 20));
}

}  // namespace trident::nn
