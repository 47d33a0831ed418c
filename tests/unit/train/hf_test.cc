// Hugging Face folders in and out (train/hf.h): small Llama and GPT-2 folders written here (config.json +
// safetensors of random tensors; one sharded with an index, F16 and BF16 tensors) import with the right
// model config, padding and values; import -> export -> import gives back every tensor bit for bit; every bad
// input is refused naming its key and writes nothing; the imported Llama loads into nn::make_model and runs
// under `trident eval`; `trident import|export` and the `trident gpt2` aliases work through the binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "harness/skip.h"
#include "harness/torch_reference.h"
#include "harness/temp_dir.h"
#include "trident/core/tensor.h"
#include "trident/data/file_io.h"
#include "trident/data/tokenizer.h"
#include "trident/nn/models.h"
#include "trident/train/hf.h"
#include "trident/train/trainer.h"

using namespace trident;
using namespace trident::train;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct HfT {
  std::vector<int64_t> shape;
  std::vector<float> data;  // float32 values exactly representable in `dtype`
  std::string dtype = "F32";
};
using Folder = std::map<std::string, HfT>;

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

DType dtype_of(const std::string& d) {
  return d == "F16" ? DType::kFloat16 : d == "BF16" ? DType::kBFloat16 : DType::kFloat32;
}

// A safetensors file of `names` from `f`, each in its own dtype (F32, F16, BF16; any other name is written as
// raw 1-byte elements, for the refusal test).
void write_st(const fs::path& path, const Folder& f, const std::vector<std::string>& names) {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (const auto& n : names) {
    const HfT& t = f.at(n);
    std::string bytes;
    if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") {
      Tensor conv = Tensor::view(t.data.data(), t.shape).to(dtype_of(t.dtype));
      bytes.assign(static_cast<const char*>(conv.raw()), conv.nbytes());
    } else {
      bytes.assign(static_cast<size_t>(numel(t.shape)), '\1');
    }
    header[n] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data += bytes;
  }
  std::string h = header.dump();
  uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
  out << h << data;
}

std::vector<std::string> names_of(const Folder& f) {
  std::vector<std::string> n;
  for (const auto& [k, v] : f) n.push_back(k);
  return n;
}

// config.json + model.safetensors, or (shards > 1) model-0000k-of-0000n.safetensors + the index.
void write_folder(const fs::path& dir, const json& config, const Folder& f, int shards = 1) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  if (shards == 1) return write_st(dir / "model.safetensors", f, names_of(f));
  std::vector<std::vector<std::string>> parts(static_cast<size_t>(shards));
  json weight_map = json::object();
  int i = 0;
  for (const auto& [n, t] : f) {
    const int s = i++ % shards;
    parts[static_cast<size_t>(s)].push_back(n);
    weight_map[n] = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
  }
  for (int s = 0; s < shards; ++s)
    write_st(dir / fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards), f, parts[static_cast<size_t>(s)]);
  std::ofstream(dir / "model.safetensors.index.json") << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
}

HfT random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float scale = 0.05f) {
  std::normal_distribution<float> nd(0.0f, scale);
  HfT t;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(numel(t.shape)));
  for (auto& v : t.data) v = nd(rng);
  return t;
}

// A small Llama 3.1-style config: GQA (4 heads, 2 KV heads), llama3 RoPE scaling, untied head.
json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 16},
          {"intermediate_size", 40},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 32}}},
          {"tie_word_embeddings", false},
          {"vocab_size", 300},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", "bfloat16"}};
}

Folder llama_tensors(const json& c, uint32_t seed = 1, float scale = 0.05f) {
  std::mt19937 rng(seed);
  const int64_t C = c["hidden_size"], I = c["intermediate_size"], V = c["vocab_size"];
  const int64_t NH = c["num_attention_heads"], NKV = c.value("num_key_value_heads", NH), hd = C / NH;
  Folder f;
  f["model.embed_tokens.weight"] = random_tensor({V, C}, rng, scale);
  for (int l = 0; l < c["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    f[p + "input_layernorm.weight"] = random_tensor({C}, rng, scale);
    f[p + "self_attn.q_proj.weight"] = random_tensor({NH * hd, C}, rng, scale);
    f[p + "self_attn.k_proj.weight"] = random_tensor({NKV * hd, C}, rng, scale);
    f[p + "self_attn.v_proj.weight"] = random_tensor({NKV * hd, C}, rng, scale);
    f[p + "self_attn.o_proj.weight"] = random_tensor({C, NH * hd}, rng, scale);
    f[p + "post_attention_layernorm.weight"] = random_tensor({C}, rng, scale);
    f[p + "mlp.gate_proj.weight"] = random_tensor({I, C}, rng, scale);
    f[p + "mlp.up_proj.weight"] = random_tensor({I, C}, rng, scale);
    f[p + "mlp.down_proj.weight"] = random_tensor({C, I}, rng, scale);
  }
  f["model.norm.weight"] = random_tensor({C}, rng, scale);
  if (!c.value("tie_word_embeddings", false)) f["lm_head.weight"] = random_tensor({V, C}, rng, scale);
  return f;
}

json gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_embd", 16}, {"n_layer", 2},
          {"n_head", 2}, {"n_positions", 32}, {"n_ctx", 32}, {"vocab_size", 300}, {"n_inner", nullptr},
          {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}, {"bos_token_id", 299},
          {"eos_token_id", 299}};
}

// GPT2Model names (the hub's files: no "transformer."), Conv1D layouts, and the causal-mask buffers.
Folder gpt2_tensors(uint32_t seed = 2) {
  std::mt19937 rng(seed);
  const int64_t C = 16, V = 300, T = 32;
  Folder f;
  f["wte.weight"] = random_tensor({V, C}, rng);
  f["wpe.weight"] = random_tensor({T, C}, rng);
  for (int l = 0; l < 2; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    f[p + "ln_1.weight"] = random_tensor({C}, rng);
    f[p + "ln_1.bias"] = random_tensor({C}, rng);
    f[p + "attn.c_attn.weight"] = random_tensor({C, 3 * C}, rng);
    f[p + "attn.c_attn.bias"] = random_tensor({3 * C}, rng);
    f[p + "attn.c_proj.weight"] = random_tensor({C, C}, rng);
    f[p + "attn.c_proj.bias"] = random_tensor({C}, rng);
    f[p + "ln_2.weight"] = random_tensor({C}, rng);
    f[p + "ln_2.bias"] = random_tensor({C}, rng);
    f[p + "mlp.c_fc.weight"] = random_tensor({C, 4 * C}, rng);
    f[p + "mlp.c_fc.bias"] = random_tensor({4 * C}, rng);
    f[p + "mlp.c_proj.weight"] = random_tensor({4 * C, C}, rng);
    f[p + "mlp.c_proj.bias"] = random_tensor({C}, rng);
    HfT mask;
    mask.shape = {1, 1, T, T};
    mask.data.assign(static_cast<size_t>(T * T), 1.0f);
    f[p + "attn.bias"] = mask;
  }
  f["ln_f.weight"] = random_tensor({C}, rng);
  f["ln_f.bias"] = random_tensor({C}, rng);
  return f;
}

// Rows [0, rows) of `t` equal `want` bit for bit, and rows beyond are zero.
void expect_rows(const Tensor32& t, const HfT& want, int64_t padded_rows) {
  ASSERT_EQ(t.shape, (std::vector<int64_t>{padded_rows, want.shape[1]}));
  ASSERT_EQ(std::memcmp(t.data.data(), want.data.data(), want.data.size() * sizeof(float)), 0);
  for (size_t i = want.data.size(); i < t.data.size(); ++i) ASSERT_EQ(t.data[i], 0.0f) << i;
}

void expect_same_tensors(const std::map<std::string, Tensor32>& a, const std::map<std::string, Tensor32>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [n, t] : a) {
    ASSERT_TRUE(b.count(n)) << n;
    EXPECT_EQ(t.shape, b.at(n).shape) << n;
    EXPECT_EQ(std::memcmp(t.data.data(), b.at(n).data.data(), t.data.size() * sizeof(float)), 0) << n;
  }
}

class Hf : public ::testing::Test {
 protected:
  trident::testing::TempDir tmp{"hf"};
  fs::path in = tmp.path / "hf", out = tmp.path / "out";

  std::string import(int block_size = 0) {
    HfImportOptions o;
    o.hf_dir = in.string();
    o.out_dir = out.string();
    o.block_size = block_size;
    return import_hf(o);
  }
  // Expects the import of `in` to fail with HfError on `key`, and nothing under `out`.
  void expect_refused(const std::string& key, const std::string& found_part = "") {
    try {
      import();
      ADD_FAILURE() << "import succeeded; expected a refusal naming " << key;
    } catch (const HfError& e) {
      EXPECT_EQ(e.key, key) << e.what();
      if (!found_part.empty()) {
        EXPECT_NE(e.found.find(found_part), std::string::npos) << e.what();
      }
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();  // one line
    }
    EXPECT_FALSE(fs::exists(out)) << "a failed import wrote " << out;
  }
  void expect_refused_config(json c, const std::string& key, const std::string& found_part = "") {
    write_folder(in, c, llama_tensors(llama_config()));
    expect_refused(key, found_part);
  }
};

TEST_F(Hf, LlamaImportMapsConfigPadsVocabularyAndKeepsValues) {
  const json c = llama_config();
  const Folder f = llama_tensors(c);
  write_folder(in, c, f);
  auto ck = load_checkpoint(import(), false);
  EXPECT_EQ(ck.meta.step, 0);
  EXPECT_FALSE(ck.meta.has_optimizer);
  const json& mc = ck.meta.model_config;
  EXPECT_EQ(mc["kind"], "llama");
  EXPECT_EQ(mc["n_layer"], 2);
  EXPECT_EQ(mc["n_head"], 4);
  EXPECT_EQ(mc["n_kv_head"], 2);
  EXPECT_EQ(mc["n_embd"], 16);
  EXPECT_EQ(mc["intermediate_size"], 40);
  EXPECT_EQ(mc["block_size"], 64);   // max_position_embeddings
  EXPECT_EQ(mc["vocab_size"], 384);  // 300 padded to a multiple of 128
  EXPECT_EQ(mc["bias"], false);
  EXPECT_EQ(mc["rope_theta"], 500000.0);
  EXPECT_EQ(mc["norm_eps"], 1e-5);
  EXPECT_EQ(mc["tie_embeddings"], false);
  EXPECT_EQ(mc["rope_scaling"], (json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}}));
  EXPECT_EQ(ck.meta.hf_config, c);
  EXPECT_EQ(hf_to_model_config(c), mc);
  EXPECT_EQ(read_hf_tensors(in.string()).size(), f.size());
  ASSERT_EQ(ck.weights.size(), f.size());
  expect_rows(ck.weights.at("model.embed_tokens.weight"), f.at("model.embed_tokens.weight"), 384);
  expect_rows(ck.weights.at("lm_head.weight"), f.at("lm_head.weight"), 384);
  for (const auto& [n, t] : f) {
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight") continue;
    EXPECT_EQ(ck.weights.at(n).shape, t.shape) << n;
    EXPECT_EQ(ck.weights.at(n).data, t.data) << n;  // same names, same layout: q/k are not permuted
  }
}

TEST_F(Hf, LlamaDefaultsAndBlockSizeAndVocabMultiple) {
  json c = llama_config();
  for (const char* k : {"num_key_value_heads", "rope_theta", "rms_norm_eps", "rope_scaling", "tie_word_embeddings",
                        "hidden_act", "attention_bias", "mlp_bias"})
    c.erase(k);
  write_folder(in, c, llama_tensors(c));
  HfImportOptions o;
  o.hf_dir = in.string();
  o.out_dir = out.string();
  o.block_size = 16;
  o.vocab_multiple = 64;
  auto ck = load_checkpoint(import_hf(o), false);
  const json& mc = ck.meta.model_config;
  EXPECT_EQ(mc["n_kv_head"], 4);  // = n_head
  EXPECT_EQ(mc["rope_theta"], 10000.0);
  EXPECT_EQ(mc["norm_eps"], 1e-6);  // LlamaConfig's default
  EXPECT_TRUE(mc["rope_scaling"].is_null());
  EXPECT_EQ(mc["tie_embeddings"], false);
  EXPECT_EQ(mc["block_size"], 16);
  EXPECT_EQ(mc["vocab_size"], 320);
}

TEST_F(Hf, ShardedF16AndBf16FolderImportsAsTheirFloat32Values) {
  const json c = llama_config();
  Folder f = llama_tensors(c);
  int i = 0;
  for (auto& [n, t] : f) {
    t.dtype = i % 3 == 0 ? "F16" : i % 3 == 1 ? "BF16" : "F32";
    ++i;
    // Values the dtype holds exactly (what the file will hold).
    Tensor exact = Tensor::view(t.data.data(), t.shape).to(dtype_of(t.dtype)).to(DType::kFloat32);
    std::memcpy(t.data.data(), exact.raw(), t.data.size() * sizeof(float));
  }
  write_folder(in, c, f, 3);
  ASSERT_TRUE(fs::exists(in / "model-00003-of-00003.safetensors"));
  auto ck = load_checkpoint(import(), false);
  expect_rows(ck.weights.at("model.embed_tokens.weight"), f.at("model.embed_tokens.weight"), 384);
  for (const auto& [n, t] : f) {
    if (n != "model.embed_tokens.weight" && n != "lm_head.weight") {
      EXPECT_EQ(ck.weights.at(n).data, t.data) << n;
    }
  }
}

TEST_F(Hf, LlamaImportExportImportIsBitIdentical) {
  const json c = llama_config();
  const Folder f = llama_tensors(c);
  write_folder(in, c, f, 2);
  auto first = load_checkpoint(import(), false);
  const fs::path exported = tmp.path / "exported";
  export_hf(first, exported.string());
  // The export holds exactly the original tensors, unpadded, in F32.
  auto hf = read_safetensors((exported / "model.safetensors").string());
  ASSERT_EQ(hf.size(), f.size());
  for (const auto& [n, t] : f) {
    EXPECT_EQ(hf.at(n).shape, t.shape) << n;
    EXPECT_EQ(hf.at(n).data, t.data) << n;
  }
  json ec = json::parse(io::read_file((exported / "config.json").string()));
  EXPECT_EQ(ec["model_type"], "llama");
  EXPECT_EQ(ec["architectures"], json({"LlamaForCausalLM"}));
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                        "rope_scaling", "tie_word_embeddings", "vocab_size", "hidden_act", "bos_token_id",
                        "eos_token_id"})
    EXPECT_EQ(ec[k], c[k]) << k;
  EXPECT_EQ(ec["torch_dtype"], "float32");
  EXPECT_EQ(ec["head_dim"], 4);
  // Again: the folder trident wrote imports to the same checkpoint tensors.
  in = exported;
  out = tmp.path / "again";
  auto second = load_checkpoint(import(), false);
  expect_same_tensors(first.weights, second.weights);
  EXPECT_EQ(first.meta.model_config, second.meta.model_config);
}

TEST_F(Hf, TiedLlamaAcceptsAHeadInTheFileAndExportsWithout) {
  json c = llama_config();
  c["tie_word_embeddings"] = true;
  Folder f = llama_tensors(c);
  f["lm_head.weight"] = f.at("model.embed_tokens.weight");  // some tied files carry it
  write_folder(in, c, f);
  auto ck = load_checkpoint(import(), false);
  EXPECT_EQ(ck.meta.model_config["tie_embeddings"], true);
  EXPECT_FALSE(ck.weights.count("lm_head.weight"));
  export_hf(ck, (tmp.path / "exported").string());
  auto hf = read_safetensors((tmp.path / "exported" / "model.safetensors").string());
  EXPECT_FALSE(hf.count("lm_head.weight"));  // as save_pretrained writes tied weights
  EXPECT_EQ(hf.size(), f.size() - 1);
  EXPECT_EQ(json::parse(io::read_file((tmp.path / "exported" / "config.json").string()))["tie_word_embeddings"], true);
}

TEST_F(Hf, MistralWithoutAShortWindowImportsAsLlama) {
  json c = llama_config();
  c["model_type"] = "mistral";
  c["sliding_window"] = nullptr;
  write_folder(in, c, llama_tensors(c));
  auto ck = load_checkpoint(import(), false);
  EXPECT_EQ(ck.meta.model_config["kind"], "llama");
  export_hf(ck, (tmp.path / "exported").string());
  EXPECT_EQ(json::parse(io::read_file((tmp.path / "exported" / "config.json").string()))["model_type"], "llama");
}

TEST_F(Hf, Gpt2FolderImportTransposesConv1DAndRoundTrips) {
  const Folder f = gpt2_tensors();
  write_folder(in, gpt2_config(), f);
  auto ck = load_checkpoint(import(), false);
  const json& mc = ck.meta.model_config;
  EXPECT_EQ(mc["kind"], "gpt");
  EXPECT_EQ(mc["gelu"], "tanh");
  EXPECT_EQ(mc["vocab_size"], 384);
  EXPECT_EQ(mc["block_size"], 32);
  expect_rows(ck.weights.at("transformer.wte.weight"), f.at("wte.weight"), 384);
  const auto& w = ck.weights.at("transformer.h.1.attn.c_attn.weight");  // [3C, C] from Conv1D's [C, 3C]
  ASSERT_EQ(w.shape, (std::vector<int64_t>{48, 16}));
  const auto& src = f.at("h.1.attn.c_attn.weight").data;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 48; ++j) ASSERT_EQ(w.data[j * 16 + i], src[i * 48 + j]);
  EXPECT_FALSE(ck.weights.count("transformer.h.0.attn.bias"));  // the mask buffer is not a parameter
  const fs::path exported = tmp.path / "exported";
  export_hf(ck, exported.string());
  auto hf = read_safetensors((exported / "model.safetensors").string());
  for (const auto& [n, t] : f) {
    if (n.find("attn.bias") != std::string::npos && n.find("c_attn") == std::string::npos) continue;
    ASSERT_TRUE(hf.count("transformer." + n)) << n;
    EXPECT_EQ(hf.at("transformer." + n).data, t.data) << n;
  }
  EXPECT_FALSE(hf.count("lm_head.weight"));
  json ec = json::parse(io::read_file((exported / "config.json").string()));
  EXPECT_EQ(ec["model_type"], "gpt2");
  EXPECT_EQ(ec["vocab_size"], 300);
  EXPECT_EQ(ec["n_positions"], 32);
  EXPECT_EQ(ec["activation_function"], "gelu_new");
  EXPECT_EQ(ec["eos_token_id"], 299);
  in = exported;
  out = tmp.path / "again";
  expect_same_tensors(ck.weights, load_checkpoint(import(), false).weights);
}

TEST_F(Hf, Gpt2BlockSizeCropsPositionsAndRefusesMore) {
  write_folder(in, gpt2_config(), gpt2_tensors());
  auto ck = load_checkpoint(import(16), false);
  EXPECT_EQ(ck.weights.at("transformer.wpe.weight").shape, (std::vector<int64_t>{16, 16}));
  fs::remove_all(out);
  try {
    import(64);
    ADD_FAILURE();
  } catch (const HfError& e) {
    EXPECT_EQ(e.key, "block_size");
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Hf, RefusesUnknownAndUnsupportedModelTypes) {
  json c = llama_config();
  c["model_type"] = "bert";
  expect_refused_config(c, "model_type", "bert");
  c["model_type"] = "qwen2";
  write_folder(in, c, llama_tensors(llama_config()));
  try {
    import();
    ADD_FAILURE();
  } catch (const HfError& e) {
    EXPECT_EQ(e.key, "model_type");
    EXPECT_NE(e.expected.find("q_proj.bias"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  c["model_type"] = "mistral";
  c["sliding_window"] = 16;  // shorter than max_position_embeddings 64
  expect_refused_config(c, "sliding_window", "16");
  c.erase("sliding_window");  // MistralConfig's default is 4096: fine for 64 positions
  write_folder(in, c, llama_tensors(llama_config()));
  EXPECT_NO_THROW(import());
}

TEST_F(Hf, RefusesConfigsTridentsLlamaCannotRun) {
  struct Case {
    const char* key;
    json value;
    const char* refused_key;
  };
  const Case cases[] = {
      {"num_key_value_heads", 3, "num_key_value_heads"},
      {"attention_bias", true, "attention_bias"},
      {"mlp_bias", true, "mlp_bias"},
      {"head_dim", 8, "head_dim"},
      {"hidden_act", "gelu", "hidden_act"},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}, "rope_scaling.rope_type"},
      {"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}, "rope_scaling.type"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}}, "rope_scaling.rope_type"},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "rope_scaling.low_freq_factor"},
      {"hidden_size", "16", "hidden_size"},
      {"vocab_size", nullptr, "vocab_size"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.key + std::string(" = ") + k.value.dump());
    json c = llama_config();
    c[k.key] = k.value;
    expect_refused_config(c, k.refused_key);
    fs::remove_all(in);
  }
}

TEST_F(Hf, RefusesATokenizerLargerThanTheVocabulary) {
  json c = llama_config();
  c["vocab_size"] = 200;
  write_folder(in, c, llama_tensors(c));
  HfImportOptions o;
  o.hf_dir = in.string();
  o.out_dir = out.string();
  o.tokenizer = data::Tokenizer::byte_level().to_json();  // 256 tokens
  try {
    import_hf(o);
    ADD_FAILURE();
  } catch (const HfError& e) {
    EXPECT_EQ(e.key, "tokenizer");
    EXPECT_EQ(e.found, "256");
  }
  EXPECT_FALSE(fs::exists(out));
  // Found nowhere, the byte-level fallback is recorded anyway, and the note says why it does not fit.
  std::string note;
  o.tokenizer = nullptr;
  import_hf(o, &note);
  EXPECT_NE(note.find("exceed vocab_size 200"), std::string::npos) << note;
}

TEST_F(Hf, RefusesMissingExtraAndMisshapedTensors) {
  const json c = llama_config();
  std::mt19937 rng(3);
  Folder f = llama_tensors(c);
  f.erase("model.layers.1.mlp.up_proj.weight");
  write_folder(in, c, f);
  expect_refused("model.layers.1.mlp.up_proj.weight", "missing");

  f = llama_tensors(c);
  f["model.layers.0.self_attn.q_proj.bias"] = random_tensor({16}, rng);
  fs::remove_all(in);
  write_folder(in, c, f);
  expect_refused("model.layers.0.self_attn.q_proj.bias", "present");

  f = llama_tensors(c);
  f["model.layers.0.self_attn.k_proj.weight"].shape = {16, 8};  // K/V heads 4, not config.json's 2
  fs::remove_all(in);
  write_folder(in, c, f);
  expect_refused("model.layers.0.self_attn.k_proj.weight", "[16, 8]");

  f = llama_tensors(c);
  f["model.embed_tokens.weight"] = random_tensor({301, 16}, rng);
  fs::remove_all(in);
  write_folder(in, c, f);
  expect_refused("model.embed_tokens.weight", "[301, 16]");
}

TEST_F(Hf, RefusesMissingAndCorruptFiles) {
  const json c = llama_config();
  const Folder f = llama_tensors(c);
  expect_refused("hf_dir");  // no folder at all
  write_folder(in, c, f);
  fs::remove(in / "config.json");
  expect_refused("config.json", "missing");
  std::ofstream(in / "config.json") << "{not json";
  expect_refused("config.json");
  std::ofstream(in / "config.json") << c.dump();
  fs::remove(in / "model.safetensors");
  expect_refused("model.safetensors", "missing");

  // A truncated header, and a header that is not JSON: read_safetensors' IoError naming the file.
  for (int which = 0; which < 2; ++which) {
    write_st(in / "model.safetensors", f, names_of(f));
    std::string bytes = io::read_file((in / "model.safetensors").string());
    if (which == 0) bytes.resize(100);
    else bytes[10] = '\x01';
    std::ofstream(in / "model.safetensors", std::ios::binary) << bytes;
    try {
      import();
      ADD_FAILURE();
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(which == 0 ? "header length" : "does not parse"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
  }

  // A dtype trident does not read is refused by name.
  Folder g = f;
  g["model.norm.weight"].dtype = "I8";
  write_st(in / "model.safetensors", g, names_of(g));
  try {
    import();
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("dtype I8"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));

  // An index naming a shard that is not there.
  fs::remove_all(in);
  write_folder(in, c, f, 2);
  fs::remove(in / "model-00002-of-00002.safetensors");
  expect_refused("model-00002-of-00002.safetensors", "missing");
}

TEST_F(Hf, RefusesAnOutDirHoldingAnotherRunsCheckpoints) {
  write_folder(in, llama_config(), llama_tensors(llama_config()));
  fs::create_directories(out / "ckpt-00000100");
  try {
    import();
    ADD_FAILURE();
  } catch (const HfError& e) {
    EXPECT_EQ(e.key, "out_dir");
  }
  EXPECT_TRUE(fs::exists(out / "ckpt-00000100"));
  EXPECT_FALSE(fs::exists(out / "ckpt-00000000"));
}

// The imported Llama is a model trident builds and runs: its checkpoint loads into nn::make_model, and the
// logits of a forward pass are finite except the padding ids'.
TEST_F(Hf, ImportedLlamaLoadsIntoTheModelFactory) {
  const json c = llama_config();
  write_folder(in, c, llama_tensors(c));
  auto ck = load_checkpoint(import(), false);
  auto model = model_from_checkpoint(ck);
  EXPECT_EQ(model->kind(), "llama");
  std::vector<int32_t> x = {1, 5, 299, 7, 0, 42, 100, 3};
  std::vector<float> logits(static_cast<size_t>(8 * 384));
  model->forward_logits(x.data(), 1, 8, logits.data());
  // Ids 300.. are the vocabulary's padding (384 rows): their logits are -inf, every other one finite.
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_EQ(std::isfinite(logits[i]), i % 384 < 300) << i;
  // The model's own parameters are exactly the checkpoint's tensors.
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(ck.weights.count(p.name)) << p.name;
    EXPECT_EQ(std::memcmp(model->param_data() + p.offset, ck.weights.at(p.name).data.data(), p.numel * 4), 0)
        << p.name;
  }
}

// The PyTorch reference Llama (tests/unit/nn/llama_torch.py, Hugging Face's LlamaForCausalLM semantics in
// float64) evaluates the original folder (sharded, F16/BF16) and trident's export of the imported checkpoint
// to the loss trident computes on it. The vocabulary is padded (300 -> 384 rows): the padding ids take no
// probability, so the loss is the unpadded model's.
// The reference Llama's mean loss on a folder over the consecutive windows of T + 1 ids in `tokens`.
double reference_loss(const fs::path& folder, const fs::path& tokens, int T) {
  const std::string cmd = "/usr/bin/python3 " + std::string(TRIDENT_SOURCE_DIR) + "/tests/unit/nn/llama_torch.py --hf " +
                          folder.string() + " --tokens " + tokens.string() + " --block " + std::to_string(T);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  double v = NAN;
  EXPECT_EQ(std::sscanf(std::string(buf, n).c_str(), "loss %lf", &v), 1) << buf;
  return v;
}

TEST_F(Hf, ImportedAndExportedLlamaMatchThePyTorchReference) {
  if (!trident::testing::have_torch())
    TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  const json c = llama_config();
  Folder f = llama_tensors(c, 7, 0.5f);  // weights large enough that the loss is far from log(vocab)
  int i = 0;
  for (auto& [n, t] : f) t.dtype = ++i % 2 ? "BF16" : "F16";
  write_folder(in, c, f, 2);
  HfImportOptions o;
  o.hf_dir = in.string();
  o.out_dir = out.string();
  auto ck = load_checkpoint(import_hf(o), false);
  ASSERT_EQ(ck.meta.model_config["vocab_size"], 384);
  export_hf(ck, (tmp.path / "exported").string());

  const int T = 16, K = 3;
  std::mt19937 rng(11);
  std::vector<int32_t> ids(K * T + 1);
  std::string text;
  for (auto& v : ids) {
    v = static_cast<int32_t>(rng() % 300);
    text += std::to_string(v) + " ";
  }
  std::ofstream(tmp.path / "tokens.txt") << text;
  auto model = model_from_checkpoint(ck);
  std::vector<int32_t> x, y;
  for (int w = 0; w < K; ++w)
    for (int t = 0; t < T; ++t) {
      x.push_back(ids[w * T + t]);
      y.push_back(ids[w * T + t + 1]);
    }
  const double loss = model->forward_backward(x.data(), y.data(), K, T, false);

  const fs::path tokens = tmp.path / "tokens.txt";
  const double original = reference_loss(in, tokens, T), exported = reference_loss(tmp.path / "exported", tokens, T);
  EXPECT_EQ(original, exported);  // the same tensors, bit for bit
  EXPECT_NEAR(loss, original, 1e-5 * original);
  EXPECT_GT(std::abs(original - std::log(300.0)), 0.1);  // a test that tells models apart
}

// ---- through the binary ----
struct CliRun {
  int rc;
  std::string out, err;
};
CliRun run_cli(const fs::path& tmp, const std::string& args) {
  const std::string err_file = (tmp / "stderr.txt").string();
  std::FILE* p = ::popen((std::string(TRIDENT_BIN) + " " + args + " 2>" + err_file).c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, io::read_file(err_file)};
}

TEST_F(Hf, CliImportEvalExportAndErrors) {
  const json c = llama_config();
  write_folder(in, c, llama_tensors(c), 2);
  CliRun r = run_cli(tmp.path, "import --hf " + in.string() + " --out " + out.string() + " --block_size 32");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("ckpt-00000000"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("byte-level tokenizer"), std::string::npos) << r.err;  // the folder has none
  // eval runs on the imported checkpoint (byte-level tokens of a text file: all < vocab 300).
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(tmp.path / "text.txt") << text;
  r = run_cli(tmp.path, "eval --checkpoint " + out.string() + " --data " + (tmp.path / "text.txt").string() +
                            " --windows 2 --json --threads 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto ev = json::parse(r.out);
  EXPECT_EQ(ev["block_size"], 32);
  EXPECT_TRUE(std::isfinite(ev["loss"].get<double>()));
  EXPECT_GT(ev["loss"].get<double>(), 0.0);

  r = run_cli(tmp.path, "export --checkpoint " + out.string() + " --hf " + (tmp.path / "exported").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  json ec = json::parse(io::read_file((tmp.path / "exported" / "config.json").string()));
  EXPECT_EQ(ec["vocab_size"], 300);
  EXPECT_EQ(ec["max_position_embeddings"], 64);  // the model's own context, not the shorter block_size

  json bad = c;
  bad["num_key_value_heads"] = 3;
  std::ofstream(in / "config.json") << bad.dump();
  r = run_cli(tmp.path, "import --hf " + in.string() + " --out " + (tmp.path / "bad").string());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("num_key_value_heads is 3; expected a divisor of num_attention_heads 4"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(tmp.path / "bad"));
}

TEST_F(Hf, CliGpt2AliasesKeepTheirFlags) {
  // `gpt2 import --safetensors FILE` (no config.json; the heads given) and `gpt2 export --out FILE`.
  Folder f = gpt2_tensors();
  write_st(tmp.path / "gpt2.safetensors", f, names_of(f));
  CliRun r = run_cli(tmp.path, "gpt2 import --safetensors " + (tmp.path / "gpt2.safetensors").string() + " --out " +
                                out.string() + " --n_head 2 --vocab_multiple 64 --tokenizer byte");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto ck = load_checkpoint(find_checkpoint(out.string()), false);
  EXPECT_EQ(ck.meta.model_config["vocab_size"], 320);
  EXPECT_EQ(ck.meta.model_config["n_head"], 2);
  r = run_cli(tmp.path, "gpt2 export --checkpoint " + out.string() + " --out " + (tmp.path / "e.safetensors").string() +
                            " --vocab_size 300");
  ASSERT_EQ(r.rc, 0) << r.err;
  auto e = read_safetensors((tmp.path / "e.safetensors").string());
  EXPECT_EQ(e.at("transformer.h.0.attn.c_attn.weight").data, f.at("h.0.attn.c_attn.weight").data);
  EXPECT_EQ(e.at("lm_head.weight").data, f.at("wte.weight").data);  // a copy of wte: load_state_dict is strict

  // `gpt2 import --hf DIR` and `gpt2 export --hf DIR`: the new commands under the old name.
  write_folder(in, gpt2_config(), f);
  r = run_cli(tmp.path, "gpt2 import --hf " + in.string() + " --out " + (tmp.path / "o2").string() +
                            " --tokenizer byte");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_cli(tmp.path, "gpt2 export --checkpoint " + (tmp.path / "o2").string() + " --hf " +
                            (tmp.path / "e2").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  auto e2 = read_safetensors((tmp.path / "e2" / "model.safetensors").string());
  EXPECT_EQ(e2.at("transformer.wte.weight").data, f.at("wte.weight").data);
  r = run_cli(tmp.path, "gpt2 import --out " + (tmp.path / "o3").string());
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--hf DIR"), std::string::npos) << r.err;
}

// A Hugging Face Llama folder through the binary, as a user fine-tunes one: import, train from it at TP 2 over
// two processes (--init_from takes its architecture and shapes), export, and the reference Llama evaluates the
// exported folder to the loss trident computes on the trained checkpoint.
TEST_F(Hf, CliImportTrainAtTp2ExportMatchesThePyTorchReference) {
  if (!trident::testing::have_torch())
    TRIDENT_SKIP_MISSING("/usr/bin/python3 has no torch (apt-get install python3-torch)");
  const json c = llama_config();
  write_folder(in, c, llama_tensors(c, 3, 0.3f), 2);
  CliRun r = run_cli(tmp.path, "import --hf " + in.string() + " --out " + out.string() + " --tokenizer byte");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  std::ofstream(tmp.path / "text.txt") << text;
  const fs::path trained = tmp.path / "trained";
  r = run_cli(tmp.path, "train --init_from " + out.string() + " --nproc 2 --tp 2 --tokenizer byte --data " +
                            (tmp.path / "text.txt").string() + " --out_dir " + trained.string() +
                            " --block_size 16 --batch_size 2 --max_iters 4 --eval_interval 4 --eval_iters 1"
                            " --sample_tokens 0 --threads 1 --learning_rate 1e-2 --warmup_iters 1 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_cli(tmp.path, "export --checkpoint " + trained.string() + " --hf " + (tmp.path / "exported").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(json::parse(io::read_file((tmp.path / "exported" / "config.json").string()))["vocab_size"], 300);

  // Trident's loss on the trained checkpoint, over the windows the reference reads.
  auto ck = load_checkpoint(find_checkpoint(trained.string()), false);
  EXPECT_EQ(ck.meta.step, 4);
  auto model = model_from_checkpoint(ck);
  const int T = 16, K = 3;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(K * T + 1), x, y;
  std::string list;
  for (auto& v : ids) list += std::to_string(v = static_cast<int32_t>(rng() % 256)) + " ";
  std::ofstream(tmp.path / "tokens.txt") << list;
  for (int w = 0; w < K; ++w)
    for (int t = 0; t < T; ++t) x.push_back(ids[w * T + t]), y.push_back(ids[w * T + t + 1]);
  const double loss = model->forward_backward(x.data(), y.data(), K, T, false);
  const double ref = reference_loss(tmp.path / "exported", tmp.path / "tokens.txt", T);
  EXPECT_NEAR(loss, ref, 1e-5 * ref);
  // Training changed the model: the original folder evaluates differently.
  EXPECT_GT(std::abs(reference_loss(in, tmp.path / "tokens.txt", T) - ref), 1e-3);
}

}  // namespace
