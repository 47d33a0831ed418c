// The block contract ZeRO-3 relies on (nn::Model::blocks() and the block hook): the event sequence of
// forward and backward (with and without activation checkpointing), and that a block's list names every
// parameter it reads: a run in which each block's parameters exist only between its Before and After
// events (zero elsewhere) gives bitwise the loss and gradients of a normal run. Also zero_grad's
// page-releasing mode: values zero, pages handed back (mincore).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <random>
#include <set>

#include <fmt/format.h>

#include "trident/comm/transport/shm_buffer.h"
#include "trident/core/error.h"
#include "trident/nn/flat_model.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"

using trident::nn::Model;
using E = Model::BlockEvent;

namespace {

nlohmann::json cfg(const std::string& kind, bool ckpt, bool tie = true) {
  nlohmann::json j = {{"kind", kind},          {"n_layer", 3},  {"n_embd", 16},   {"block_size", 6},
                      {"vocab_size", 13},      {"bias", kind != "llama"},  {"seed", 5},
                      {"activation_checkpointing", ckpt}};
  if (kind != "mlp") j["n_head"] = 2;
  if (kind == "llama") j["n_kv_head"] = 1;  // multi-query: the key/value heads widened before attention
  if (kind != "gpt") j["tie_embeddings"] = tie;
  return j;
}

std::vector<int32_t> tokens(int n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % 13);
  return t;
}

// The sequence a model with K blocks must fire: forward 0..K-1; backward K-1..0, where each middle block
// (not the first nor the last two) is recomputed first under activation checkpointing.
std::vector<std::pair<int, E>> expected_events(int K, bool backward, bool ckpt) {
  std::vector<std::pair<int, E>> v;
  for (int b = 0; b < K; ++b) v.push_back({b, E::kBeforeForward}), v.push_back({b, E::kAfterForward});
  if (!backward) return v;
  for (int b = K - 1; b >= 0; --b) {
    if (ckpt && b >= 1 && b <= K - 3) v.push_back({b, E::kBeforeRecompute}), v.push_back({b, E::kAfterRecompute});
    v.push_back({b, E::kBeforeBackward});
    v.push_back({b, E::kAfterBackward});
  }
  return v;
}

class Blocks : public ::testing::TestWithParam<std::tuple<std::string, bool, bool>> {};

TEST_P(Blocks, EventsAndParameterListsAreComplete) {
  const auto [kind, ckpt, tie] = GetParam();
  auto m = trident::nn::make_model(cfg(kind, ckpt, tie));
  const auto blocks = m->blocks();
  const int K = static_cast<int>(blocks.size());
  ASSERT_EQ(K, 3 + 2);  // embedding, 3 layers, head
  std::set<size_t> listed;
  for (const auto& b : blocks) listed.insert(b.params.begin(), b.params.end());
  EXPECT_EQ(listed.size(), m->parameters().size()) << "every parameter is read by some block";
  // The head reads the embedding when tied.
  const auto& head = blocks.back().params;
  const bool head_reads_wte = std::find(head.begin(), head.end(), size_t{0}) != head.end();
  EXPECT_EQ(head_reads_wte, kind == "gpt" || tie);

  const int B = 2, T = 6;
  auto x = tokens(B * T, 1), y = tokens(B * T, 2);
  // Normal run.
  m->zero_grad();
  const float loss0 = m->forward_backward(x.data(), y.data(), B, T, true);
  std::vector<float> g0(m->grad_data(), m->grad_data() + m->num_params());
  const std::vector<float> p0(m->param_data(), m->param_data() + m->num_params());

  // Run with each block's parameters present only inside its events.
  std::vector<std::pair<int, E>> seen;
  float* P = m->param_data();
  const auto& params = m->parameters();
  auto put = [&](int b, bool present) {
    for (size_t k : blocks[b].params)
      for (size_t i = params[k].offset; i < params[k].offset + params[k].numel; ++i) P[i] = present ? p0[i] : 0.0f;
  };
  std::memset(P, 0, m->num_params() * sizeof(float));
  m->set_block_hook([&](int b, E e) {
    seen.push_back({b, e});
    const bool before = e == E::kBeforeForward || e == E::kBeforeBackward || e == E::kBeforeRecompute;
    put(b, before);
  });
  m->zero_grad();
  const float loss1 = m->forward_backward(x.data(), y.data(), B, T, true);
  EXPECT_EQ(loss1, loss0);
  for (size_t i = 0; i < g0.size(); ++i) ASSERT_EQ(m->grad_data()[i], g0[i]) << "gradient element " << i;
  EXPECT_EQ(seen, expected_events(K, true, ckpt));
  // Forward only (evaluation, logits).
  seen.clear();
  m->forward_backward(x.data(), y.data(), B, T, false);
  EXPECT_EQ(seen, expected_events(K, false, ckpt));
  m->set_block_hook(nullptr);
  seen.clear();
  std::memcpy(P, p0.data(), p0.size() * sizeof(float));
  m->forward_backward(x.data(), y.data(), B, T, true);
  EXPECT_TRUE(seen.empty());
}

INSTANTIATE_TEST_SUITE_P(Models, Blocks,
                         ::testing::Values(std::tuple{"gpt", false, true}, std::tuple{"gpt", true, true},
                                           std::tuple{"mlp", false, true}, std::tuple{"mlp", true, false},
                                           std::tuple{"llama", false, false}, std::tuple{"llama", true, true}),
                         [](const auto& info) {
                           return fmt::format("{}_{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "ckpt" : "plain",
                                              std::get<2>(info.param) ? "tied" : "untied");
                         });

TEST(ZeroGrad, ReleasingPagesZeroesAndFreesMemory) {
  nlohmann::json j = {{"kind", "mlp"}, {"n_layer", 4}, {"n_embd", 128}, {"block_size", 8}, {"vocab_size", 300},
                      {"seed", 1}};
  auto m = trident::nn::make_model(j);
  const size_t n = m->num_params(), bytes = n * sizeof(float);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto x = tokens(16, 3), y = tokens(16, 4);
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) nonzero += m->grad_data()[i] != 0.0f;
  ASSERT_GT(nonzero, n / 2);
  EXPECT_GE(trident::nn::resident_bytes(m->grad_data(), bytes), bytes);
  // Default: zeros written, memory stays.
  m->zero_grad();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(m->grad_data()[i], 0.0f);
  EXPECT_GE(trident::nn::resident_bytes(m->grad_data(), bytes), bytes);
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  m->set_zero_grad_releases_pages(true);
  m->zero_grad();
  EXPECT_LE(trident::nn::resident_bytes(m->grad_data(), bytes), 2 * page);  // only the partial end pages
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(m->grad_data()[i], 0.0f) << i;
  // Accumulation still works on the released pages: the same gradients as after a written zero_grad.
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  std::vector<float> g1(m->grad_data(), m->grad_data() + n);
  m->set_zero_grad_releases_pages(false);
  m->zero_grad();
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(m->grad_data()[i], g1[i]) << i;
}

// adopt_grad_storage (data parallelism's shared gradients): the gradients held are copied over, later
// backward passes accumulate there, and zero_grad() releasing pages frees shared memory too (MADV_REMOVE:
// they read back as zero and are no longer resident; MADV_DONTNEED would leave the old values).
TEST(ZeroGrad, AdoptedSharedStorageIsUsedAndZeroed) {
  nlohmann::json j = {{"kind", "mlp"}, {"n_layer", 4}, {"n_embd", 128}, {"block_size", 8}, {"vocab_size", 300},
                      {"seed", 1}};
  auto m = trident::nn::make_model(j), ref = trident::nn::make_model(j);
  const size_t n = m->num_params();
  auto x = tokens(16, 3), y = tokens(16, 4);
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  ref->forward_backward(x.data(), y.data(), 2, 8, true);
  auto shm = trident::ShmBuffer::allocate(n * sizeof(float));
  float* storage = static_cast<float*>(shm->data());
  ASSERT_TRUE(m->adopt_grad_storage(storage, std::shared_ptr<trident::ShmBuffer>(std::move(shm))));
  ASSERT_EQ(m->grad_data(), storage);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(storage[i], ref->grad_data()[i]) << i;
  m->forward_backward(x.data(), y.data(), 2, 8, true);  // accumulates into the adopted storage
  ref->forward_backward(x.data(), y.data(), 2, 8, true);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(storage[i], ref->grad_data()[i]) << i;
  const size_t bytes = n * sizeof(float), page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  m->zero_grad();  // written zeros
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(storage[i], 0.0f) << i;
  m->forward_backward(x.data(), y.data(), 2, 8, true);
  EXPECT_GE(trident::nn::resident_bytes(storage, bytes), bytes - page);
  m->set_zero_grad_releases_pages(true);
  m->zero_grad();
  EXPECT_LE(trident::nn::resident_bytes(storage, bytes), 2 * page);  // only the partial end pages
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(storage[i], 0.0f) << i;
  float unaligned[20];
  EXPECT_THROW(m->adopt_grad_storage(unaligned + 1, nullptr), trident::InvalidArgument);
  EXPECT_EQ(m->grad_data(), storage);  // a refused adoption keeps the storage in use
}

}  // namespace

namespace {

// AdamW::release_state(): the moments go away and come back as zeros (as a fresh optimizer's), or from
// load_state; a released optimizer steps exactly as a fresh one with the same step count.
TEST(AdamWRelease, ReleasedStateComesBackAsZeros) {
  nlohmann::json j = {{"kind", "mlp"}, {"n_layer", 2}, {"n_embd", 16}, {"block_size", 6}, {"vocab_size", 13},
                      {"seed", 2}};
  auto a = trident::nn::make_model(j), b = trident::nn::make_model(j);
  trident::optim::AdamW oa(*a, {}), ob(*b, {});
  auto x = tokens(12, 5), y = tokens(12, 6);
  a->forward_backward(x.data(), y.data(), 2, 6, true);
  oa.step(1e-2f);
  oa.release_state();
  EXPECT_FALSE(oa.has_state());
  EXPECT_TRUE(oa.exp_avg().empty());
  EXPECT_EQ(oa.step_count(), 1);
  // b: same parameters, fresh moments, step count 1.
  std::memcpy(b->param_data(), a->param_data(), a->num_params() * sizeof(float));
  ob.set_step_count(1);
  for (auto* m : {a.get(), b.get()}) {
    m->zero_grad();
    m->forward_backward(x.data(), y.data(), 2, 6, true);
  }
  oa.step(1e-2f);
  ob.step(1e-2f);
  ASSERT_TRUE(oa.has_state());
  EXPECT_EQ(oa.exp_avg(), ob.exp_avg());
  for (size_t i = 0; i < a->num_params(); ++i) ASSERT_EQ(a->param_data()[i], b->param_data()[i]) << i;
}

}  // namespace
