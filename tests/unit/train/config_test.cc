// Config parsing: defaults, flag forms, JSON files, and every error path.
#include <gtest/gtest.h>

#include "harness/temp_dir.h"
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "trident/core/error.h"
#include "trident/train/config.h"
#include "trident/train/run_plan.h"

using namespace trident;
using namespace trident::train;
namespace fs = std::filesystem;

namespace {
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_train_args(args);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}
std::string write_tmp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / fmt::format("trident-config-{}-{}", ::getpid(), name);
  std::ofstream(p) << text;
  return p.string();
}
}  // namespace

TEST(Config, DefaultsAreNanoGptShakespeareCharCpu) {
  TrainConfig c = parse_train_args({});
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.model.block_size, 64);
  EXPECT_EQ(c.batch_size, 12);
  EXPECT_EQ(c.max_iters, 2000);
  EXPECT_EQ(c.lr_decay_iters, 2000);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  EXPECT_DOUBLE_EQ(c.min_lr, 1e-4);
  EXPECT_EQ(c.warmup_iters, 100);
  EXPECT_DOUBLE_EQ(c.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.0);
  EXPECT_EQ(c.data, "/usr/share/games/fortunes");
  EXPECT_EQ(c.tokenizer, "char");
  EXPECT_EQ(c.model.seed, 1337);
  // Every key appears in to_json and in the help.
  auto j = c.to_json();
  std::string help = config_help();
  for (const auto& k : config_keys()) {
    EXPECT_TRUE(j.contains(k.name)) << k.name;
    EXPECT_CONTAINS(help, "--" + k.name);
  }
}

// The training config holds the model config: its defaults are nn::ModelConfig's, and the model built and the
// planner's description come from the same resolved config.
TEST(Config, HoldsTheOneModelConfig) {
  const TrainConfig c = parse_train_args({});
  EXPECT_EQ(c.model.to_json(true), nn::ModelConfig{}.to_json(true));
  EXPECT_FALSE(c.model.tie_embeddings.has_value());  // auto: the architecture's
  const nn::ModelConfig built = model_config(c, 65);
  EXPECT_EQ(built.to_json(), nn::ModelConfig::from_json(model_config_json(c, 65)).to_json());
  EXPECT_EQ(built.tie_embeddings, std::optional<bool>(true));  // the GPT ties its head
  const TrainConfig l = parse_train_args({"--model", "llama", "--n_kv_head", "2", "--tie_embeddings", "auto"});
  const nn::ModelConfig lb = model_config(l, 65);
  EXPECT_EQ(lb.tie_embeddings, std::optional<bool>(false));
  EXPECT_EQ(lb.n_kv_head, 2);
  EXPECT_EQ(lb.intermediate_size, 352);  // 8/3 x 128 rounded up to 32: the architecture's default
  const plan::ModelSpec spec = plan_model_spec(l, 65);
  EXPECT_EQ(spec.kv_heads, 2);
  EXPECT_EQ(spec.ffn_hidden, 352);
  EXPECT_FALSE(spec.tied_embeddings);
  // rope_scaling is a JSON object on the command line and in files; to_json gives it back as one.
  const std::string rs = R"({"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,)"
                         R"("original_max_position_embeddings":64})";
  const TrainConfig r = parse_train_args({"--model", "llama", "--rope_scaling", rs});
  EXPECT_EQ(r.to_json()["rope_scaling"]["factor"], 8);
  EXPECT_EQ(model_config(r, 65).rope_scaling["rope_type"], "llama3");
  EXPECT_CONTAINS(error_of({"--model", "llama", "--rope_scaling", "{oops"}), "a JSON object");
  EXPECT_CONTAINS(error_of({"--model", "llama", "--rope_scaling", R"({"rope_type":"yarn"})"}), "'yarn'");
  // The model's own rules are checked once, by the model config, for train as for every other command.
  EXPECT_CONTAINS(error_of({"--dropout", "0.1"}), "dropout");
  EXPECT_CONTAINS(error_of({"--model", "llama", "--n_kv_head", "3"}), "n_kv_head 3");
}

TEST(Config, FlagFormsDashesAndUnderscores) {
  TrainConfig c = parse_train_args({"--n-layer", "3", "--n_head=2", "--n-embd=64", "--learning-rate", "3e-4",
                                    "--bias", "--always-save-checkpoint", "false", "--out_dir=/tmp/x", "--data",
                                    "--weird=name", "--tokenizer", "byte"});
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 2);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_TRUE(c.model.bias);
  EXPECT_FALSE(c.always_save_checkpoint);
  EXPECT_EQ(c.out_dir, "/tmp/x");
  EXPECT_EQ(c.data, "--weird=name");  // a value after a non-boolean key is taken as is
  EXPECT_EQ(c.tokenizer, "byte");
  // A bare boolean flag followed by another flag; later flags win.
  c = parse_train_args({"--resume", "--json", "--max-iters", "5", "--max_iters=7"});
  EXPECT_EQ(c.resume, Resume::kYes);
  EXPECT_TRUE(c.json);
  EXPECT_EQ(c.max_iters, 7);
  // resume also takes auto (as a value after the flag, after '=', in JSON), and round-trips through to_json.
  c = parse_train_args({"--resume", "auto", "--json"});
  EXPECT_EQ(c.resume, Resume::kAuto);
  EXPECT_EQ(c.to_json()["resume"], "auto");
  EXPECT_EQ(parse_train_args({"--resume=false"}).resume, Resume::kNo);
  EXPECT_EQ(parse_train_args({"--resume=yes"}).to_json()["resume"], true);
  TrainConfig j;
  apply_config_json(j, nlohmann::json{{"resume", "auto"}}, "test");
  EXPECT_EQ(j.resume, Resume::kAuto);
  apply_config_json(j, nlohmann::json{{"resume", false}}, "test");
  EXPECT_EQ(j.resume, Resume::kNo);
  EXPECT_THROW(apply_config_json(j, nlohmann::json{{"resume", "sometimes"}}, "test"), InvalidArgument);
  EXPECT_THROW(parse_train_args({"--resume=sometimes"}), InvalidArgument);
  try {
    parse_train_args({"--resume", "maybe"});
    ADD_FAILURE() << "--resume maybe was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad value 'maybe' for config key 'resume'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("or auto"), std::string::npos) << e.what();
  }
  // A base config (trident train under --max-restarts defaults resume to auto) is overridden by the line.
  TrainConfig base;
  base.resume = Resume::kAuto;
  EXPECT_EQ(parse_train_args({"--max-iters", "3"}, base).resume, Resume::kAuto);
  EXPECT_EQ(parse_train_args({"--resume", "false"}, base).resume, Resume::kNo);
  c = parse_train_args({"--bias=0", "--decay-lr", "off"});
  EXPECT_FALSE(c.model.bias);
  EXPECT_FALSE(c.decay_lr);
}

TEST(Config, UnknownKeysSuggestTheNearest) {
  std::string e = error_of({"--n_layers", "3"});
  EXPECT_CONTAINS(e, "unknown config key 'n_layers'");
  EXPECT_CONTAINS(e, "did you mean 'n_layer'?");
  e = error_of({"--learning-rat=1"});
  EXPECT_CONTAINS(e, "did you mean 'learning_rate'?");
  e = error_of({"--zzzzzzzzzzzzz", "1"});
  EXPECT_CONTAINS(e, "unknown config key 'zzzzzzzzzzzzz'");
  EXPECT_CONTAINS(e, "trident train --help");
}

TEST(Config, BadValuesNameTheKeyAndWhatIsAllowed) {
  std::string e = error_of({"--n_layer", "three"});
  EXPECT_CONTAINS(e, "'three'");
  EXPECT_CONTAINS(e, "'n_layer'");
  EXPECT_CONTAINS(e, "an integer >=1");
  EXPECT_CONTAINS(error_of({"--n_layer", "0"}), "an integer >=1");
  EXPECT_CONTAINS(error_of({"--n_layer", "2.5"}), "'n_layer'");
  EXPECT_CONTAINS(error_of({"--learning_rate", "-1"}), "a number >0");
  EXPECT_CONTAINS(error_of({"--learning_rate", "1e-3x"}), "'learning_rate'");
  EXPECT_CONTAINS(error_of({"--beta2", "1.0"}), "[0,1)");
  EXPECT_CONTAINS(error_of({"--tokenizer", "bpe"}), "one of char|byte");
  EXPECT_CONTAINS(error_of({"--dtype=fp8"}), "one of float32|bfloat16");
  EXPECT_CONTAINS(error_of({"--bias=maybe"}), "a boolean");
  EXPECT_CONTAINS(error_of({"--n_layer"}), "--n_layer needs a value");
  EXPECT_CONTAINS(error_of({"n_layer", "3"}), "unexpected argument 'n_layer'");
  EXPECT_CONTAINS(error_of({"--config"}), "--config needs a file name");
  // Cross-key checks.
  EXPECT_CONTAINS(error_of({"--n_embd", "130", "--n_head", "4"}), "divisible by n_head");
  EXPECT_CONTAINS(error_of({"--min_lr", "0.1"}), "min_lr");
  EXPECT_CONTAINS(error_of({"--warmup_iters", "3000"}), "warmup_iters");
}

TEST(Config, JsonFileThenFlagsOverride) {
  std::string f = write_tmp("ok.json", R"({"n_layer": 6, "n-head": 6, "n_embd": 384, "dropout": 0.0,
                                          "bias": true, "tokenizer": "byte", "max_iters": 5000.0})");
  // --config given after the flag still loses to it: files first, then flags.
  TrainConfig c = parse_train_args({"--n_layer", "2", "--config", f});
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 6);
  EXPECT_EQ(c.model.n_embd, 384);
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.tokenizer, "byte");
  EXPECT_EQ(c.max_iters, 5000);
  fs::remove(f);

  f = write_tmp("typo.json", R"({"n_layers": 6})");
  std::string e = error_of({"--config=" + f});
  EXPECT_CONTAINS(e, "unknown config key 'n_layers'");
  EXPECT_CONTAINS(e, f);
  EXPECT_CONTAINS(e, "did you mean 'n_layer'?");
  fs::remove(f);
  f = write_tmp("type.json", R"({"bias": "yes"})");
  EXPECT_CONTAINS(error_of({"--config", f}), "'bias'");
  fs::remove(f);
  f = write_tmp("type2.json", R"({"n_layer": 2.5})");
  EXPECT_CONTAINS(error_of({"--config", f}), "'n_layer'");
  fs::remove(f);
  f = write_tmp("bad.json", R"({"n_layer": )");
  EXPECT_CONTAINS(error_of({"--config", f}), "not valid JSON");
  fs::remove(f);
  // A number too large for any JSON number type (the fuzzer's find: nlohmann raises out_of_range, not
  // parse_error, and it escaped).
  f = write_tmp("huge.json", R"({"n_layer": 111111111111111E11111})");
  EXPECT_CONTAINS(error_of({"--config", f}), "not valid JSON");
  fs::remove(f);
  f = write_tmp("arr.json", R"([1, 2])");
  EXPECT_CONTAINS(error_of({"--config", f}), "JSON object");
  fs::remove(f);
  EXPECT_CONTAINS(error_of({"--config", "x.toml"}), "TOML is not supported");
  EXPECT_THROW(parse_train_args({"--config", "/nonexistent/cfg.json"}), IoError);
}

// The configs the README and scripts/main.sh name, each parsed to the values it is there for; a config in
// configs/ that this list does not name fails too, so a new one gets its expectations written here.
TEST(Config, ShippedExampleConfigsParse) {
  const fs::path dir = fs::path(TRIDENT_SOURCE_DIR) / "configs";
  struct Expected {
    const char* file;
    const char* out_dir;
    const char* data;
  };
  const Expected expected[] = {
      {"fortunes_char.json", "out/fortunes-char", "/usr/share/games/fortunes"},  // scripts/main.sh
      {"shakespeare_char.json", "out/shakespeare-char", "data/tinyshakespeare/input.txt"},  // README
  };
  std::set<std::string> named;
  for (const Expected& e : expected) {
    named.insert(e.file);
    ASSERT_TRUE(fs::exists(dir / e.file)) << "configs/" << e.file << " is missing";
    const TrainConfig c = parse_train_args({"--config", (dir / e.file).string()});
    EXPECT_EQ(c.out_dir, e.out_dir) << e.file;
    EXPECT_EQ(c.data, e.data) << e.file;
    EXPECT_EQ(c.tokenizer, "char") << e.file;  // both are nanoGPT's character-level runs
    EXPECT_EQ(c.max_iters, 2000) << e.file;
    EXPECT_EQ(c.model.n_layer, 4) << e.file;
    EXPECT_EQ(c.model.n_embd, 128) << e.file;
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    EXPECT_TRUE(named.count(e.path().filename().string())) << e.path() << " is not among the expected configs";
  }
}

TEST(Config, ModelConfigCarriesTheModelKeys) {
  TrainConfig c = parse_train_args({"--model", "mlp", "--n_layer", "3", "--gelu", "tanh"});
  auto j = model_config_json(c, 65);
  EXPECT_EQ(j["kind"], "mlp");
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["vocab_size"], 65);
  EXPECT_EQ(j["gelu"], "tanh");
  EXPECT_EQ(j["block_size"], 64);
}

TEST(Config, DeviceFromFlagAndJsonAndItsLimits) {
  EXPECT_EQ(parse_train_args({}).model.device, "cpu");
  EXPECT_EQ(parse_train_args({"--device", "cuda"}).model.device, "cuda");
  EXPECT_EQ(parse_train_args({"--device=cuda"}).model.device, "cuda");
  std::string f = write_tmp("device.json", R"({"device": "cuda"})");
  EXPECT_EQ(parse_train_args({"--config", f}).model.device, "cuda");
  EXPECT_EQ(parse_train_args({"--config", f, "--device", "cpu"}).model.device, "cpu");  // flags win over files
  fs::remove(f);
  EXPECT_CONTAINS(error_of({"--device", "gpu"}), "one of cpu|cuda");
  // The model config carries it to nn::make_model.
  TrainConfig c = parse_train_args({"--device", "cuda"});
  EXPECT_EQ(model_config_json(c, 65).at("device"), "cuda");
  // Model parallelism runs on the GPU as on the CPU; bfloat16 parameter storage is refused by name.
  EXPECT_EQ(parse_train_args({"--device", "cuda", "--tp", "2", "--pp", "2", "--n_head", "4"}).tp, 2);
  try {
    parse_train_args({"--device", "cuda", "--param_dtype", "bfloat16"});
    ADD_FAILURE() << "device cuda with param_dtype bfloat16 was accepted";
  } catch (const Unsupported& e) {
    EXPECT_CONTAINS(e.what(), "param_dtype=bfloat16");
    EXPECT_CONTAINS(e.what(), "--param_dtype float32");
  }
}

TEST(Config, Gpt2PresetsSetShapesThatOtherKeysOverride) {
  TrainConfig c = parse_train_args({"--n_embd", "64", "--model", "gpt2-medium"});
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.n_layer, 24);
  EXPECT_EQ(c.model.n_head, 16);
  EXPECT_EQ(c.model.n_embd, 64);  // given explicitly: wins over the preset wherever it appears
  EXPECT_EQ(c.model.block_size, 1024);
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.model.gelu, "tanh");
  EXPECT_EQ(c.tokenizer, "gpt2");
  EXPECT_EQ(padded_vocab(c, 50257), 50304);
  TrainConfig xl = parse_train_args({"--model=gpt2-xl"});
  EXPECT_EQ(xl.model.n_layer, 48);
  EXPECT_EQ(xl.model.n_head, 25);
  EXPECT_EQ(xl.model.n_embd, 1600);
}

// `trident train --device cuda` checks the planner's device memory before it allocates: llama3-8b in float32
// (the storage trident's GPU runs keep: 4 + 4 + 8 bytes per parameter) with one 8192-token sequence and
// activation checkpointing on one H200. Counted by hand: without offload it needs 16 bytes per parameter
// plus activations, more than the 126.9 GB usable, and is refused naming the bytes and the fix; with
// --offload optimizer it needs 8 and fits. The same through ZeRO-3 over 8 GPUs without offload.
TEST(Config, DeviceMemoryCheckRefusesWhatTheGpuCannotHold) {
  const double psi = 8030261248.0;  // llama3-8b (tests/unit/plan/planner_test.cc counts it by hand)
  const double s = 8192, h = 4096, L = 32, V = 128256;
  const double activations = 2 * (L * 2 * s * h) + 4 * s * V;  // float32 layer inputs, float32 logits
  TrainConfig c = parse_train_args({"--model", "llama3-8b", "--batch_size", "1", "--activation_checkpointing", "true"});
  ASSERT_EQ(c.model.block_size, 8192);
  try {
    check_device_memory(c, static_cast<int>(V), 1, 0, "h200");
    ADD_FAILURE() << "llama3-8b without offload was accepted on one H200";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(static_cast<double>(e.bytes), 16 * psi + activations);
    const std::string w = e.what();
    EXPECT_CONTAINS(w, std::to_string(static_cast<long long>(16 * psi + activations)) + " bytes) needed");
    EXPECT_CONTAINS(w, "126900000000 bytes) usable");
    EXPECT_CONTAINS(w, "--offload optimizer");
    EXPECT_EQ(w.find("--activation_checkpointing"), std::string::npos) << "already on, yet offered: " << w;
  }
  c.offload = "optimizer";
  const plan::MemoryCheck ok = check_device_memory(c, static_cast<int>(V), 1, 0, "h200");
  EXPECT_TRUE(ok.fits);
  EXPECT_DOUBLE_EQ(ok.needed_bytes, 8 * psi + activations);
  EXPECT_DOUBLE_EQ(ok.host_bytes, 8 * psi);  // m and v; the float32 parameters are their own master
  c.offload = "none";
  const plan::MemoryCheck z3 = check_device_memory(c, static_cast<int>(V), 8, 3, "h200");
  EXPECT_TRUE(z3.fits);
  EXPECT_DOUBLE_EQ(z3.memory.optimizer, 8 * psi / 8);
}
