// Closing the loop (train/prediction.h): the predicted memory per rank and communication per step equal
// what DataParallel actually accounts after a real step of a tiny GPT, at 1, 2 and 3 ranks (threads) for ddp,
// zero1 and zero2; the activation estimate is Korthikanti et al.'s formula (fp32) plus the logits; the
// calibrated step time is positive and finite. No timed assertions.
// Model parallelism: the planner's bubble formulas (plan/model.h) equal parallel::replay() of the real
// schedules for uniform stage times (P = 2, 4; m = 1, 2, 4, 8; interleaved v = 2 where legal), and so does
// the simulator's own schedule generator replayed; predict_model_parallel's pipeline time, in-flight
// activations and communication against closed forms; and, on real ParallelModels (threads: PP 2 under
// 1F1B / GPipe / interleaved, TP 2, PP 2 x DP 2), the predicted activation memory per rank equals the
// stages' measured peak after real pipeline steps, byte for byte.
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
#include "trident/plan/model.h"
#include "trident/plan/simulator.h"
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

// ---- model parallelism ----------------------------------------------------------------------------------

using parallel::ScheduleKind;

plan::Schedule plan_kind(ScheduleKind k) {
  return k == ScheduleKind::kGPipe ? plan::Schedule::kGPipe
                                   : k == ScheduleKind::k1F1B ? plan::Schedule::k1F1B : plan::Schedule::kInterleaved;
}

struct Case {
  ScheduleKind kind;
  int P, m, v;
};
std::vector<Case> bubble_cases() {
  std::vector<Case> cs;
  for (int P : {2, 4})
    for (int m : {1, 2, 4, 8}) {
      cs.push_back({ScheduleKind::kGPipe, P, m, 1});
      cs.push_back({ScheduleKind::k1F1B, P, m, 1});
      if (m % P == 0) cs.push_back({ScheduleKind::kInterleaved, P, m, 2});
    }
  return cs;
}

// The planner's closed forms are what the event-driven replay of the real schedules gives for uniform
// stages (forward 1, backward 2 per chunk, free hand-offs): "the planner predicts the same numbers".
TEST(ModelParallelPrediction, PlannerBubbleEqualsReplayOfTheRealSchedules) {
  int checked = 0;
  for (const Case& c : bubble_cases()) {
    SCOPED_TRACE(fmt::format("{} P={} m={} v={}", parallel::schedule_name(c.kind), c.P, c.m, c.v));
    auto sched = parallel::make_schedule(c.kind, c.P, c.m, c.v);
    auto r = parallel::replay(sched, c.P, c.v, parallel::ReplayTimes{{1.0}, {2.0}, 0.0});
    EXPECT_NEAR(r.bubble_fraction, plan::bubble_fraction(c.P, c.m, c.v), 1e-12);
    EXPECT_NEAR(r.bubble_ratio, plan::bubble_over_ideal(c.P, c.m, c.v), 1e-12);
    // Independently: makespan = (v m + P - 1) x (f + b) per chunk.
    EXPECT_NEAR(r.makespan, (c.v * c.m + c.P - 1) * 3.0, 1e-9);
    // The simulator's own generator (plan/simulator.h) replayed gives the same makespan.
    parallel::Schedule from_plan(static_cast<size_t>(c.P));
    for (int p = 0; p < c.P; ++p)
      for (const auto& a : plan::pipeline_schedule(plan_kind(c.kind), c.P, p, c.m, c.v))
        from_plan[static_cast<size_t>(p)].push_back(
            {a.fwd ? parallel::Action::kForward : parallel::Action::kBackward, a.chunk, a.mb});
    parallel::check_schedule(from_plan, c.P, c.m, c.v);
    auto rp = parallel::replay(from_plan, c.P, c.v, parallel::ReplayTimes{{1.0}, {2.0}, 0.0});
    EXPECT_NEAR(rp.makespan, r.makespan, 1e-9);
    // First-stage in-flight microbatches: the planner's count (GPipe m, 1F1B min(P, m)) = the schedule's.
    if (c.kind != ScheduleKind::kInterleaved) {
      EXPECT_EQ(parallel::max_in_flight(sched[0]),
                static_cast<int>(plan::inflight_microbatches(plan_kind(c.kind), c.P, c.m, 1)));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 4 * 2 + 3 + 2);  // gpipe + 1f1b at 8 (P, m), interleaved where m % P == 0
}

// Ranks sharing cores: with a core per rank the processor-sharing replay is parallel::replay; on one core
// nothing overlaps, so the step is all the work of all ranks (a core is never idle while an action is ready).
TEST(ModelParallelPrediction, SharedCoresReplayLimits) {
  for (const Case& c : bubble_cases()) {
    SCOPED_TRACE(fmt::format("{} P={} m={} v={}", parallel::schedule_name(c.kind), c.P, c.m, c.v));
    auto sched = parallel::make_schedule(c.kind, c.P, c.m, c.v);
    // Non-uniform: stage s forward 1 + s/10, backward twice that.
    auto dur = [&](int rank, const parallel::Action& a) {
      const double f = 1.0 + 0.1 * (a.chunk * c.P + rank);
      return a.type == parallel::Action::kForward ? f : 2 * f;
    };
    auto ref = parallel::replay(sched, c.P, c.v, dur, [](int, int) { return 0.25; });
    auto own = replay_shared_cores(sched, c.P, c.v, dur, 0.25, c.P);
    EXPECT_NEAR(own.makespan, ref.makespan, 1e-9);
    EXPECT_NEAR(own.bubble_fraction, ref.bubble_fraction, 1e-9);
    double total = 0;
    for (int p = 0; p < c.P; ++p)
      for (const auto& a : sched[static_cast<size_t>(p)]) total += dur(p, a);
    EXPECT_NEAR(replay_shared_cores(sched, c.P, c.v, dur, 0.0, 1.0).makespan, total, 1e-9);
    // Half a core per rank can only be slower than a core each.
    const double free_handoffs = parallel::replay(sched, c.P, c.v, dur).makespan;
    EXPECT_GE(replay_shared_cores(sched, c.P, c.v, dur, 0.0, c.P / 2.0).makespan, free_handoffs - 1e-9);
  }
}

StageCalibration uniform_cal(int P, int v, double f, double b, double act) {
  StageCalibration c;
  c.forward_s.assign(static_cast<size_t>(P) * v, f);
  c.backward_s.assign(static_cast<size_t>(P) * v, b);
  c.activation_bytes.assign(static_cast<size_t>(P) * v, act);
  return c;
}

TEST(ModelParallelPrediction, ClosedFormsForUniformStages) {
  MpPredictionInput in;
  in.pp = 2;
  in.microbatches = 4;
  in.schedule = ScheduleKind::k1F1B;
  in.num_params = 1000;
  in.batch = 8;
  in.block = 16;
  in.hidden = 32;
  in.local_layers = 2;
  in.cal = uniform_cal(2, 1, 0.001, 0.002, 5000);
  for (int p = 0; p < 2; ++p) {
    in.pp_rank = p;
    MpPrediction r = predict_model_parallel(in);
    EXPECT_NEAR(r.pipeline_s, (4 + 2 - 1) * 0.003, 1e-12);
    EXPECT_NEAR(r.bubble_fraction, 1.0 / 5, 1e-12);
    EXPECT_NEAR(r.bubble_theory, 1.0 / 5, 1e-12);
    EXPECT_EQ(r.inflight, 2 - p);  // 1F1B: min(m, P - p)
    EXPECT_DOUBLE_EQ(r.memory_bytes.at("activations"), (2 - p) * 5000.0);
    EXPECT_DOUBLE_EQ(r.memory_bytes.at("optimizer_state"), 8000.0);  // the trainer's AdamW, no DP
    // Each microbatch sends one activation forward (rank 0) or one gradient back (rank 1): B/m x T x C x 4.
    EXPECT_DOUBLE_EQ(r.comm_bytes.at("pp_send_recv"), 4 * 2.0 * 16 * 32 * 4);
    EXPECT_NEAR(r.step_s, r.pipeline_s, 1e-15);
  }
  // GPipe holds all m; a hand-off latency adds to each of the 2 (P - 1) crossings on the critical path.
  in.schedule = ScheduleKind::kGPipe;
  in.pp_rank = 0;
  in.cal.p2p_latency_s = 0.0005;
  MpPrediction g = predict_model_parallel(in);
  EXPECT_EQ(g.inflight, 4);
  EXPECT_DOUBLE_EQ(g.memory_bytes.at("activations"), 4 * 5000.0);
  EXPECT_NEAR(g.pipeline_s, 5 * 0.003 + 2 * 0.0005, 1e-12);
  // TP 2 x DP 2 (pp 1): 4 all-reduces per block of B x T x C floats, bus factor 2(T-1)/T = 1; DDP all-reduce
  // 2(D-1)/D x 4n at the calibrated rate; DataParallel's moments beside the trainer's.
  MpPredictionInput t;
  t.tp = 2;
  t.dp = 2;
  t.num_params = 1000;
  t.batch = 8;
  t.block = 16;
  t.hidden = 32;
  t.local_layers = 3;
  t.cal = uniform_cal(1, 1, 0.01, 0.02, 7000);
  t.cal.dp_allreduce_bus_Bps = 4000.0 / 0.005;  // the 4000-byte all-reduce takes 5 ms
  t.cal.optimizer_s_per_param = 1e-6;
  MpPrediction r = predict_model_parallel(t);
  EXPECT_DOUBLE_EQ(r.comm_bytes.at("tp_all_reduce"), 4.0 * 3 * 8 * 16 * 32 * 4);
  EXPECT_DOUBLE_EQ(r.comm_bytes.at("all_reduce"), 4000.0);
  EXPECT_DOUBLE_EQ(r.memory_bytes.at("optimizer_state"), 16000.0);
  EXPECT_DOUBLE_EQ(r.memory_bytes.at("activations"), 7000.0);
  EXPECT_NEAR(r.step_s, 0.03 + 0.005 + 0.001, 1e-12);
  EXPECT_EQ(r.bubble_fraction, 0.0);
  // A calibration of the wrong layout is refused.
  t.pp = 2;
  EXPECT_THROW(predict_model_parallel(t), InvalidArgument);
}

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
  StageCalibration cal = calibrate_model_parallel(*pm, mesh, B / mb, kT, 14);
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
