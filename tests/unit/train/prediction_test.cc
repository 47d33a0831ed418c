// Closing the loop (train/prediction.h): calibrated on a tiny GPT, the step model's (plan/step_model.h)
// memory per rank and communication per step equal what DataParallel actually accounts after a real step,
// at 1, 2 and 3 ranks (threads) for ddp, zero1, zero2 and zero3, float32 and bfloat16; the calibrated step
// time is positive and finite. On real ParallelModels (threads: PP 2 under 1F1B / GPipe / interleaved, TP
// 2, PP 2 x DP 2), the predicted activation memory per rank equals the stages' measured peak after real
// pipeline steps, byte for byte. No timed assertions. The model on hand-made calibrations:
// tests/unit/plan/step_model_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"
#include "trident/core/error.h"
#include "trident/nn/models.h"
#include "trident/parallel/data_parallel.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/parallel/pipeline.h"
#include "trident/parallel/schedule.h"
#include "trident/train/prediction.h"

namespace trident::train {
namespace {

using parallel::ScheduleKind;
using plan::Calibration;
using plan::MpPrediction;
using plan::MpPredictionInput;
using plan::Prediction;
using plan::PredictionInput;
using plan::predict;
using plan::predict_model_parallel;

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
// storage: "float32" or "bfloat16" (DataParallelOptions::storage_dtype). Float32 ddp/zero1/zero2 match the
// accounting exactly; zero3 and bfloat16 pad per block unit (one piece of ceil(L/N) per unit, bf16 buffers
// padded to a multiple of N, a staging piece for the last unit), so the prediction's padded/N per rank may
// differ from the accounting by that rounding: a few elements per unit and rank (8 bytes each allowed).
void check_rank(const std::string& strategy, int rank, int size, std::shared_ptr<Store> store, bool overlap,
                const std::string& storage = "float32") {
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
  in.zero_stage = strategy == "ddp" ? 0 : strategy[4] - '0';  // zeroN
  in.overlap = overlap;
  in.bucket_bytes = 256;  // several buckets
  in.batch = kB;
  in.block = kT;
  in.layers = kLayers;
  in.hidden = kEmbd;
  in.heads = kHeads;
  in.vocab = kVocab;
  in.storage_bytes = storage == "bfloat16" ? 2 : 4;
  in.cal = cal;
  Prediction p = predict(in);
  TRIDENT_RANK_CHECK(p.step_s > 0 && std::isfinite(p.step_s), "step {}", p.step_s);
  TRIDENT_RANK_CHECK(p.step_s >= p.compute_s && p.exposed_comm_s <= p.comm_s + 1e-12, "step {} compute {} exposed {} comm {}",
                     p.step_s, p.compute_s, p.exposed_comm_s, p.comm_s);

  parallel::DataParallelOptions o;
  o.strategy = parallel::parse_strategy(strategy);
  o.overlap = overlap;
  o.bucket_bytes = in.bucket_bytes;
  o.storage_dtype = parse_dtype(storage);
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
  // Memory: every category DataParallel reports (exactly, or within the units' rounding).
  const double e = in.storage_bytes;
  const bool per_unit = strategy == "zero3" || storage == "bfloat16";
  const double slack = per_unit ? static_cast<double>(model->blocks().size() + 2) * size * 8 : 0.0;
  auto close = [&](double a, double b) { return std::abs(a - b) <= slack + 1e-9 * std::abs(b); };
  auto mem = dp.memory().bytes;
  for (auto& [k, v] : mem)
    TRIDENT_RANK_CHECK(close(get(p.memory_bytes, k), v), "{} {} {} rank {}: memory {} predicted {} accounted {}",
                       strategy, storage, size, rank, k, get(p.memory_bytes, k), v);
  TRIDENT_RANK_CHECK(close(p.persistent_bytes(), dp.memory().total()), "persistent {} vs {}", p.persistent_bytes(),
                     dp.memory().total());
  // Communication per step, by kind (broadcast happened before the first step: not per step).
  auto comm = dp.last_step_comm().bytes;
  for (auto& [k, v] : comm)
    TRIDENT_RANK_CHECK(close(get(p.comm_bytes, k), v), "{} {} {}: comm {} predicted {} accounted {}", strategy,
                       storage, size, k, get(p.comm_bytes, k), v);
  for (auto& [k, v] : p.comm_bytes)
    TRIDENT_RANK_CHECK(close(get(comm, k), v), "{} {}: predicted comm {} {} not accounted", strategy, size, k, v);
  // And the textbook figures, independently: psi = flat size.
  const double psi = static_cast<double>(model->num_params()), n = size;
  const double padded = std::ceil(psi / n) * n;
  if (size == 1) {
    TRIDENT_RANK_CHECK(p.comm_total() == 0, "one rank sends nothing, predicted {}", p.comm_total());
    TRIDENT_RANK_CHECK(get(p.memory_bytes, "optimizer_state") == 8 * psi, "adam 8 psi");
  } else if (strategy == "ddp") {
    TRIDENT_RANK_CHECK(std::abs(p.comm_total() - 2 * (n - 1) / n * psi * e) < 1e-6, "ddp 2(N-1)/N psi");
  } else {
    const double gathers = strategy == "zero3" ? 2 : 1;
    TRIDENT_RANK_CHECK(std::abs(get(p.comm_bytes, "all_gather") - gathers * (n - 1) / n * padded * e) < 1e-6, "AG");
  }
  // K = 12 (bfloat16 parameters and gradients, float32 master weights and moments): 16 psi, 4 psi + 12 psi/N,
  // 2 psi + 14 psi/N, 16 psi/N; float32: 16 psi, 8 psi + 8 psi/N, 4 psi + 12 psi/N, 16 psi/N.
  const bool b = storage == "bfloat16";
  const double want = strategy == "ddp" || size == 1 ? 16 * psi
                      : strategy == "zero1"           ? (b ? 4 * psi + 12 * padded / n : 8 * psi + 8 * padded / n)
                      : strategy == "zero2"           ? (b ? 2 * psi + 14 * padded / n : 4 * psi + 12 * padded / n)
                                                      : 16 * padded / n;
  const double staging = get(p.memory_bytes, "comm_buffers");
  TRIDENT_RANK_CHECK(std::abs(p.persistent_bytes() - staging - want) <= 16 * n, "{} {} {}: persistent {} vs table {}",
                     strategy, storage, size, p.persistent_bytes() - staging, want);
}

void run(const std::string& strategy, int size, bool overlap, const std::string& storage = "float32") {
  auto res = testing::run_threads(size, [&](int rank, int sz, std::shared_ptr<Store> store) {
    check_rank(strategy, rank, sz, store, overlap, storage);
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
  run("zero3", 3, true);
}
TEST(Prediction, Zero3TwoRanksMatchesAccounting) { run("zero3", 2, true); }
// bfloat16 parameter/gradient storage (--param_dtype bfloat16): K = 12 memory, 2-byte communication.
TEST(Prediction, Bf16StorageMatchesAccounting) {
  run("ddp", 1, true, "bfloat16");
  for (const char* s : {"ddp", "zero1", "zero2", "zero3"}) {
    run(s, 2, true, "bfloat16");
    run(s, 3, true, "bfloat16");
  }
}

// ---- model parallelism ----------------------------------------------------------------------------------

nlohmann::json mp_gpt() {
  return {{"kind", "gpt"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 16}, {"block_size", kT},
          {"vocab_size", 14}, {"bias", false}, {"seed", 7}};
}

// Real shards: calibrate (collective), predict, run two real training steps through the engine, and
// compare the predicted activation peak with the stages' measured peak, exactly.
void check_mp_rank(int tp, int pp, int dp, ScheduleKind kind, int m, int v, int rank, int size,
                   std::shared_ptr<Store> store) {
  GroupOptions go;
  go.timeout = Seconds(60);
  auto pg = new_process_group(store, rank, size, go);
  parallel::DeviceMesh mesh(pg, parallel::MeshShape{tp, pp, dp, "tp-dp-pp"});
  parallel::ModelLayout lay;
  lay.tp_rank = mesh.tp_rank();
  lay.tp_size = tp;
  lay.pp_rank = mesh.pp_rank();
  lay.pp_size = pp;
  lay.virtual_stages = v;
  auto pm = parallel::make_parallel_model(mp_gpt(), lay, tp > 1 ? mesh.tp_group() : nullptr, mesh.embedding_group());
  const int B = 8, mb = pp > 1 ? m : 1;
  plan::StageCalibration cal = calibrate_model_parallel(*pm, mesh, B / mb, kT, 14);
  for (size_t s = 0; s < cal.forward_s.size(); ++s)
    TRIDENT_RANK_CHECK(cal.forward_s[s] > 0 && cal.backward_s[s] > 0 && cal.activation_bytes[s] > 0,
                       "stage {}: f {} b {} act {}", s, cal.forward_s[s], cal.backward_s[s], cal.activation_bytes[s]);
  for (size_t i = 0; i < pm->num_params(); ++i)
    TRIDENT_RANK_CHECK(pm->grad_data()[i] == 0.0f, "calibration left gradient {} = {}", i, pm->grad_data()[i]);
  MpPredictionInput in;
  in.tp = tp;
  in.pp = pp;
  in.dp = dp;
  in.virtual_stages = v;
  in.microbatches = mb;
  in.schedule = kind;
  in.pp_rank = mesh.pp_rank();
  in.num_params = pm->num_params();
  in.batch = B;
  in.block = kT;
  in.hidden = 16;
  in.cal = cal;
  MpPrediction p = predict_model_parallel(in);
  TRIDENT_RANK_CHECK(p.step_s > 0 && std::isfinite(p.step_s), "step {}", p.step_s);

  std::vector<int32_t> x(static_cast<size_t>(B) * kT), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>((i * 5 + 1) % 14), y[i] = static_cast<int32_t>((i * 3 + 2) % 14);
  std::unique_ptr<parallel::PipelineEngine> engine;
  if (pp > 1) {
    std::vector<parallel::Stage*> chunks;
    for (int c = 0; c < pm->num_chunks(); ++c) chunks.push_back(&pm->chunk(c));
    engine = std::make_unique<parallel::PipelineEngine>(chunks, mesh.pp_group(), parallel::PipelineOptions{kind, m, v});
  }
  for (int step = 0; step < 2; ++step) {
    pm->zero_grad();
    if (engine) engine->run(x.data(), y.data(), B, kT, true);
    else pm->forward_backward(x.data(), y.data(), B, kT, true);
  }
  double peak = 0;
  for (int c = 0; c < pm->num_chunks(); ++c) peak += static_cast<double>(pm->chunk(c).peak_activation_bytes());
  TRIDENT_RANK_CHECK(p.memory_bytes.at("activations") == peak, "rank {} ({} P={} m={} v={}): predicted activations {} "
                     "measured peak {} ({} in flight)", rank, parallel::schedule_name(kind), pp, m, v,
                     p.memory_bytes.at("activations"), peak, p.inflight);
  if (pp > 1 && v == 1) {
    const int want = kind == ScheduleKind::kGPipe ? m : std::min(m, pp - mesh.pp_rank());
    TRIDENT_RANK_CHECK(p.inflight == want, "in flight {} want {}", p.inflight, want);
  }
  pg->barrier();
}

void run_mp(int tp, int pp, int dp, ScheduleKind kind, int m, int v) {
  const int world = tp * pp * dp;
  auto res = testing::run_threads(world, [&](int rank, int sz, std::shared_ptr<Store> store) {
    check_mp_rank(tp, pp, dp, kind, m, v, rank, sz, store);
  });
  EXPECT_EQ(testing::failures(res), "") << "tp " << tp << " pp " << pp << " dp " << dp << " "
                                        << parallel::schedule_name(kind) << " m " << m << " v " << v;
}

TEST(ModelParallelPrediction, ActivationPeakMatchesStagesPp2OneFOneB) { run_mp(1, 2, 1, ScheduleKind::k1F1B, 4, 1); }
TEST(ModelParallelPrediction, ActivationPeakMatchesStagesPp2GPipe) { run_mp(1, 2, 1, ScheduleKind::kGPipe, 4, 1); }
TEST(ModelParallelPrediction, ActivationPeakMatchesStagesPp2Interleaved) {
  run_mp(1, 2, 1, ScheduleKind::kInterleaved, 2, 2);
}
TEST(ModelParallelPrediction, ActivationPeakMatchesStagesTp2) { run_mp(2, 1, 1, ScheduleKind::k1F1B, 1, 1); }
TEST(ModelParallelPrediction, ActivationPeakMatchesStagesPp2Dp2) { run_mp(1, 2, 2, ScheduleKind::k1F1B, 2, 1); }

}  // namespace
}  // namespace trident::train
