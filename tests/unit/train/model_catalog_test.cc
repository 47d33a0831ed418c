// One catalog of named shapes for `trident train`, `plan` and `simulate` (plan/model.h), and one derivation
// of the planner's model from a training config (train::plan_model_spec): a named model trains with exactly
// the shapes the planner plans it with.
#include <gtest/gtest.h>

#include "trident/core/error.h"
#include "trident/nn/models.h"
#include "trident/plan/model.h"
#include "trident/train/config.h"

namespace trident::train {
namespace {

TEST(ModelCatalog, EveryEntryTrainsWithThePlannersShapes) {
  for (const auto& name : plan::model_preset_names()) {
    SCOPED_TRACE(name);
    const plan::ModelSpec want = plan::model_preset(name);
    TrainConfig c = parse_train_args({"--model", name});
    EXPECT_EQ(c.model.kind, want.arch);
    const plan::ModelSpec got = plan_model_spec(c, want.vocab);
    EXPECT_EQ(got.layers, want.layers);
    EXPECT_EQ(got.hidden, want.hidden);
    EXPECT_EQ(got.heads, want.heads);
    EXPECT_EQ(got.kv(), want.kv());
    EXPECT_EQ(got.ffn(), want.ffn());
    EXPECT_EQ(got.gated_mlp, want.gated_mlp);
    EXPECT_EQ(got.tied_embeddings, want.tied_embeddings);
    EXPECT_EQ(got.learned_positions, want.learned_positions);
    EXPECT_EQ(got.seq, want.seq);
    EXPECT_EQ(got.rope_theta, want.rope_theta);
    // The training config pads the vocabulary to a multiple of 128 (llm.c); the rest of the count is equal.
    const double pad = (got.vocab - want.vocab) * double(want.hidden) * (want.tied_embeddings ? 1 : 2);
    EXPECT_DOUBLE_EQ(got.total_params(), want.total_params() + pad);
  }
}

TEST(ModelCatalog, NamesAliasesAndLaterKeysOverride) {
  TrainConfig c = parse_train_args({"--model", "gpt2"});
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.tokenizer, "gpt2");
  c = parse_train_args({"--model", "llama3.2-1b", "--n_layer", "2", "--block_size", "64"});
  EXPECT_EQ(c.model.kind, "llama");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_kv_head, 8);
  EXPECT_EQ(c.model.tie_embeddings, std::optional<bool>(true));
  const nlohmann::json j = model_config_json(c, 128256);
  EXPECT_EQ(j["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(nn::ModelConfig::from_json(j).rope_theta, 500000.0);
  c = parse_train_args({"--model", "tinyllama-1.1b"});
  EXPECT_EQ(c.model.intermediate_size, 5632);
  EXPECT_EQ(c.model.n_kv_head, 4);
  try {
    parse_train_args({"--model", "llama4"});
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos) << e.what();
  }
}

TEST(ModelCatalog, ModelRulesAreCheckedWhenTheConfigIsRead) {
  auto error_of = [](const std::vector<std::string>& args) {
    try {
      parse_train_args(args);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of({"--model", "llama", "--n_kv_head", "3"}).find("n_head 4 is not divisible by n_kv_head 3"),
            std::string::npos);
  EXPECT_NE(error_of({"--model", "llama", "--rope_scaling", "{\"rope_type\":\"dynamic\",\"factor\":2}"})
                .find("rope_scaling type 'dynamic' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of({"--model", "llama", "--rope_scaling", "{oops"}).find("bad value '{oops' for config key 'rope_scaling'"),
            std::string::npos);
  EXPECT_NE(error_of({"--model", "llama", "--tp", "3"}).find("tp=3 does not divide n_head=4"), std::string::npos);
  EXPECT_EQ(error_of({"--model", "llama", "--n_kv_head", "1", "--tp", "2"}), "accepted");  // copies of the kv heads
}

}  // namespace
}  // namespace trident::train
