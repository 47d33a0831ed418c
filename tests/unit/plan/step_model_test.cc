// The run-time step model (plan/step_model.h) on hand-made calibrations: activations are Korthikanti et
// al.'s formula (fp32) plus the logits; exposed data-parallel communication is what the backward share
// cannot hide (the planner's rule, exposed_after_overlap); the planner's bubble formulas (plan/model.h)
// equal parallel::replay() of the real schedules for uniform stage times (P = 2, 4; m = 1, 2, 4, 8;
// interleaved v = 2 where legal), and so do the simulator's programs (plan::pipeline_schedule) replayed; the
// shared-cores replay against hand-computed and list-scheduling makespans; predict_model_parallel's
// pipeline time, in-flight activations and communication against closed forms. The same figures checked
// against a real DataParallel and real pipeline stages: tests/unit/train/prediction_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "trident/core/error.h"
#include "trident/parallel/schedule.h"
#include "trident/plan/model.h"
#include "trident/plan/simulator.h"
#include "trident/plan/step_model.h"

namespace trident::plan {
namespace {

TEST(StepModel, RefusesInputsItDoesNotModel) {
  PredictionInput in;
  in.zero_stage = 4;
  EXPECT_THROW(predict(in), InvalidArgument);
  in.zero_stage = 0;
  in.storage_bytes = 8;
  EXPECT_THROW(predict(in), InvalidArgument);
  MpPredictionInput mp;
  mp.cal.forward_s = mp.cal.backward_s = mp.cal.activation_bytes = {1.0};
  mp.zero_stage = 2;
  EXPECT_THROW(predict_model_parallel(mp), InvalidArgument);
  mp.zero_stage = 1;
  EXPECT_NO_THROW(predict_model_parallel(mp));
}

TEST(StepModel, ExposedAfterOverlap) {
  // 30 ms of communication, 20 ms of backward to hide it under, a quarter of it in the last bucket.
  EXPECT_NEAR(exposed_after_overlap(0.03, 0.02, 0.25), 0.01, 1e-15);
  EXPECT_NEAR(exposed_after_overlap(0.03, 1.0, 0.25), 0.0075, 1e-15);  // all but the last bucket hidden
  EXPECT_EQ(exposed_after_overlap(0.03, 0.0, 0.25), 0.03);             // nothing to hide under
}

TEST(StepModel, ActivationsAreKorthikantiFp32PlusLogits) {
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

Schedule plan_kind(ScheduleKind k) {
  return k == ScheduleKind::kGPipe ? Schedule::kGPipe
                                   : k == ScheduleKind::k1F1B ? Schedule::k1F1B : Schedule::kInterleaved;
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
TEST(StepModel, PlannerBubbleEqualsReplayOfTheRealSchedules) {
  int checked = 0;
  for (const Case& c : bubble_cases()) {
    SCOPED_TRACE(fmt::format("{} P={} m={} v={}", parallel::schedule_name(c.kind), c.P, c.m, c.v));
    auto sched = parallel::make_schedule(c.kind, c.P, c.m, c.v);
    auto r = parallel::replay(sched, c.P, c.v, parallel::ReplayTimes{{1.0}, {2.0}, 0.0});
    EXPECT_NEAR(r.bubble_fraction, bubble_fraction(c.P, c.m, c.v), 1e-12);
    EXPECT_NEAR(r.bubble_ratio, bubble_over_ideal(c.P, c.m, c.v), 1e-12);
    // Independently: makespan = (v m + P - 1) x (f + b) per chunk.
    EXPECT_NEAR(r.makespan, (c.v * c.m + c.P - 1) * 3.0, 1e-9);
    // The simulator's programs (plan/simulator.h) are the same schedules, action for action.
    parallel::Schedule from_plan(static_cast<size_t>(c.P));
    for (int p = 0; p < c.P; ++p)
      for (const auto& a : pipeline_schedule(plan_kind(c.kind), c.P, p, c.m, c.v))
        from_plan[static_cast<size_t>(p)].push_back(
            {a.fwd ? parallel::Action::kForward : parallel::Action::kBackward, a.chunk, a.mb});
    EXPECT_EQ(from_plan, sched);
    // First-stage in-flight microbatches: the planner's count (GPipe m, 1F1B min(P, m)) = the schedule's.
    if (c.kind != ScheduleKind::kInterleaved) {
      EXPECT_EQ(parallel::max_in_flight(sched[0]),
                static_cast<int>(inflight_microbatches(plan_kind(c.kind), c.P, c.m, 1)));
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 * 4 * 2 + 3 + 2);  // gpipe + 1f1b at 8 (P, m), interleaved where m % P == 0
}

// Ranks sharing cores: with a core per rank the shared-cores replay is parallel::replay; on one core
// nothing overlaps, so the step is all the work of all ranks (a core is never idle while an action is ready).
TEST(StepModel, SharedCoresReplayLimits) {
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

// Ranks on fewer cores, hand-computed. 2 stages, GPipe, 2 microbatches, 1 core, forward 1, backward 2, free
// hand-offs. An action runs to its end once on the core; a rank woken by a receive while the core is taken
// joins the run queue `wake` later. With wake 0.5: rank 0 F0 [0,1]; at 1 rank 0's F1 keeps the core [1,2]
// and rank 1 (asleep on F0's activation) queues at 1.5; rank 1 runs F0 [2,3], F1 [3,4], B0 [4,6]; at 6
// rank 1 goes on with B1 [6,8] and rank 0 (asleep on B0's gradient) queues at 6.5: B0 [8,10], B1 [10,12].
// Nothing idles the core: 12 = all the work. With wake 1.5 the core idles [2, 2.5]: 12.5.
TEST(StepModel, SharedCoresWakeUpHandComputed) {
  auto sched = parallel::make_schedule(ScheduleKind::kGPipe, 2, 2);
  auto dur = [](int, const parallel::Action& a) { return a.type == parallel::Action::kForward ? 1.0 : 2.0; };
  auto r = replay_shared_cores(sched, 2, 1, dur, 0.0, 1.0, 0.5);
  EXPECT_NEAR(r.makespan, 12.0, 1e-12);
  EXPECT_NEAR(r.start[1][0], 2.0, 1e-12);   // rank 1 F0
  EXPECT_NEAR(r.start[0][2], 8.0, 1e-12);   // rank 0 B0
  EXPECT_NEAR(r.finish[1][3], 8.0, 1e-12);  // rank 1 B1
  auto late = replay_shared_cores(sched, 2, 1, dur, 0.0, 1.0, 1.5);
  EXPECT_NEAR(late.makespan, 12.5, 1e-12);
  EXPECT_NEAR(late.start[1][0], 2.5, 1e-12);
  // A free core wakes the rank at once: with a core each, the wake-up latency costs nothing.
  auto own = replay_shared_cores(sched, 2, 1, dur, 0.0, 2.0, 5.0);
  EXPECT_NEAR(own.makespan, parallel::replay(sched, 2, 1, dur).makespan, 1e-12);
  // Run to completion, not processor sharing: forward-only, 1 core. Rank 0 F0 [0,1], F1 [1,2] (it keeps the
  // core; rank 1 queued behind it at the same instant), rank 1 F0 [2,3], F1 [3,4]. Rank 1's spans are 1 each
  // (processor sharing would stretch its F0 over [1,3]).
  auto fwd = parallel::forward_only(sched);
  auto f = replay_shared_cores(fwd, 2, 1, dur, 0.0, 1.0);
  EXPECT_NEAR(f.makespan, 4.0, 1e-12);
  EXPECT_NEAR(f.start[1][0], 2.0, 1e-12);
  EXPECT_NEAR(f.busy[1], 2.0, 1e-12);
  EXPECT_THROW(replay_shared_cores(sched, 2, 1, dur, 0.0, 1.0, -1.0), InvalidArgument);
}

// Background tasks: 2 stages, GPipe, 1 microbatch, 1 core and 1 other runnable task: the run's one ready rank
// gets half the core, so every action takes twice as long: F0 [0,2], F1 [2,4], B1 [4,8], B0 [8,12].
// With wake 0.25: rank 1 wakes at 2 with no core free (the other task holds it) -> 2.25, and rank 0 at 8 ->
// 8.25: 12.5.
TEST(StepModel, SharedCoresBackgroundHandComputed) {
  auto sched = parallel::make_schedule(ScheduleKind::kGPipe, 2, 1);
  auto dur = [](int, const parallel::Action& a) { return a.type == parallel::Action::kForward ? 1.0 : 2.0; };
  EXPECT_NEAR(replay_shared_cores(sched, 2, 1, dur, 0.0, 1.0, 0.0, 1.0).makespan, 12.0, 1e-12);
  auto w = replay_shared_cores(sched, 2, 1, dur, 0.0, 1.0, 0.25, 1.0);
  EXPECT_NEAR(w.makespan, 12.5, 1e-12);
  EXPECT_NEAR(w.start[1][0], 2.25, 1e-12);
  // The probe's arithmetic: 4 ranks on 2 cores received 1 core in all -> 4 other tasks; 1.95 cores -> none.
  EXPECT_NEAR(background_tasks(1.0, 4, 2.0), 4.0, 1e-12);
  EXPECT_EQ(background_tasks(1.95, 4, 2.0), 0.0);
  EXPECT_EQ(background_tasks(0.0, 4, 2.0), 0.0);
  // 2 ranks on 2 cores that got 4/3 cores: 1 other task (2 x 2 / (2 + 1)).
  EXPECT_NEAR(background_tasks(4.0 / 3, 2, 2.0), 1.0, 1e-12);
}

// P = 4, 1F1B, 8 microbatches on 2 and 3 cores against an independent list-scheduling simulation (a Python
// script: at most `cores` actions run, each to its end; ready ranks wait in a queue ordered by ready time, then
// rank; hand-off 0.25): stage s forward 1 + s/10, backward twice that. Makespans 61.15 and 46.4.
TEST(StepModel, SharedCoresMatchesListScheduling) {
  auto sched = parallel::make_schedule(ScheduleKind::k1F1B, 4, 8);
  auto dur = [](int rank, const parallel::Action& a) {
    const double f = 1.0 + 0.1 * rank;
    return a.type == parallel::Action::kForward ? f : 2 * f;
  };
  auto two = replay_shared_cores(sched, 4, 1, dur, 0.25, 2.0);
  EXPECT_NEAR(two.makespan, 61.15, 1e-9);
  double idle = 0;
  for (int q = 0; q < 4; ++q) idle += two.idle[static_cast<size_t>(q)] / two.makespan / 4;
  EXPECT_NEAR(idle, 0.5486508585445624, 1e-9);  // the simulation's mean idle share
  EXPECT_NEAR(replay_shared_cores(sched, 4, 1, dur, 0.25, 3.0).makespan, 46.4, 1e-9);
}

// The prediction on shared cores replays the calibrated processor times; the calibration's background tasks
// go into step_loaded_s only; step_at_cores_used finds the background that makes the replay use the given
// cores.
TEST(StepModel, SharedCoresPredictionUsesProcessorTimes) {
  MpPredictionInput in;
  in.pp = 4;
  in.microbatches = 8;
  in.schedule = ScheduleKind::k1F1B;
  in.num_params = 1000;
  in.batch = 16;
  in.block = 16;
  in.hidden = 32;
  in.local_layers = 1;
  in.world = 4;
  in.cores = 2;
  in.cal = uniform_cal(4, 1, 0.003, 0.006, 5000);  // wall times: ignored when processor times exist
  in.cal.forward_cpu_s = {1.0, 1.1, 1.2, 1.3};
  in.cal.backward_cpu_s = {2.0, 2.2, 2.4, 2.6};
  in.cal.p2p_latency_s = 0.25;
  in.cal.handoff_loaded_s = 0.25;  // no extra wake-up cost
  in.cal.cores_received = 1.0;     // 4 other tasks
  MpPrediction p = predict_model_parallel(in);
  EXPECT_TRUE(p.shared_cores);
  EXPECT_NEAR(p.pipeline_s, 61.15, 1e-9);
  EXPECT_NEAR(p.background, 4.0, 1e-12);
  auto sched = parallel::make_schedule(ScheduleKind::k1F1B, 4, 8);
  auto cpu = [&](int rank, const parallel::Action& a) {
    return a.type == parallel::Action::kForward ? in.cal.forward_cpu_s[static_cast<size_t>(rank)]
                                                : in.cal.backward_cpu_s[static_cast<size_t>(rank)];
  };
  const double loaded = replay_shared_cores(sched, 4, 1, cpu, 0.25, 2.0, 0.0, 4.0).makespan;
  EXPECT_GT(loaded, 61.15);
  EXPECT_NEAR(p.step_loaded_s - p.step_s, loaded - 61.15, 1e-9);
  // At the cores the replay itself uses, nothing changes; at fewer, the step grows and the replay at the found
  // background uses exactly that many.
  double work = 0;
  for (int q = 0; q < 4; ++q)
    for (const auto& a : sched[static_cast<size_t>(q)]) work += cpu(q, a);
  EXPECT_NEAR(step_at_cores_used(in, work / 61.15), p.step_s, 1e-9);
  const double slow = step_at_cores_used(in, 1.0);
  const double makespan = slow - p.step_s + 61.15;
  EXPECT_NEAR(work / makespan, 1.0, 1e-6);
  // Extra wake-up latency when cores are all taken: only the excess over the idle hand-off.
  in.cal.handoff_loaded_s = 0.75;
  EXPECT_NEAR(predict_model_parallel(in).wake_s, 0.5, 1e-12);
  // A core per rank: the plain replay of the wall times (processor times unused).
  in.cores = 4;
  MpPrediction own = predict_model_parallel(in);
  EXPECT_FALSE(own.shared_cores);
  EXPECT_NEAR(own.pipeline_s, parallel::replay(sched, 4, 1, parallel::ReplayTimes{{0.003}, {0.006}, own.p2p_s}).makespan,
              1e-12);
  // ... and the after-run check replays the processor times there too (4 cores: the plain replay).
  const double cpu_makespan = parallel::replay(sched, 4, 1, cpu, [&](int, int) { return own.p2p_s; }).makespan;
  EXPECT_NEAR(step_at_cores_used(in, 4.0), own.step_s - own.pipeline_s + cpu_makespan, 1e-9);
  EXPECT_GT(step_at_cores_used(in, 1.0), own.step_s - own.pipeline_s + cpu_makespan);
}

TEST(StepModel, ClosedFormsForUniformStages) {
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

}  // namespace
}  // namespace trident::plan
