// Megatron tensor parallelism and pipeline chunks (parallel/parallel_model.h) against the single-process
// model (nn::make_model, same config and seed): loss, full logits and every gathered gradient at TP 1
// (bit-identical: the same layers and kernels), 2, 3 and 4 (GPT with and without biases, with activation
// checkpointing, deep MLP, Llama with key/value heads split or copied over the ranks, tied or not);
// LayerNorm and replicated bias gradients bit-identical across TP ranks;
// exactly 4 all-reduces of B*T*C per block, counted by a wrapper ProcessGroup; pipeline chunks chained by hand (several microbatches, interleaved chunks) and
// across processes (tied embedding gradient sync, gather over tp x pp); layout errors name the fix;
// 5 AdamW steps under TP 2 track the single process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"
#include "trident/core/timeline.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/parallel_model.h"

namespace trident {
namespace {

using parallel::ModelLayout;
using parallel::ParallelModel;

constexpr int kB = 2, kT = 16;

nlohmann::json gpt_config(bool bias, bool ckpt = false) {
  return {{"kind", "gpt"}, {"n_layer", 2},      {"n_head", 4}, {"n_embd", 32}, {"block_size", 16},
          {"vocab_size", 64}, {"bias", bias}, {"seed", 11}, {"activation_checkpointing", ckpt}};
}

void make_batch(int seed, int rows, int V, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  x->resize(static_cast<size_t>(rows) * kT);
  y->resize(static_cast<size_t>(rows) * kT);
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t <= kT; ++t) {
      const uint32_t h = static_cast<uint32_t>((seed * 131 + r * 31 + t * 7 + 3) * 2654435761u);
      const int32_t tok = static_cast<int32_t>((h >> 9) % V);
      if (t < kT) (*x)[r * kT + t] = tok;
      if (t > 0) (*y)[r * kT + t - 1] = tok;
    }
}

testing::RunOptions run_options() {
  testing::RunOptions o;
  o.deadline_s = 120;
  return o;
}

std::shared_ptr<ProcessGroup> make_group(int rank, int size, std::shared_ptr<Store> store) {
  GroupOptions go;
  go.timeout = Seconds(60);
  return new_process_group(std::move(store), rank, size, go);
}

// max |a - b| over a tensor relative to max |b| of that tensor (near-zero elements judged by their tensor).
double tensor_rel_err(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// Compares every parameter's values (or gradients) of `got` with `want`; returns "" or the worst tensor.
std::string compare_models(nn::Model& got, nn::Model& want, bool grads, double tol) {
  const float* g = grads ? got.grad_data() : got.param_data();
  const float* w = grads ? want.grad_data() : want.param_data();
  for (const auto& p : want.parameters()) {
    const double e = tensor_rel_err(g + p.offset, w + p.offset, p.numel);
    if (!(e <= tol)) return fmt::format("{} {}: relative error {}", grads ? "gradient" : "value", p.name, e);
  }
  return "";
}

// ---------------------------------------------------------------------------------------------------
// A ProcessGroup that forwards every call to a real one and records what was issued.

class CountingGroup : public ProcessGroup {
 public:
  struct Call {
    OpKind op;
    size_t count;
    ReduceOp redop;
  };
  explicit CountingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size(), inner->name() + "/counting", inner->timeout()),
        inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<ProcessGroup> split(int color, int key) override { return inner_->split(color, key); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::vector<Call> calls;

 protected:
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& ranks, const std::string& name) override {
    return inner_->new_group(ranks, name);
  }
  std::shared_ptr<Work> post(const CollArgs& a, const CallOptions& o, bool) override {
    calls.push_back({a.op, a.count, a.redop});
    switch (a.op) {
      case OpKind::kAllReduce: return inner_->all_reduce_async(a.send, a.recv, a.count, a.dtype, a.redop, o);
      case OpKind::kAllGather: return inner_->all_gather_async(a.send, a.recv, a.count, a.dtype, o);
      case OpKind::kGather: return inner_->gather_async(a.send, a.recv, a.count, a.dtype, a.root, o);
      case OpKind::kBroadcast: return inner_->broadcast_async(a.recv, a.count, a.dtype, a.root, o);
      case OpKind::kBarrier: return inner_->barrier_async(o);
      default: TRIDENT_THROW(Unsupported, "CountingGroup: {} is not forwarded", op_name(a.op));
    }
  }

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

// ---------------------------------------------------------------------------------------------------
// TP-only (pp 1): the nn::Model interface of the shard against the single process.

void tp_parity_rank(const nlohmann::json& cfg, int rank, int size, std::shared_ptr<Store> store) {
  kernels::cpu::set_num_threads(1);
  auto pg = make_group(rank, size, store);
  ModelLayout lay;
  lay.tp_rank = rank;
  lay.tp_size = size;
  auto pm = parallel::make_parallel_model(cfg, lay, size > 1 ? pg : nullptr, nullptr);
  auto ref = nn::make_model(cfg);
  const int V = cfg.at("vocab_size").get<int>();
  std::vector<int32_t> x, y;
  make_batch(1, kB, V, &x, &y);

  // The shard holds exactly the single-process initial weights.
  auto full = nn::make_model(cfg);
  std::memset(full->param_data(), 0, sizeof(float) * full->num_params());
  pm->gather_to_full(full.get(), *pg, 0);
  if (rank == 0) {
    const std::string bad = compare_models(*full, *ref, false, 0.0);
    TRIDENT_RANK_CHECK(bad.empty(), "{}", bad);
  }

  const float want = ref->forward_backward(x.data(), y.data(), kB, kT, true, 1.0f);
  std::vector<size_t> fired;
  pm->set_grad_ready_hook([&](size_t i) { fired.push_back(i); });
  const float got = pm->forward_backward(x.data(), y.data(), kB, kT, true, 1.0f);
  pm->set_grad_ready_hook(nullptr);
  TRIDENT_RANK_CHECK(std::abs(got - want) <= 1e-5 * std::abs(want), "loss {} vs single process {}", got, want);
  // The grad-ready hook: every parameter exactly once, strictly descending (DataParallel's contract).
  TRIDENT_RANK_CHECK(fired.size() == pm->parameters().size(), "hook fired {} times for {} parameters",
                     fired.size(), pm->parameters().size());
  for (size_t k = 0; k < fired.size(); ++k)
    TRIDENT_RANK_CHECK(fired[k] == fired.size() - 1 - k, "hook call {} named parameter {}", k, fired[k]);
  // Evaluation (no backward) gives the same loss and leaves the gradients alone.
  const float g0 = pm->grad_data()[pm->parameters().back().offset];
  const float eval = pm->forward_backward(x.data(), y.data(), kB, kT, false, 1.0f);
  TRIDENT_RANK_CHECK(eval == got && pm->grad_data()[pm->parameters().back().offset] == g0, "eval loss {} vs {}",
                     eval, got);

  std::vector<float> lw(static_cast<size_t>(kB) * kT * V), lg(lw.size());
  ref->forward_logits(x.data(), kB, kT, lw.data());
  pm->forward_logits(x.data(), kB, kT, lg.data());
  const double le = tensor_rel_err(lg.data(), lw.data(), lw.size());
  TRIDENT_RANK_CHECK(le <= 1e-5, "full logits differ: relative error {}", le);

  full->zero_grad();
  pm->gather_grads_to_full(full.get(), *pg, 0);
  if (rank == 0) {
    const std::string bad = compare_models(*full, *ref, true, 1e-5);
    TRIDENT_RANK_CHECK(bad.empty(), "{}", bad);
  }
  // TP 1 runs the single-process model's layers and kernels: bit-identical loss, logits and gradients.
  if (size == 1) {
    TRIDENT_RANK_CHECK(got == want, "TP 1 loss {} is not bit-identical to the single process {}", got, want);
    TRIDENT_RANK_CHECK(std::memcmp(lg.data(), lw.data(), lw.size() * sizeof(float)) == 0,
                       "TP 1 logits are not bit-identical to the single process");
    const std::string bad = compare_models(*full, *ref, true, 0.0);
    TRIDENT_RANK_CHECK(bad.empty(), "TP 1 is not bit-identical to the single process: {}", bad);
  }

  // Replicated tensors (LayerNorms, row-parallel biases, wpe): bit-identical gradients on every TP rank.
  const auto& specs = pm->shard_specs();
  int replicated = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].replicated) continue;
    ++replicated;
    const auto& p = pm->parameters()[i];
    std::vector<float> all(p.numel * size);
    pg->all_gather(pm->grad_data() + p.offset, all.data(), p.numel, DType::kFloat32);
    for (int r = 1; r < size; ++r)
      TRIDENT_RANK_CHECK(std::memcmp(all.data(), all.data() + r * p.numel, p.numel * sizeof(float)) == 0,
                         "gradient of replicated {} differs between TP rank 0 and {}", p.name, r);
  }
  TRIDENT_RANK_CHECK(replicated > 0, "no replicated parameters found");

  // Global gradient norm: each logical element counted once.
  double ss = pm->grad_sum_squares();
  pg->all_reduce(&ss, 1, DType::kFloat64, ReduceOp::kSum);
  const double ref_ss = kernels::cpu::sum_squares(ref->grad_data(), ref->num_params());
  TRIDENT_RANK_CHECK(std::abs(ss - ref_ss) <= 1e-5 * ref_ss, "grad sum of squares {} vs {}", ss, ref_ss);
}

struct TpCase {
  int tp;
  bool bias;
  bool ckpt;
  std::string kind;
};

class TensorParallelParity : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelParity, LossLogitsAndGradientsMatchOneProcess) {
  const TpCase c = GetParam();
  nlohmann::json cfg = gpt_config(c.bias, c.ckpt);
  if (c.kind == "gpt_h6") cfg = {{"kind", "gpt"}, {"n_layer", 2}, {"n_head", 6}, {"n_embd", 48}, {"block_size", 16},
                                 {"vocab_size", 66}, {"bias", c.bias}, {"seed", 13}};
  if (c.kind == "mlp") cfg = {{"kind", "mlp"}, {"n_layer", 3}, {"n_embd", 32}, {"block_size", 16},
                              {"vocab_size", 64}, {"bias", c.bias}, {"seed", 5}, {"tie_embeddings", !c.ckpt}};
  if (c.kind.rfind("llama", 0) == 0) {
    // llama_kvK: K key/value heads of 4 (split over the TP ranks when tp divides K, else copied on each);
    // llama_h6_kv2: 6 query heads, 2 key/value heads, for tp 3. bias=true here means a tied head; ckpt as named.
    const bool h6 = c.kind == "llama_h6_kv2";
    cfg = {{"kind", "llama"},     {"n_layer", 2},        {"n_head", h6 ? 6 : 4},
           {"n_kv_head", h6 ? 2 : c.kind.back() - '0'}, {"n_embd", h6 ? 48 : 32}, {"intermediate_size", h6 ? 96 : 40},
           {"block_size", 16},     {"vocab_size", h6 ? 66 : 64}, {"seed", 7},
           {"tie_embeddings", c.bias}, {"activation_checkpointing", c.ckpt}};
  }
  auto res = testing::run_processes(c.tp, [&](int r, int n, std::shared_ptr<Store> st) { tp_parity_rank(cfg, r, n, st); },
                                    run_options());
  ASSERT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(
    Models, TensorParallelParity,
    ::testing::Values(TpCase{1, true, false, "gpt"}, TpCase{2, true, false, "gpt"}, TpCase{4, true, false, "gpt"},
                      TpCase{1, false, false, "gpt"}, TpCase{2, false, false, "gpt"}, TpCase{4, false, false, "gpt"},
                      TpCase{1, true, true, "gpt"}, TpCase{2, true, true, "gpt"}, TpCase{3, true, false, "gpt_h6"},
                      // mlp: ckpt=true here means an untied lm_head (see the test body).
                      TpCase{1, true, false, "mlp"}, TpCase{1, false, true, "mlp"}, TpCase{2, true, false, "mlp"},
                      TpCase{2, false, true, "mlp"}, TpCase{4, true, false, "mlp"},
                      // llama: bias=true means a tied head (the Llama has no biases).
                      TpCase{1, false, false, "llama_kv2"}, TpCase{2, false, false, "llama_kv2"},
                      TpCase{4, false, false, "llama_kv2"}, TpCase{2, false, true, "llama_kv1"},
                      TpCase{2, true, false, "llama_kv4"}, TpCase{3, false, false, "llama_h6_kv2"}),
    [](const auto& info) {
      const bool llama = info.param.kind.rfind("llama", 0) == 0;
      return fmt::format("{}_tp{}_{}{}", info.param.kind, info.param.tp,
                         llama ? (info.param.bias ? "tied" : "untied") : info.param.bias ? "bias" : "nobias",
                         info.param.ckpt ? (info.param.kind == "mlp" ? "_untied" : "_ckpt") : "");
    });

// ---------------------------------------------------------------------------------------------------
// Collective count per block: a middle pipeline stage holding one block, under TP 2.

TEST(TensorParallel, OneBlockIssuesExactlyFourAllReducesOfBTC) {
  auto res = testing::run_processes(2, [](int rank, int size, std::shared_ptr<Store> store) {
    kernels::cpu::set_num_threads(1);
    auto counting = std::make_shared<CountingGroup>(make_group(rank, size, store));
    const nlohmann::json cfg = {{"kind", "gpt"}, {"n_layer", 3}, {"n_head", 4}, {"n_embd", 32},
                                {"block_size", 16}, {"vocab_size", 64}, {"bias", true}, {"seed", 3}};
    ModelLayout lay;
    lay.tp_rank = rank;
    lay.tp_size = size;
    lay.pp_rank = 1;
    lay.pp_size = 3;
    auto pm = parallel::make_parallel_model(cfg, lay, counting, nullptr);
    TRIDENT_RANK_CHECK(pm->num_chunks() == 1 && pm->chunk_layers(0) == std::make_pair(1, 2), "middle stage layers");
    auto& st = pm->chunk(0);
    TRIDENT_RANK_CHECK(!st.is_first() && !st.is_last(), "middle stage must be neither first nor last");
    const size_t btc = st.activation_numel(kB, kT);
    TRIDENT_RANK_CHECK(btc == static_cast<size_t>(kB) * kT * 32, "activation_numel {}", btc);
    std::vector<float> in(btc), out(btc), dout(btc), din(btc);
    for (size_t i = 0; i < btc; ++i) {
      in[i] = std::sin(0.1f * i);
      dout[i] = std::cos(0.07f * i) * 1e-2f;
    }
    counting->calls.clear();
    timeline().clear();
    timeline().enable(true);
    st.forward(0, nullptr, nullptr, in.data(), out.data(), kB, kT, 1.0f);
    const size_t after_forward = counting->calls.size();
    TRIDENT_RANK_CHECK(st.activation_bytes() > 0, "forward saved no activations");
    st.backward(0, dout.data(), din.data());
    timeline().enable(false);
    TRIDENT_RANK_CHECK(st.activation_bytes() == 0, "backward left {} bytes of activations", st.activation_bytes());
    TRIDENT_RANK_CHECK(after_forward == 2, "forward issued {} collectives, want 2", after_forward);
    TRIDENT_RANK_CHECK(counting->calls.size() == 4, "forward+backward issued {} collectives, want 4",
                       counting->calls.size());
    for (const auto& c : counting->calls)
      TRIDENT_RANK_CHECK(c.op == OpKind::kAllReduce && c.count == btc && c.redop == ReduceOp::kSum,
                         "unexpected collective {} count {}", op_name(c.op), c.count);
    int spans = 0;
    for (const auto& s : timeline().spans()) {
      if (s.name != "all_reduce(tp)") continue;
      ++spans;
      TRIDENT_RANK_CHECK(s.kind == SpanKind::kComm && s.bytes == 2.0 * (size - 1) / size * btc * 4 && s.chunk == 0 &&
                             s.microbatch == 0,
                         "span bytes {} chunk {} mb {}", s.bytes, s.chunk, s.microbatch);
    }
    TRIDENT_RANK_CHECK(spans == 4, "{} all_reduce(tp) spans, want 4", spans);

    // The whole model (pp 1): 4 per block + embedding + head input gradient of B*T*C, and the
    // vocab-parallel cross-entropy's max (N) and [sum exp | target] (2N); no all-gather of logits.
    ModelLayout one;
    one.tp_rank = rank;
    one.tp_size = size;
    auto whole = parallel::make_parallel_model(cfg, one, counting, nullptr);
    std::vector<int32_t> x, y;
    make_batch(2, kB, 64, &x, &y);
    counting->calls.clear();
    whole->forward_backward(x.data(), y.data(), kB, kT, true);
    std::map<std::pair<size_t, int>, int> seen;
    for (const auto& c : counting->calls) {
      TRIDENT_RANK_CHECK(c.op == OpKind::kAllReduce, "unexpected {}", op_name(c.op));
      seen[{c.count, static_cast<int>(c.redop)}]++;
    }
    const size_t N = kB * kT;
    const int big = seen[std::make_pair(btc, int(ReduceOp::kSum))];
    const int maxes = seen[std::make_pair(N, int(ReduceOp::kMax))];
    const int sums = seen[std::make_pair(2 * N, int(ReduceOp::kSum))];
    TRIDENT_RANK_CHECK(big == 4 * 3 + 2, "B*T*C all-reduces: {}", big);
    TRIDENT_RANK_CHECK(maxes == 1 && sums == 1, "cross-entropy all-reduces: {} max, {} sum", maxes, sums);
    TRIDENT_RANK_CHECK(counting->calls.size() == 16, "{} collectives in all", counting->calls.size());
  });
  ASSERT_EQ(testing::failures(res), "");
}

// ---------------------------------------------------------------------------------------------------
// Pipeline chunks chained by hand in one process (tp 1).

struct PpCase {
  int pp;
  int v;
  std::vector<int> stage_layers;
  bool ckpt;
};

class PipelineChunks : public ::testing::TestWithParam<PpCase> {};

TEST_P(PipelineChunks, ChainedByHandMatchOneProcess) {
  kernels::cpu::set_num_threads(1);
  const PpCase c = GetParam();
  nlohmann::json cfg = gpt_config(true, c.ckpt);
  cfg["n_layer"] = 4;
  const int P = c.pp, S = c.pp * c.v, M = 3, V = 64;
  std::vector<std::unique_ptr<ParallelModel>> ranks;
  const std::vector<int32_t> dummy(kT, 0);
  for (int p = 0; p < P; ++p) {
    ModelLayout lay;
    lay.pp_rank = p;
    lay.pp_size = P;
    lay.virtual_stages = c.v;
    lay.stage_layers = c.stage_layers;
    ranks.push_back(parallel::make_parallel_model(cfg, lay, nullptr, nullptr));
    EXPECT_EQ(ranks.back()->num_chunks(), c.v);
    // The whole-model interface refuses to run one pipeline rank's part.
    try {
      ranks.back()->forward_backward(dummy.data(), dummy.data(), 1, kT, true);
      ADD_FAILURE() << "forward_backward ran on pipeline rank " << p;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("pipeline engine"), std::string::npos) << e.what();
    }
  }
  auto stage = [&](int s) -> parallel::Stage& { return ranks[s % P]->chunk(s / P); };
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(stage(s).is_first(), s == 0);
    EXPECT_EQ(stage(s).is_last(), s == S - 1);
  }
  // Reference: the M microbatches as one batch (mean loss = mean of the microbatch means).
  auto ref = nn::make_model(cfg);
  std::vector<int32_t> x, y;
  make_batch(4, kB * M, V, &x, &y);
  const float want = ref->forward_backward(x.data(), y.data(), kB * M, kT, true, 1.0f);
  const size_t btc = stage(0).activation_numel(kB, kT);
  // GPipe order: all forwards, then all backwards (newest first), so every stage holds M microbatches.
  std::vector<std::vector<std::vector<float>>> acts(M, std::vector<std::vector<float>>(S + 1, std::vector<float>(btc)));
  double loss = 0;
  for (int m = 0; m < M; ++m)
    for (int s = 0; s < S; ++s) {
      const int32_t* xm = x.data() + m * kB * kT;
      const int32_t* ym = y.data() + m * kB * kT;
      loss += stage(s).forward(m, xm, ym, s == 0 ? nullptr : acts[m][s].data(), acts[m][s + 1].data(), kB, kT,
                               1.0f / M) / M;
    }
  std::vector<size_t> held(S);
  for (int s = 0; s < S; ++s) {
    held[s] = stage(s).activation_bytes();
    EXPECT_GT(held[s], 0u);
    EXPECT_EQ(stage(s).peak_activation_bytes(), held[s]);
  }
  EXPECT_NEAR(loss, want, 1e-5 * want);
  for (int m = M - 1; m >= 0; --m)
    for (int s = S - 1; s >= 0; --s)
      stage(s).backward(m, s == S - 1 ? nullptr : acts[m][s + 1].data(), s == 0 ? nullptr : acts[m][s].data());
  for (int s = 0; s < S; ++s) {
    EXPECT_EQ(stage(s).activation_bytes(), 0u);
    EXPECT_EQ(stage(s).peak_activation_bytes(), held[s]);
    stage(s).reset_peak();
    EXPECT_EQ(stage(s).peak_activation_bytes(), 0u);
  }
  // Gradients: copy every stage's tensors into a full model; the last stage's tied copy adds into wte
  // (what sync_tied_gradients does over the embedding group).
  auto full = nn::make_model(cfg);
  full->zero_grad();
  std::map<std::string, const nn::Parameter*> by_name;
  for (const auto& p : full->parameters()) by_name[p.name] = &p;
  int copies = 0;
  for (auto& r : ranks) {
    const auto& specs = r->shard_specs();
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& lp = r->parameters()[i];
      const auto* fp = by_name.at(lp.name);
      ASSERT_EQ(fp->numel, lp.numel) << lp.name;
      float* dst = full->grad_data() + fp->offset;
      for (size_t k = 0; k < lp.numel; ++k) dst[k] += r->grad_data()[lp.offset + k];
      copies += specs[i].tied_copy;
    }
  }
  EXPECT_EQ(copies, 1);
  const std::string bad = compare_models(*full, *ref, true, 1e-5);
  EXPECT_EQ(bad, "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineChunks,
                         ::testing::Values(PpCase{2, 1, {}, false}, PpCase{2, 2, {}, false},
                                           PpCase{3, 1, {1, 2, 1}, false}, PpCase{4, 1, {}, true},
                                           PpCase{2, 1, {0, 4}, false}));

// ---------------------------------------------------------------------------------------------------
// tp 2 x pp 2 across 4 processes: activations sent between stages, tied wte gradients synced over the
// embedding group, the replica gathered to rank 0 and compared with the single process.

TEST(TensorParallel, TwoByTwoMeshAcrossProcesses) {
  auto res = testing::run_processes(4, [](int rank, int size, std::shared_ptr<Store> store) {
    kernels::cpu::set_num_threads(1);
    auto world = make_group(rank, size, store);
    const int tp_rank = rank % 2, pp_rank = rank / 2;
    auto tp = world->split(pp_rank, tp_rank);
    auto emb = world->split(tp_rank, pp_rank);  // pp 2: first and last stage of this TP rank
    const nlohmann::json cfg = gpt_config(true);
    ModelLayout lay;
    lay.tp_rank = tp_rank;
    lay.tp_size = 2;
    lay.pp_rank = pp_rank;
    lay.pp_size = 2;
    auto pm = parallel::make_parallel_model(cfg, lay, tp, emb);
    auto ref = nn::make_model(cfg);
    std::vector<int32_t> x, y;
    make_batch(6, kB, 64, &x, &y);
    const float want = ref->forward_backward(x.data(), y.data(), kB, kT, true, 1.0f);
    auto& st = pm->chunk(0);
    const size_t btc = st.activation_numel(kB, kT);
    std::vector<float> act(btc), dact(btc);
    const int peer = pp_rank == 0 ? rank + 2 : rank - 2;
    float loss = 0;
    for (int m = 0; m < 2; ++m) {  // the same microbatch twice: gradients accumulate (loss_scale 1/2)
      if (pp_rank == 0) {
        st.forward(m, x.data(), nullptr, nullptr, act.data(), kB, kT, 0.5f);
        world->send(act.data(), btc, DType::kFloat32, peer, m);
      } else {
        world->recv(act.data(), btc, DType::kFloat32, peer, m);
        loss = static_cast<float>(st.forward(m, nullptr, y.data(), act.data(), nullptr, kB, kT, 0.5f));
      }
    }
    for (int m = 0; m < 2; ++m) {
      if (pp_rank == 1) {
        st.backward(m, nullptr, dact.data());
        world->send(dact.data(), btc, DType::kFloat32, peer, 100 + m);
      } else {
        world->recv(dact.data(), btc, DType::kFloat32, peer, 100 + m);
        st.backward(m, dact.data(), nullptr);
      }
    }
    if (pp_rank == 1) TRIDENT_RANK_CHECK(std::abs(loss - want) <= 1e-5 * want, "loss {} vs {}", loss, want);
    pm->sync_tied_gradients();
    double ss = pm->grad_sum_squares();
    world->all_reduce(&ss, 1, DType::kFloat64, ReduceOp::kSum);
    const double ref_ss = kernels::cpu::sum_squares(ref->grad_data(), ref->num_params());
    TRIDENT_RANK_CHECK(std::abs(ss - ref_ss) <= 1e-5 * ref_ss, "grad sum of squares {} vs {}", ss, ref_ss);
    auto full = rank == 0 ? nn::make_model(cfg) : nullptr;
    if (full) full->zero_grad();
    pm->gather_grads_to_full(full.get(), *world, 0);
    if (rank == 0) {
      const std::string bad = compare_models(*full, *ref, true, 1e-5);
      TRIDENT_RANK_CHECK(bad.empty(), "{}", bad);
    }
  });
  ASSERT_EQ(testing::failures(res), "");
}

// ---------------------------------------------------------------------------------------------------
// tp 2 x dp 2: DataParallel (ddp) wraps the TP shard unchanged over the data-parallel group.

TEST(TensorParallel, DataParallelWrapsTheShard) {
  const nlohmann::json cfg = gpt_config(false);
  const optim::AdamWConfig ac{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  constexpr int kSteps = 3;
  auto res = testing::run_processes(4, [&](int rank, int size, std::shared_ptr<Store> store) {
    kernels::cpu::set_num_threads(1);
    auto world = make_group(rank, size, store);
    const int tp_rank = rank % 2, dp_rank = rank / 2;
    auto tp = world->split(dp_rank, tp_rank);
    auto dp = world->split(tp_rank, dp_rank);
    ModelLayout lay;
    lay.tp_rank = tp_rank;
    lay.tp_size = 2;
    auto pm = parallel::make_parallel_model(cfg, lay, tp, nullptr);
    parallel::DataParallelOptions o;
    o.adamw = ac;
    parallel::DataParallel ddp(*pm, dp, o);
    ddp.broadcast_parameters();
    auto ref = nn::make_model(cfg);
    optim::AdamW ref_opt(*ref, ac);
    std::vector<int32_t> x, y;
    for (int s = 0; s < kSteps; ++s) {
      make_batch(20 + s, 2 * kB, 64, &x, &y);
      ref->zero_grad();
      const float want = ref->forward_backward(x.data(), y.data(), 2 * kB, kT, true, 1.0f);
      ref_opt.step(1e-2f);
      pm->zero_grad();
      double loss = pm->forward_backward(x.data() + dp_rank * kB * kT, y.data() + dp_rank * kB * kT, kB, kT, true);
      ddp.finish_gradient_sync();
      ddp.step(1e-2f);
      dp->all_reduce(&loss, 1, DType::kFloat64, ReduceOp::kAvg);
      TRIDENT_RANK_CHECK(std::abs(loss - want) <= 1e-4 * want, "step {}: loss {} vs single process {}", s, loss, want);
    }
    auto full = tp_rank == 0 ? nn::make_model(cfg) : nullptr;
    pm->gather_to_full(full.get(), *tp, 0);
    if (tp_rank == 0) {  // both replicas hold the same model
      const std::string bad = compare_models(*full, *ref, false, 1e-4);
      TRIDENT_RANK_CHECK(bad.empty(), "after {} steps: {}", kSteps, bad);
    }
  });
  ASSERT_EQ(testing::failures(res), "");
}

// ---------------------------------------------------------------------------------------------------
// Layout errors say what would work.

void expect_layout_error(const nlohmann::json& cfg, const ModelLayout& l, const std::string& needle) {
  try {
    ParallelModel::validate_layout(cfg, l);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, LayoutErrorsNameTheFix) {
  nlohmann::json cfg = gpt_config(true);
  ModelLayout l;
  l.tp_size = 3;
  expect_layout_error(cfg, l, "sizes that work with n_head 4 and vocab_size 64: 1, 2, 4");
  cfg["n_head"] = 8;
  cfg["vocab_size"] = 65;
  l.tp_size = 2;
  expect_layout_error(cfg, l, "pad vocab_size to a multiple of 2 (e.g. 66)");
  cfg = gpt_config(true);
  l = {};
  l.pp_size = 2;
  l.virtual_stages = 2;
  expect_layout_error(cfg, l, "use pp_size * virtual_stages <= 2");
  l.virtual_stages = 1;
  l.stage_layers = {1, 2};
  expect_layout_error(cfg, l, "must sum to n_layer 2");
  l.stage_layers = {1, 1, 0};
  expect_layout_error(cfg, l, "one per virtual stage");
  nlohmann::json mlp = {{"kind", "mlp"}, {"n_layer", 2}, {"n_embd", 30}, {"vocab_size", 64}};
  l = {};
  l.tp_size = 4;
  expect_layout_error(mlp, l, "tensor-parallel sizes that work: 1, 2");
  // Valid layouts pass, and make_parallel_model refuses a group whose size contradicts the layout.
  l.tp_size = 2;
  EXPECT_NO_THROW(ParallelModel::validate_layout(mlp, l));
  EXPECT_THROW(parallel::make_parallel_model(mlp, l, nullptr, nullptr), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------------
// Training: 5 AdamW steps under TP 2 against the single process.

TEST(TensorParallel, FiveAdamWStepsTrackOneProcess) {
  const nlohmann::json cfg = gpt_config(false);
  const optim::AdamWConfig ac{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  auto train = [&](nn::Model& m) {
    optim::AdamW opt(m, ac);
    std::vector<double> losses;
    std::vector<int32_t> x, y;
    for (int s = 0; s < 5; ++s) {
      make_batch(10 + s, kB, 64, &x, &y);
      m.zero_grad();
      losses.push_back(m.forward_backward(x.data(), y.data(), kB, kT, true, 1.0f));
      opt.step(1e-2f);
    }
    return losses;
  };
  auto res = testing::run_processes(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    kernels::cpu::set_num_threads(1);
    auto pg = make_group(rank, size, store);
    ModelLayout lay;
    lay.tp_rank = rank;
    lay.tp_size = size;
    auto pm = parallel::make_parallel_model(cfg, lay, pg, nullptr);
    const auto got = train(*pm);
    auto ref = nn::make_model(cfg);
    const auto want = train(*ref);
    for (int s = 0; s < 5; ++s)
      TRIDENT_RANK_CHECK(std::abs(got[s] - want[s]) <= 1e-4 * want[s], "step {}: loss {} vs single process {}", s,
                         got[s], want[s]);
    TRIDENT_RANK_CHECK(want.back() < want.front(), "the single process did not learn: {} -> {}", want.front(),
                       want.back());
  });
  ASSERT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident
