#include "trident/train/gpt2_hf.h"

#include <cstring>

#include "trident/core/error.h"
#include "trident/nn/models.h"

namespace trident::train {
namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Hugging Face's causal-mask buffers h.{i}.attn.bias and h.{i}.attn.masked_bias (not attn.c_attn.bias).
bool is_mask_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

bool is_conv1d(const std::string& name) {
  return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
         ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight");
}

Tensor32 transpose(const Tensor32& t, const std::string& name) {
  TRIDENT_CHECK(t.shape.size() == 2, InvalidArgument, "GPT-2 tensor '{}' has {} dimensions; expected 2", name,
                t.shape.size());
  const int64_t r = t.shape[0], c = t.shape[1];
  Tensor32 out;
  out.shape = {c, r};
  out.data.resize(t.data.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out.data[static_cast<size_t>(j * r + i)] = t.data[static_cast<size_t>(i * c + j)];
  return out;
}

Tensor32 resize_rows(const Tensor32& t, int64_t rows) {
  Tensor32 out;
  out.shape = {rows, t.shape.at(1)};
  out.data.assign(static_cast<size_t>(rows * t.shape[1]), 0.0f);
  std::memcpy(out.data.data(), t.data.data(),
              static_cast<size_t>(std::min(rows, t.shape[0]) * t.shape[1]) * sizeof(float));
  return out;
}

}  // namespace

std::map<std::string, Tensor32> gpt2_from_hf(const std::map<std::string, Tensor32>& hf, int padded_vocab) {
  std::map<std::string, Tensor32> out;
  for (const auto& [raw, t] : hf) {
    if (is_mask_buffer(raw) || raw == "lm_head.weight") continue;  // lm_head is tied to wte
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw : "transformer." + raw;
    if (is_conv1d(name)) out[name] = transpose(t, raw);
    else out[name] = t;
  }
  auto wte = out.find("transformer.wte.weight");
  if (wte == out.end()) TRIDENT_THROW(InvalidArgument, "GPT-2 state dict: no wte.weight (is this a GPT-2 file?)");
  TRIDENT_CHECK(padded_vocab >= wte->second.shape.at(0), InvalidArgument,
                "GPT-2 state dict: vocabulary {} is larger than the padded {}", wte->second.shape[0], padded_vocab);
  wte->second = resize_rows(wte->second, padded_vocab);
  return out;
}

std::map<std::string, Tensor32> gpt2_to_hf(const std::map<std::string, Tensor32>& tw, int vocab) {
  std::map<std::string, Tensor32> out;
  for (const auto& [name, t] : tw) {
    if (name == "lm_head.weight") continue;
    if (name == "transformer.wte.weight") {
      TRIDENT_CHECK(t.shape.at(0) >= vocab, InvalidArgument, "wte has {} rows, fewer than the vocabulary {}",
                    t.shape[0], vocab);
      out[name] = resize_rows(t, vocab);
      out["lm_head.weight"] = out[name];
    } else {
      out[name] = is_conv1d(name) ? transpose(t, name) : t;
    }
  }
  return out;
}

std::string import_gpt2(const Gpt2ImportOptions& o) {
  auto hf = read_safetensors(o.safetensors);
  auto find = [&](const std::string& n) -> const Tensor32& {
    for (const std::string& k : {n, "transformer." + n}) {
      auto it = hf.find(k);
      if (it != hf.end()) return it->second;
    }
    TRIDENT_THROW(InvalidArgument, "'{}' has no tensor '{}' (is it a GPT-2 state dict?)", o.safetensors, n);
  };
  const auto& wte = find("wte.weight");
  const auto& wpe = find("wpe.weight");
  const int64_t vocab = wte.shape.at(0), C = wte.shape.at(1), T = wpe.shape.at(0);
  int L = 0;
  while (hf.count(fmt::format("h.{}.ln_1.weight", L)) || hf.count(fmt::format("transformer.h.{}.ln_1.weight", L))) ++L;
  int n_head = o.n_head;
  if (n_head == 0) {
    for (auto [w, h] : {std::pair{768, 12}, {1024, 16}, {1280, 20}, {1600, 25}})
      if (C == w) n_head = h;
    TRIDENT_CHECK(n_head > 0, InvalidArgument,
                  "'{}' has width {}, not one of GPT-2's: give the number of heads (--n_head)", o.safetensors, C);
  }
  const int m = std::max(1, o.vocab_multiple);
  const int padded = static_cast<int>((vocab + m - 1) / m * m);
  nlohmann::json cfg = {{"kind", "gpt"},   {"n_layer", L},     {"n_head", n_head},  {"n_embd", C},
                        {"block_size", T}, {"vocab_size", padded}, {"bias", true}, {"gelu", "tanh"}};
  auto model = nn::make_model(cfg);
  load_weights(*model, gpt2_from_hf(hf, padded), o.safetensors);
  CheckpointMeta meta;
  meta.step = 0;
  meta.model_config = model->config();
  meta.tokenizer = o.tokenizer;
  meta.train_config = nlohmann::json::object();
  meta.trainer = {{"imported_from", o.safetensors}};
  return save_checkpoint(o.out_dir, *model, meta, OptimizerState{}, 1);
}

void export_gpt2(const LoadedCheckpoint& ckpt, const std::string& out_path, int vocab) {
  const auto& mc = ckpt.meta.model_config;
  TRIDENT_CHECK(mc.value("kind", "gpt") == "gpt" && mc.value("bias", true), InvalidArgument,
                "{}: GPT-2's layout needs a gpt with biases (this checkpoint has kind={} bias={})", ckpt.dir,
                mc.value("kind", "gpt"), mc.value("bias", true));
  auto hf = gpt2_to_hf(ckpt.weights, vocab);
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : hf) refs.push_back({name, t.shape, t.data.data()});
  write_safetensors(out_path, refs, {{"format", "pt"}, {"producer", "trident"}, {"step", std::to_string(ckpt.meta.step)}});
}

}  // namespace trident::train
