// Closing the loop (train/prediction.h): the predicted memory per rank and communication per step equal
// what DataParallel actually accounts after a real step of a tiny GPT, at 1, 2 and 3 ranks (threads) for ddp,
// zero1 and zero2; the activation estimate is Korthikanti et al.'s formula (fp32) plus the logits; the
// calibrated step time is positive and finite. No timed assertions.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"
#include "trident/nn/models.h"
#include "trident/parallel/data_parallel.h"
#include "trident/train/prediction.h"

namespace trident::train {
namespace {

constexpr int kB = 2, kT = 8, kVocab = 13, kLayers = 2, kHeads = 2, kEmbd = 16;

nlohmann::json tiny_gpt() {
  return {{"kind", "gpt"}, {"n_layer", kLayers}, {"n_head", kHeads}, {"n_embd", kEmbd}, {"block_size", kT},
          {"vocab_size", kVocab}, {"bias", false}, {"seed", 7}};
}

void batch(int rank, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  x->resize(kB * kT);
  y->resize(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    (*x)[i] = (i * 5 + rank * 3) % kVocab;
    (*y)[i] = (i * 7 + rank + 1) % kVocab;
  }
}

double get(const std::map<std::string, double>& m, const std::string& k) { return m.count(k) ? m.at(k) : 0.0; }

// One rank: calibrate, predict, run one real data-parallel step, compare with DataParallel's accounting.
void check_rank(const std::string& strategy, int rank, int size, std::shared_ptr<Store> store, bool overlap) {
  GroupOptions go;
  go.timeout = Seconds(60);
  auto pg = new_process_group(store, rank, size, go);
  auto model = nn::make_model(tiny_gpt());
  Calibration cal = calibrate(*model, kB, kT, kVocab, pg.get());
  TRIDENT_RANK_CHECK(cal.forward_backward_s > 0 && std::isfinite(cal.forward_backward_s), "fb time {}",
                     cal.forward_backward_s);
  TRIDENT_RANK_CHECK(cal.optimizer_s_per_param >= 0 && std::isfinite(cal.optimizer_s_per_param), "opt {}",
                     cal.optimizer_s_per_param);
  if (size > 1)
    TRIDENT_RANK_CHECK(cal.allreduce_bus_Bps > 0 && std::isfinite(cal.allreduce_bus_Bps), "bw {}",
                       cal.allreduce_bus_Bps);

  PredictionInput in;
  in.num_params = model->num_params();
  in.world = size;
  in.rank = rank;
  in.strategy = parallel::parse_strategy(strategy);
  in.overlap = overlap;
  in.bucket_bytes = 256;  // several buckets
  in.batch = kB;
  in.block = kT;
  in.layers = kLayers;
  in.hidden = kEmbd;
  in.heads = kHeads;
  in.vocab = kVocab;
  in.cal = cal;
  Prediction p = predict(in);
  TRIDENT_RANK_CHECK(p.step_s > 0 && std::isfinite(p.step_s), "step {}", p.step_s);
  TRIDENT_RANK_CHECK(p.step_s >= p.compute_s && p.exposed_comm_s <= p.comm_s + 1e-12, "step {} compute {} exposed {} comm {}",
                     p.step_s, p.compute_s, p.exposed_comm_s, p.comm_s);

  parallel::DataParallelOptions o;
  o.strategy = in.strategy;
  o.overlap = overlap;
  o.bucket_bytes = in.bucket_bytes;
  parallel::DataParallel dp(*model, pg, o);
  dp.broadcast_parameters();
  std::vector<int32_t> x, y;
  batch(rank, &x, &y);
  for (int step = 0; step < 2; ++step) {
    model->zero_grad();
    dp.set_require_sync(true);
    model->forward_backward(x.data(), y.data(), kB, kT, true);
    dp.finish_gradient_sync();
    dp.clip_grad_norm(1.0f);
    dp.step(1e-3f);
  }
  // Memory: every category DataParallel reports, exactly.
  auto mem = dp.memory().bytes;
  for (auto& [k, v] : mem)
    TRIDENT_RANK_CHECK(get(p.memory_bytes, k) == v, "{} {} rank {}: memory {} predicted {} accounted {}", strategy,
                       size, rank, k, get(p.memory_bytes, k), v);
  TRIDENT_RANK_CHECK(p.persistent_bytes() == dp.memory().total(), "persistent {} vs {}", p.persistent_bytes(),
                     dp.memory().total());
  // Communication per step, by kind, exactly (broadcast happened before the first step: not per step).
  auto comm = dp.last_step_comm().bytes;
  for (auto& [k, v] : comm)
    TRIDENT_RANK_CHECK(std::abs(get(p.comm_bytes, k) - v) <= 1e-9 * v, "{} {}: comm {} predicted {} accounted {}",
                       strategy, size, k, get(p.comm_bytes, k), v);
  for (auto& [k, v] : p.comm_bytes)
    TRIDENT_RANK_CHECK(std::abs(get(comm, k) - v) <= 1e-9 * v, "{} {}: predicted comm {} {} not accounted",
                       strategy, size, k, v);
  // And the textbook figures, independently: psi = flat size.
  const double psi = static_cast<double>(model->num_params()), n = size;
  const double padded = std::ceil(psi / n) * n;
  if (size == 1) {
    TRIDENT_RANK_CHECK(p.comm_total() == 0, "one rank sends nothing, predicted {}", p.comm_total());
    TRIDENT_RANK_CHECK(get(p.memory_bytes, "optimizer_state") == 8 * psi, "adam 8 psi");
  } else if (strategy == "ddp") {
    TRIDENT_RANK_CHECK(std::abs(p.comm_total() - 2 * (n - 1) / n * psi * 4) < 1e-6, "ddp 2(N-1)/N psi");
  } else {
    TRIDENT_RANK_CHECK(std::abs(get(p.comm_bytes, "all_gather") - (n - 1) / n * padded * 4) < 1e-6, "AG");
  }
}

void run(const std::string& strategy, int size, bool overlap) {
  auto res = testing::run_threads(size, [&](int rank, int sz, std::shared_ptr<Store> store) {
    check_rank(strategy, rank, sz, store, overlap);
  });
  EXPECT_EQ(testing::failures(res), "") << strategy << " at " << size;
}

TEST(Prediction, OneRankMatchesAccounting) { run("ddp", 1, true); }
TEST(Prediction, DdpTwoRanksMatchesAccounting) {
  run("ddp", 2, true);
  run("ddp", 2, false);
}
TEST(Prediction, Zero1TwoRanksMatchesAccounting) { run("zero1", 2, true); }
TEST(Prediction, Zero2TwoRanksMatchesAccounting) { run("zero2", 2, true); }
// 3 ranks: the flat size is not a multiple of 3, so ZeRO pads (shards, all-gather, zero2's staging buffer).
TEST(Prediction, ZeroThreeRanksWithPaddingMatchesAccounting) {
  run("zero1", 3, true);
  run("zero2", 3, true);
}

TEST(Prediction, ActivationsAreKorthikantiFp32PlusLogits) {
  PredictionInput in;
  in.num_params = 1000;
  in.batch = 4;
  in.block = 32;
  in.layers = 3;
  in.hidden = 64;
  in.heads = 4;
  in.vocab = 65;
  in.cal.forward_backward_s = 0.01;
  Prediction p = predict(in);
  const double s = 32, b = 4, h = 64, a = 4, L = 3, V = 65;
  const double want = L * 2 * s * b * h * (34 + 5 * a * s / h) + b * s * V * 4;
  EXPECT_DOUBLE_EQ(p.memory_bytes.at("activations"), want);
  EXPECT_DOUBLE_EQ(p.memory_bytes.at("parameters"), 4000);
  EXPECT_DOUBLE_EQ(p.compute_s, 0.01);  // no optimizer rate calibrated, one micro-step
  EXPECT_DOUBLE_EQ(p.step_s, 0.01);
  // Exposed communication: all-reduce overlapped with the backward share (2/3 of forward+backward).
  in.world = 2;
  in.num_params = 1 << 20;
  in.bucket_bytes = 1 << 20;  // a quarter of the 4 MiB gradients per bucket
  in.cal.allreduce_bus_Bps = 2.0 * 0.5 * (1 << 20) * 4 / 0.03;  // the all-reduce takes 30 ms
  p = predict(in);
  EXPECT_NEAR(p.comm_s, 0.03, 1e-12);
  EXPECT_NEAR(p.exposed_comm_s, 0.03 - 0.01 * 2 / 3, 1e-12);
  in.overlap = false;
  EXPECT_NEAR(predict(in).exposed_comm_s, 0.03, 1e-12);
  in.overlap = true;
  in.cal.forward_backward_s = 1.0;  // backward hides all but the last bucket
  EXPECT_NEAR(predict(in).exposed_comm_s, 0.03 / 4, 1e-12);
}

}  // namespace
}  // namespace trident::train
