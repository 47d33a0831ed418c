// Data parallelism against one process: DDP and ZeRO 1/2/3 at 2, 3 and 4 ranks give the loss sequence and
// final parameters of a single process training on the same global batch (float32, 1e-4 relative), with
// and without overlap and gradient accumulation; communication volume and optimizer memory per rank
// match the textbook formulas. Gradients in the group's registered memory train bitwise as private ones.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "harness/multiproc.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/comm/transport/shm_buffer.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/optim/schedule.h"
#include "trident/parallel/data_parallel.h"

namespace trident::data_parallel_test {
namespace {

constexpr int kB = 2, kT = 8, kVocab = 13, kSteps = 50;

// bias=false: with biases, the key bias of attention has an exactly-zero true gradient (softmax ignores a
// constant added to a row's scores), so its float gradient is rounding noise that Adam's normalisation
// turns into full-size steps of either sign; no two summation orders agree on it.
nlohmann::json tiny_gpt() {
  return {{"kind", "gpt"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"block_size", kT},
          {"vocab_size", kVocab}, {"bias", false}, {"seed", 7}};
}

// "gpt", "gpt_ckpt" (activation checkpointing), "mlp_untied" (deep MLP with its own lm_head).
nlohmann::json model_json(const std::string& name) {
  if (name == "gpt") return tiny_gpt();
  if (name == "gpt_ckpt") {
    auto j = tiny_gpt();
    j["n_layer"] = 3;
    j["activation_checkpointing"] = true;
    return j;
  }
  return {{"kind", "mlp"}, {"n_layer", 3}, {"n_embd", 16}, {"block_size", kT}, {"vocab_size", kVocab},
          {"bias", true}, {"tie_embeddings", false}, {"seed", 7}};
}

// The global batch of step s: rows 0..global_rows-1; row r is a deterministic token window.
void batch_rows(int step, int first_row, int rows, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  trident::testing::token_windows(step, first_row, rows, kT, kVocab, x, y);
}

struct RefRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // pre-clip, per step
  std::vector<float> params;
};

optim::AdamWConfig adamw_config() { return {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

// One process, one forward and backward over the whole global batch of world*kB rows per step, without
// accumulation: the ranks' micro-steps (accum of them, kB/accum rows each, each loss scaled by 1/accum) must
// add up to exactly this, as nanoGPT's and PyTorch's accumulation do.
RefRun reference(int world, const std::string& model_name = "gpt") {
  auto model = nn::make_model(model_json(model_name));
  optim::AdamW opt(*model, adamw_config());
  RefRun out;
  std::vector<int32_t> x, y;
  for (int s = 0; s < kSteps; ++s) {
    model->zero_grad();
    batch_rows(s, 0, world * kB, &x, &y);
    const double loss = model->forward_backward(x.data(), y.data(), world * kB, kT, true, 1.0f);
    out.grad_norms.push_back(optim::clip_grad_norm(model->grad_data(), model->num_params(), 1.0f));
    opt.step(1e-2f);
    out.losses.push_back(loss);
  }
  out.params.assign(model->param_data(), model->param_data() + model->num_params());
  return out;
}

struct Case {
  std::string strategy;
  int world;
  int accum;
  bool overlap;
  size_t bucket_bytes;
  std::string model = "gpt";
  size_t first_bucket_bytes = 1 << 20;  // capped at bucket_bytes
};

void run_rank(const Case& c, int rank, int size, std::shared_ptr<Store> store, const std::string& out_dir) {
  GroupOptions go;
  go.timeout = Seconds(120);
  auto pg = new_process_group(store, rank, size, go);
  auto model = nn::make_model(model_json(c.model));
  // Start from different weights on purpose: broadcast_parameters must make them rank 0's.
  if (rank != 0) model->param_data()[0] += 1.0f;
  parallel::DataParallelOptions o;
  o.strategy = parallel::parse_strategy(c.strategy);
  o.overlap = c.overlap;
  o.bucket_bytes = c.bucket_bytes;
  o.first_bucket_bytes = c.first_bucket_bytes;
  o.adamw = adamw_config();
  parallel::DataParallel dp(*model, pg, o);
  // On one host over shared memory the gradients live in the group's registered memory (every stage).
  const bool want_shared = size > 1;
  TRIDENT_RANK_CHECK(dp.gradients_shared() == want_shared, "{} on {} ranks: gradients_shared() is {}", c.strategy,
                     size, dp.gradients_shared());
  dp.broadcast_parameters();
  std::vector<int32_t> x, y;
  std::vector<double> losses, norms;
  const int per = kB / c.accum;
  for (int s = 0; s < kSteps; ++s) {
    model->zero_grad();
    double loss = 0;
    for (int m = 0; m < c.accum; ++m) {
      batch_rows(s, rank * kB + m * per, per, &x, &y);
      if (m + 1 < c.accum && c.strategy == "zero3") {
        parallel::NoSync no_sync(dp);  // the scope form of set_require_sync(false)
        loss += model->forward_backward(x.data(), y.data(), per, kT, true, 1.0f / c.accum);
        continue;
      }
      dp.set_require_sync(m == c.accum - 1);
      loss += model->forward_backward(x.data(), y.data(), per, kT, true, 1.0f / c.accum);
    }
    dp.finish_gradient_sync();
    norms.push_back(dp.clip_grad_norm(1.0f));
    dp.step(1e-2f);
    double global = loss / c.accum;
    pg->all_reduce(&global, 1, DType::kFloat64, ReduceOp::kAvg);
    losses.push_back(global);
    if (s == 0 || s == kSteps - 1) {
      // Communication per step, this rank (float32 gradients, Psi = padded flat size).
      const double psi = static_cast<double>(model->num_params());
      const double n = size;
      const auto& st = dp.last_step_comm();
      auto bytes = [&](const char* k) { return st.bytes.count(k) ? st.bytes.at(k) : 0.0; };
      const double ar = 2 * (n - 1) / n * psi * 4;
      const double padded = std::ceil(psi / n) * n;
      if (c.strategy == "ddp") {
        TRIDENT_RANK_CHECK(std::abs(bytes("all_reduce") - ar) <= 1e-9 * ar, "ddp all-reduce bytes {} want {}",
                           bytes("all_reduce"), ar);
      } else if (c.strategy == "zero1") {
        TRIDENT_RANK_CHECK(std::abs(bytes("all_reduce") - ar) <= 1e-9 * ar, "zero1 all-reduce bytes {}", bytes("all_reduce"));
        TRIDENT_RANK_CHECK(bytes("all_gather") == (n - 1) / n * padded * 4, "zero1 all-gather bytes {}", bytes("all_gather"));
      } else if (c.strategy == "zero3") {
        // 2 all-gathers (forward, backward) per micro-step and 1 reduce-scatter per step of the parameter
        // volume, (N-1)/N x size each; each unit of L elements is padded to N * ceil(L/N), so at most N-1
        // elements per unit more (none when N divides every unit, as at N = 2 and 4 here).
        const double units = static_cast<double>(dp.num_buckets());
        const double pad = (n - 1) / n * units * (n - 1) * 4;
        const double ag = 2 * c.accum * (n - 1) / n * psi * 4, rs = (n - 1) / n * psi * 4;
        TRIDENT_RANK_CHECK(bytes("all_reduce") == 0, "zero3 must not all-reduce gradients: {}", bytes("all_reduce"));
        TRIDENT_RANK_CHECK(bytes("all_gather") >= ag - 1e-6 && bytes("all_gather") <= ag + 2 * c.accum * pad + 1e-6,
                           "zero3 AG bytes {} want {} (+ padding {})", bytes("all_gather"), ag, 2 * c.accum * pad);
        TRIDENT_RANK_CHECK(bytes("reduce_scatter") >= rs - 1e-6 && bytes("reduce_scatter") <= rs + pad + 1e-6,
                           "zero3 RS bytes {} want {} (+ padding {})", bytes("reduce_scatter"), rs, pad);
        if (size == 2 || size == 4)
          TRIDENT_RANK_CHECK(bytes("all_gather") == ag && bytes("reduce_scatter") == rs, "zero3 AG {} RS {}",
                             bytes("all_gather"), bytes("reduce_scatter"));
        // Gradients are communicated once per step: one reduce-scatter per unit, whatever the accumulation.
        int calls = st.calls.count("reduce_scatter") ? st.calls.at("reduce_scatter") : 0;
        TRIDENT_RANK_CHECK(calls == static_cast<int>(dp.num_buckets()), "{} reduce-scatters per step, {} units", calls,
                           dp.num_buckets());
      } else {
        TRIDENT_RANK_CHECK(bytes("all_reduce") == 0, "zero2 must not all-reduce gradients: {}", bytes("all_reduce"));
        TRIDENT_RANK_CHECK(bytes("reduce_scatter") == (n - 1) / n * padded * 4, "zero2 RS bytes {}", bytes("reduce_scatter"));
        TRIDENT_RANK_CHECK(bytes("all_gather") == (n - 1) / n * padded * 4, "zero2 AG bytes {}", bytes("all_gather"));
      }
      // Accumulation communicates once per step, not once per micro-step.
      if (c.strategy == "ddp" || c.strategy == "zero1") {
        int calls = st.calls.count("all_reduce") ? st.calls.at("all_reduce") : 0;
        TRIDENT_RANK_CHECK(calls == static_cast<int>(dp.num_buckets()), "{} all-reduces per step with {} buckets",
                           calls, dp.num_buckets());
      }
      // Optimizer memory: 8 Psi (ddp) or 8 Psi / N (zero) bytes of AdamW moments, within the padding.
      double opt = dp.memory().bytes.at("optimizer_state");
      double want = c.strategy == "ddp" ? 8 * psi : 8 * psi / n;
      const double slack = c.strategy == "zero3" ? 8.0 * dp.num_buckets() : 8 * n;  // per-unit padding
      TRIDENT_RANK_CHECK(std::abs(opt - want) <= slack + 1e-9, "optimizer bytes {} want {}", opt, want);
    }
  }
  dp.gather_full_parameters();  // zero3: the model's buffer holds only what a block needs; others: no-op
  if (rank == 0) {
    FILE* f = std::fopen((out_dir + "/losses").c_str(), "wb");
    std::fwrite(losses.data(), sizeof(double), losses.size(), f);
    std::fwrite(norms.data(), sizeof(double), norms.size(), f);
    std::fclose(f);
    f = std::fopen((out_dir + "/params").c_str(), "wb");
    std::fwrite(model->param_data(), sizeof(float), model->num_params(), f);
    std::fclose(f);
  }
}

class DataParallelParity : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelParity, MatchesOneProcessOnTheGlobalBatch) {
  const Case c = GetParam();
  RefRun ref = reference(c.world, c.model);
  const testing::TempDir tmp("dp");  // removed at the end of the test, whatever happens
  const std::string dir = tmp.path.string();
  auto res = testing::run_processes(c.world, [&](int r, int n, std::shared_ptr<Store> st) { run_rank(c, r, n, st, dir); },
                                    {.deadline_s = 240, .env = {}});
  ASSERT_EQ(testing::failures(res), "");
  std::vector<double> losses(kSteps), norms(kSteps);
  std::vector<float> params(ref.params.size());
  FILE* f = std::fopen((dir + "/losses").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fread(losses.data(), sizeof(double), kSteps, f), static_cast<size_t>(kSteps));
  ASSERT_EQ(std::fread(norms.data(), sizeof(double), kSteps, f), static_cast<size_t>(kSteps));
  std::fclose(f);
  // The first step starts from the same weights: loss, pre-clip gradient norm and the clipping decision
  // agree to float32 rounding whatever the accumulation (k micro-batches of B are one batch of kB).
  EXPECT_NEAR(losses[0], ref.losses[0], 1e-5 * ref.losses[0]);
  EXPECT_NEAR(norms[0], ref.grad_norms[0], 1e-5 * ref.grad_norms[0]);
  int clipped = 0;
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(norms[s], ref.grad_norms[s], 1e-3 * ref.grad_norms[s]) << "gradient norm at step " << s;
    if (std::abs(ref.grad_norms[s] - 1.0) > 1e-2) {
      EXPECT_EQ(norms[s] > 1.0, ref.grad_norms[s] > 1.0) << "clipping at step " << s;
    }
    clipped += ref.grad_norms[s] > 1.0;
  }
  EXPECT_GT(clipped, 0) << "no step was clipped: the clipping decision went untested";
  f = std::fopen((dir + "/params").c_str(), "rb");
  ASSERT_EQ(std::fread(params.data(), sizeof(float), params.size(), f), params.size());
  std::fclose(f);
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(losses[s], ref.losses[s], 1e-4 * std::abs(ref.losses[s])) << "step " << s;
  // Relative to each tensor's scale (its RMS), so near-zero elements are judged by their tensor.
  double max_rel = 0;
  std::string where;
  auto model = nn::make_model(model_json(c.model));
  size_t worst = 0;
  for (auto& p : model->parameters()) {
    double ss = 0;
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) ss += double(ref.params[i]) * ref.params[i];
    double scale = std::max(1e-6, std::sqrt(ss / p.numel));
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
      double d = std::abs(double(params[i]) - ref.params[i]) / std::max(scale, std::abs(double(ref.params[i])));
      if (d > max_rel) max_rel = d, worst = i, where = p.name + "[" + std::to_string(i - p.offset) + "]";
    }
  }
  EXPECT_LT(max_rel, 1e-4) << "final parameters differ most at " << where << ": " << params[worst] << " vs "
                           << ref.params[worst];
  // Training moved: the loss fell.
  EXPECT_LT(ref.losses.back(), ref.losses.front());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DataParallelParity,
    ::testing::Values(Case{"ddp", 2, 1, true, 4096}, Case{"ddp", 3, 2, true, 4096}, Case{"ddp", 4, 1, false, 1 << 20},
                      Case{"ddp", 3, 1, true, 4096, "gpt", 512}, Case{"ddp", 5, 1, true, 2048, "mlp_untied", 4},
                      Case{"zero1", 2, 1, true, 4096}, Case{"zero1", 3, 1, true, 1 << 20},
                      Case{"zero1", 2, 2, true, 4096, "gpt", 700},
                      Case{"zero1", 4, 2, true, 4096},
                      Case{"zero2", 2, 2, true, 4096}, Case{"zero2", 4, 1, true, 4096},
                      Case{"zero2", 3, 1, true, 4096, "mlp_untied"}, Case{"zero3", 2, 1, true, 0},
                      Case{"zero3", 3, 2, true, 0}, Case{"zero3", 4, 1, false, 0},
                      Case{"zero3", 2, 2, true, 0, "gpt_ckpt"}, Case{"zero3", 3, 1, true, 0, "gpt_ckpt"},
                      Case{"zero3", 4, 2, true, 0, "mlp_untied"}, Case{"zero3", 4, 1, true, 0, "gpt_ckpt"}),
    [](const auto& info) {
      const Case& c = info.param;
      return fmt::format("{}_w{}_acc{}_{}_{}{}", c.strategy, c.world, c.accum, c.overlap ? "overlap" : "after", c.model,
                         c.first_bucket_bytes < c.bucket_bytes ? fmt::format("_first{}", c.first_bucket_bytes) : "");
    });

// ddp/zero1 buckets as PyTorch DDP forms them: parameters in reverse order, a bucket closing once it holds
// at least its cap, the first bucket's cap first_bucket_bytes (capped at bucket_bytes; 0: bucket_bytes),
// every later one bucket_bytes; the buckets tile the flat buffer from the top. Checked against a direct
// walk of the parameter list for several caps, including a first cap smaller than any parameter.
TEST(DataParallelBuckets, SmallFirstBucketThenConfiguredSize) {
  struct Caps {
    size_t first, cap;
  };
  const std::vector<Caps> caps = {{512, 4096}, {0, 4096}, {4096, 4096}, {1 << 20, 4096}, {4, 8192}, {700, 1 << 20}};
  for (const char* strategy : {"ddp", "zero1"}) {
    auto res = testing::run_processes(2, [&](int rank, int size, std::shared_ptr<Store> store) {
      auto pg = new_process_group(store, rank, size, GroupOptions{});
      for (const Caps& c : caps) {
        auto model = nn::make_model(model_json("mlp_untied"));
        parallel::DataParallelOptions o;
        o.strategy = parallel::parse_strategy(strategy);
        o.bucket_bytes = c.cap;
        o.first_bucket_bytes = c.first;
        parallel::DataParallel dp(*model, pg, o);
        // Expected: each bucket's lowest offset from the reverse walk; a bucket's size is the extent of its
        // parameters (alignment padding between them included).
        const auto& ps = model->parameters();
        const size_t first = std::min(c.first == 0 ? c.cap : c.first, c.cap) / 4, cap = c.cap / 4;
        std::vector<size_t> lows;
        size_t hi = 0;
        for (size_t k = ps.size(); k-- > 0;) {
          if (lows.empty() || hi - lows.back() >= (lows.size() == 1 ? first : cap)) {
            lows.push_back(ps[k].offset);
            hi = ps[k].offset + ps[k].numel;
          }
          lows.back() = std::min(lows.back(), ps[k].offset);
        }
        const auto got = dp.bucket_ranges();
        TRIDENT_RANK_CHECK(got.size() == lows.size(), "{} first={} cap={}: {} buckets, want {}", strategy, c.first,
                           c.cap, got.size(), lows.size());
        size_t top = model->num_params();
        for (size_t i = 0; i < got.size(); ++i) {
          const size_t lo = i + 1 == got.size() ? 0 : lows[i];
          TRIDENT_RANK_CHECK(got[i].first == lo && got[i].second == top, "{} first={} cap={}: bucket {} is [{}, {}), want [{}, {})",
                             strategy, c.first, c.cap, i, got[i].first, got[i].second, lo, top);
          top = lo;
        }
      }
    });
    ASSERT_EQ(testing::failures(res), "") << strategy;
  }
}

// Gradients in the group's registered memory (DataParallelOptions::shared_gradients, the default) against
// private memory: every stage (and zero1 / zero2 with bf16 storage) at 2 and 3 ranks, with a model large
// enough that its buckets take the zero-copy cma path (forced, and by the cost model), give bitwise the same
// parameters; the shared buffer is a ShmBuffer the model writes its gradients into, and zero2/zero3 release
// its pages (resident gradients stay at the shard's size); over TCP nothing is shared.
nlohmann::json wider_gpt() {
  auto j = tiny_gpt();
  j["n_embd"] = 64;
  j["n_head"] = 4;
  return j;
}

// `steps` steps of kB rows per rank from rank 0's weights; the final float32 parameters (bf16 storage: the
// master weights).
std::vector<float> train_steps(nn::Model& model, parallel::DataParallel& dp, int rank, int steps) {
  dp.broadcast_parameters();
  std::vector<int32_t> x, y;
  for (int s = 0; s < steps; ++s) {
    model.zero_grad();
    batch_rows(s, rank * kB, kB, &x, &y);
    model.forward_backward(x.data(), y.data(), kB, kT, true);
    dp.finish_gradient_sync();
    dp.clip_grad_norm(1.0f);
    dp.step(1e-2f);
  }
  std::vector<float> m, v;
  int64_t st = 0;
  dp.gather_optimizer_state(&m, &v, &st);  // bf16 storage: writes the master weights into the model's buffer
  return std::vector<float>(model.param_data(), model.param_data() + model.num_params());
}

TEST(DataParallelSharedGradients, BitwiseSameAsPrivateMemory) {
  for (int world : {2, 3}) {
    for (const char* algo : {"cma", ""}) {
      auto res = testing::run_processes(world, [&](int rank, int size, std::shared_ptr<Store> store) {
        if (*algo) setenv("TRIDENT_ALGO", algo, 1);
        GroupOptions go;
        go.timeout = Seconds(120);
        auto pg = new_process_group(store, rank, size, go);
        for (const char* strategy : {"ddp", "zero1", "zero2", "zero3", "zero1-bf16", "zero2-bf16"}) {
          const bool bf16 = std::string(strategy).ends_with("-bf16");
          const bool sharded = std::string(strategy).starts_with("zero2") || std::string(strategy).starts_with("zero3");
          std::vector<float> params[2];
          for (int shared = 0; shared < 2; ++shared) {
            auto model = nn::make_model(wider_gpt());
            parallel::DataParallelOptions o;
            o.strategy = parallel::parse_strategy(bf16 ? std::string(strategy).substr(0, 5) : strategy);
            if (bf16) o.storage_dtype = DType::kBFloat16;
            o.bucket_bytes = 64 << 10;  // several buckets, each past cma's 32 KiB threshold
            o.adamw = adamw_config();
            o.shared_gradients = shared == 1;
            parallel::DataParallel dp(*model, pg, o);
            TRIDENT_RANK_CHECK(dp.gradients_shared() == (shared == 1), "{} shared={}: gradients_shared() {}", strategy,
                               shared, dp.gradients_shared());
            ShmBuffer::Registration reg;
            // The model's own buffer moved (bf16 ddp/zero1: the bf16 gradients, which DataParallel holds).
            const bool registered = ShmBuffer::lookup(model->grad_data(), model->num_params() * 4, &reg);
            TRIDENT_RANK_CHECK(registered == (shared == 1 && (!bf16 || sharded)),
                               "{} shared={}: gradient buffer registered {}", strategy, shared, registered);
            TRIDENT_RANK_CHECK(dp.report()["gradients_shared"].get<bool>() == (shared == 1), "report disagrees");
            params[shared] = train_steps(*model, dp, rank, 6);
            if (sharded) {  // the full gradient's pages went back after each reduce-scatter, shared or not
              const double resident = dp.resident_memory().bytes.at("gradients");
              const double held = dp.memory().bytes.at("gradients");
              TRIDENT_RANK_CHECK(resident <= held + 64 * 4096.0, "{} shared={}: {} resident gradient bytes, {} held",
                                 strategy, shared, resident, held);
            }
          }
          TRIDENT_RANK_CHECK(std::memcmp(params[0].data(), params[1].data(), params[0].size() * 4) == 0,
                             "{}: parameters after shared-memory gradients differ from private memory", strategy);
        }
        // TCP: the group has no registered memory; the model keeps its own buffer.
        GroupOptions tcp = go;
        tcp.transport = "tcp";
        tcp.name = "tcp";
        auto tg = new_process_group(store, rank, size, tcp);
        TRIDENT_RANK_CHECK(tg->alloc_shared(4096) == nullptr, "alloc_shared over TCP returned memory");
        auto model = nn::make_model(wider_gpt());
        parallel::DataParallel dp(*model, tg, {});
        TRIDENT_RANK_CHECK(!dp.gradients_shared(), "gradients shared over TCP");
      }, {.deadline_s = 240, .env = {}});
      EXPECT_EQ(testing::failures(res), "") << "world " << world << " algo " << (*algo ? algo : "auto");
    }
  }
}

// Registered memory that cannot be had (here: no descriptor left for the memfd on rank 1) is not an
// error: that rank warns and keeps private gradients, the other keeps its shared ones, the ranks mix both
// in every all-reduce (rank 0 cannot map rank 1's buffer either way), and training gives bitwise the
// parameters of an all-private run.
TEST(DataParallelSharedGradients, MemoryThatCannotBeHadFallsBackToPrivate) {
  auto res = testing::run_processes(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    setenv("TRIDENT_ALGO", "cma", 1);
    GroupOptions go;
    go.timeout = Seconds(120);
    auto pg = new_process_group(store, rank, size, go);
    std::vector<float> params[2];
    for (int run = 0; run < 2; ++run) {
      auto model = nn::make_model(wider_gpt());
      parallel::DataParallelOptions o;
      o.bucket_bytes = 64 << 10;
      o.adamw = adamw_config();
      o.shared_gradients = run == 1;
      std::vector<int> fillers;
      rlimit old{};
      if (run == 1 && rank == 1) {  // every descriptor below the limit taken: memfd_create fails (EMFILE)
        getrlimit(RLIMIT_NOFILE, &old);
        rlimit low = old;
        low.rlim_cur = 256;
        TRIDENT_RANK_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit: {}", std::strerror(errno));
        for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
      }
      parallel::DataParallel dp(*model, pg, o);
      for (int fd : fillers) ::close(fd);
      if (!fillers.empty()) setrlimit(RLIMIT_NOFILE, &old);
      const bool want = run == 1 && rank == 0;
      TRIDENT_RANK_CHECK(dp.gradients_shared() == want, "run {}: gradients_shared() {}", run, dp.gradients_shared());
      params[run] = train_steps(*model, dp, rank, 4);
    }
    TRIDENT_RANK_CHECK(std::memcmp(params[0].data(), params[1].data(), params[0].size() * 4) == 0,
                       "parameters with one rank's gradients shared differ from all-private");
  }, {.deadline_s = 120, .env = {}});
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident::data_parallel_test
