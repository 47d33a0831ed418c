// Optimizer offload under data parallelism (DataParallelOptions::adamw.offload): DDP and ZeRO-1/2/3, float32
// and bfloat16 storage, at 1, 2 and 3 ranks, on a stand-in device: the CPU's kernels behind a table that
// calls itself "cuda" and counts its allocations and its host <-> device copies. So the test sees what an
// accelerator would hold and move:
//   - training with offload is bit for bit training without it (losses, final parameters, gathered moments);
//   - each rank's device holds exactly its shard's moments (and master weights) less than without offload,
//     and its host holds them instead: 8 (float32) or 12 (bfloat16) bytes per element of its own shard,
//     counted by hand from the shard sizes, not the whole model's;
//   - each step copies this rank's owned gradients (and float32 parameters) to the host and the updated
//     parameters back, nothing more;
//   - the state gathered for a checkpoint is the same with and without offload, and a run resumed from it
//     with the other setting continues bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness/counting_device.h"
#include "harness/multiproc.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/parallel/data_parallel.h"

namespace trident::offload_test {
namespace {

constexpr int kB = 2, kT = 8, kVocab = 13, kSteps = 6, kSwitch = 3;

namespace cd = testing::counting_device;
std::atomic<size_t>& g_live = cd::counters().live;
std::atomic<size_t>& g_to_host = cd::counters().to_host;
std::atomic<size_t>& g_to_device = cd::counters().to_device;

nlohmann::json model_json() {
  return {{"kind", "gpt"}, {"n_layer", 2},        {"n_head", 2},    {"n_embd", 16}, {"block_size", kT},
          {"vocab_size", kVocab}, {"bias", false}, {"seed", 7},      {"device", "cuda"}};
}

struct Case {
  std::string strategy;
  DType dtype;
  int world;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.strategy + (i.param.dtype == DType::kBFloat16 ? "_bf16_" : "_fp32_") + std::to_string(i.param.world) +
         "ranks";
}

// What one rank leaves behind for the parent to compare.
struct Outcome {
  std::vector<double> losses;
  std::vector<float> params, m, v;          // at the end: gathered parameters (master for bf16) and moments
  std::vector<float> m_switch, v_switch;    // the state a checkpoint at kSwitch would hold
  double live = 0;                          // device bytes held after the last step
  double state = 0;                         // elements of this rank's optimizer state (its shard)
};

// Elements this rank updates: everything (ddp), its contiguous N-th (zero1), or its piece of every unit
// (zero2/zero3), from the layout DataParallel reports.
size_t owned_elements(const parallel::DataParallel& dp, size_t n) {
  switch (dp.strategy()) {
    case parallel::Strategy::kDdp: return n;
    case parallel::Strategy::kZero1: return dp.shard_end() - dp.shard_begin();
    default: {
      size_t k = 0;
      for (const auto& u : dp.units()) k += u.mine_count;
      return k;
    }
  }
}
// Elements of this rank's moments: as owned, with zero2/zero3's pieces at their padded length.
size_t state_elements(const parallel::DataParallel& dp, size_t n) {
  return dp.strategy() == parallel::Strategy::kZero2 || dp.strategy() == parallel::Strategy::kZero3
             ? dp.shard_numel()
             : owned_elements(dp, n);
}

template <class T>
void put(FILE* f, const std::vector<T>& x) {
  const uint64_t n = x.size();
  std::fwrite(&n, sizeof n, 1, f);
  std::fwrite(x.data(), sizeof(T), x.size(), f);
}
template <class T>
bool get(FILE* f, std::vector<T>* x) {
  uint64_t n = 0;
  if (std::fread(&n, sizeof n, 1, f) != 1) return false;
  x->resize(n);
  return std::fread(x->data(), sizeof(T), n, f) == n;
}

void write_outcome(const std::string& path, const Outcome& o) {
  FILE* f = std::fopen(path.c_str(), "wb");
  put(f, o.losses);
  put(f, o.params);
  put(f, o.m);
  put(f, o.v);
  put(f, o.m_switch);
  put(f, o.v_switch);
  put(f, std::vector<double>{o.live, o.state});
  std::fclose(f);
}

Outcome read_outcome(const std::string& path) {
  Outcome o;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return o;
  std::vector<double> live;
  get(f, &o.losses) && get(f, &o.params) && get(f, &o.m) && get(f, &o.v) && get(f, &o.m_switch) &&
      get(f, &o.v_switch) && get(f, &live);
  std::fclose(f);
  if (live.size() == 2) o.live = live[0], o.state = live[1];
  return o;
}

// Trains steps [0, kSwitch) with offload `first` and [kSwitch, kSteps) with offload `second`, moving the
// state between the two halves as a checkpoint does (gathered to every rank, loaded into a fresh model and
// DataParallel). first == second with `resume` false trains straight through.
void run_rank(const Case& c, bool first, bool second, bool resume, int rank, int size, std::shared_ptr<Store> store,
              const std::string& out) {
  cd::install();  // in this forked rank only
  GroupOptions go;
  go.timeout = Seconds(60);
  auto pg = new_process_group(store, rank, size, go);
  const kernels::DeviceOps& dev = kernels::device_ops(kernels::Device::kCuda);
  Outcome o;
  std::vector<float> saved_params, saved_m, saved_v;
  int64_t saved_step = 0;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<parallel::DataParallel> dp;
  auto build = [&](bool offload) {
    dp.reset();
    model = nn::make_model(model_json());
    TRIDENT_RANK_CHECK(model->device() == kernels::Device::kCuda, "the model is not on the stand-in device");
    parallel::DataParallelOptions opt;
    opt.strategy = parallel::parse_strategy(c.strategy);
    opt.storage_dtype = c.dtype;
    opt.bucket_bytes = 4096;  // several buckets and units
    opt.adamw = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    opt.adamw.offload = offload;
    opt.adamw.offload_chunk = 37;  // the copies cross chunk ends inside every piece
    if (!saved_params.empty()) dev.to_device(model->param_data(), saved_params.data(), saved_params.size() * 4);
    dp = std::make_unique<parallel::DataParallel>(*model, pg, opt);
    dp->broadcast_parameters();
    if (!saved_m.empty()) dp->load_optimizer_state(saved_m, saved_v, saved_step);
  };
  // The full state on every rank, as the trainer's before_save gathers it for a checkpoint.
  auto gather = [&](std::vector<float>* p, std::vector<float>* m, std::vector<float>* v, int64_t* step) {
    dp->gather_optimizer_state(m, v, step);
    dp->gather_full_parameters();  // zero3: the whole model; bf16: the master weights (already written)
    p->resize(model->num_params());
    dev.to_host(p->data(), model->param_data(), p->size() * 4);
  };
  build(first);
  std::vector<int32_t> x, y;
  for (int s = 0; s < kSteps; ++s) {
    if (s == kSwitch && resume) {
      gather(&saved_params, &saved_m, &saved_v, &saved_step);
      o.m_switch = saved_m;
      o.v_switch = saved_v;
      build(second);
    }
    const bool offload = s < kSwitch || !resume ? first : second;
    model->zero_grad();
    trident::testing::token_windows(s, rank * kB, kB, kT, kVocab, &x, &y);
    double loss = model->forward_backward(x.data(), y.data(), kB, kT, true, 1.0f);
    dp->finish_gradient_sync();
    dp->clip_grad_norm(1.0f);
    const size_t h0 = g_to_host, d0 = g_to_device;
    dp->step(1e-2f);
    const size_t to_host = g_to_host - h0, to_device = g_to_device - d0;
    // Copies of one step: the owned pieces' gradients (and float32 parameters, their own master) to the
    // host, the updated stored parameters back; nothing without offload.
    const size_t owned = owned_elements(*dp, model->num_params());
    const size_t e = c.dtype == DType::kBFloat16 ? 2 : 4;
    const size_t want_h = !offload ? 0 : c.dtype == DType::kBFloat16 ? 2 * owned : 8 * owned;
    const size_t want_d = !offload ? 0 : e * owned;
    TRIDENT_RANK_CHECK(to_host == want_h && to_device == want_d,
                       "step {} (offload {}): {} bytes to the host and {} back, want {} and {} ({} owned elements)", s,
                       offload, to_host, to_device, want_h, want_d, owned);
    pg->all_reduce(&loss, 1, DType::kFloat64, ReduceOp::kAvg);
    o.losses.push_back(loss);
  }
  // Memory: with offload this rank's host holds its shard's moments (and bf16's master weights), counted
  // from the shard's size by hand; the device holds none of it.
  const parallel::MemoryReport mem = dp->memory();
  const double state = static_cast<double>(state_elements(*dp, model->num_params()));
  o.state = state;
  const bool offload_now = resume ? second : first;
  const double per_elem = c.dtype == DType::kBFloat16 ? 12.0 : 8.0;
  const double host = mem.host_total();
  TRIDENT_RANK_CHECK(host == (offload_now ? per_elem * state : 0.0), "host bytes {} want {} x {} elements", host,
                     per_elem, state);
  TRIDENT_RANK_CHECK(mem.bytes.at("optimizer_state") == (offload_now ? 0.0 : 8.0 * state),
                     "device optimizer bytes {} with offload {}", mem.bytes.at("optimizer_state"), offload_now);
  o.live = static_cast<double>(g_live.load());
  int64_t step = 0;
  gather(&o.params, &o.m, &o.v, &step);
  TRIDENT_RANK_CHECK(step == kSteps, "optimizer step {} want {}", step, kSteps);
  write_outcome(out + "/rank" + std::to_string(rank), o);
}

std::vector<Outcome> run(const Case& c, bool first, bool second, bool resume) {
  const testing::TempDir tmp("offload");
  const std::string dir = tmp.path.string();
  auto res = testing::run_processes(
      c.world, [&](int r, int n, std::shared_ptr<Store> st) { run_rank(c, first, second, resume, r, n, st, dir); },
      {.deadline_s = 120, .env = {}});
  EXPECT_EQ(testing::failures(res), "") << "offload " << first << " then " << second;
  std::vector<Outcome> out;
  for (int r = 0; r < c.world; ++r) out.push_back(read_outcome(dir + "/rank" + std::to_string(r)));
  return out;
}

class OffloadParity : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadParity, BitForBitWithLessDeviceMemoryAndCheckpointsThatDoNotDependOnIt) {
  const Case c = GetParam();
  const auto plain = run(c, false, false, false);
  const auto off = run(c, true, true, false);
  const auto on_then_off = run(c, true, false, true);
  const auto off_then_on = run(c, false, true, true);
  ASSERT_EQ(plain.size(), static_cast<size_t>(c.world));
  ASSERT_EQ(plain[0].losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(plain[0].losses.back(), plain[0].losses.front()) << "training did not move";
  const size_t n = plain[0].params.size();
  for (int r = 0; r < c.world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (const auto* other : {&off, &on_then_off, &off_then_on}) {
      const Outcome& a = plain[r];
      const Outcome& b = (*other)[r];
      EXPECT_EQ(b.losses, a.losses);
      ASSERT_EQ(b.params.size(), n);
      EXPECT_EQ(0, std::memcmp(b.params.data(), a.params.data(), n * 4)) << "final parameters";
      EXPECT_EQ(b.m, a.m) << "exp_avg";
      EXPECT_EQ(b.v, a.v) << "exp_avg_sq";
    }
    // What a checkpoint at kSwitch holds is the same whether the run offloaded or not.
    EXPECT_EQ(on_then_off[r].m_switch, off_then_on[r].m_switch);
    EXPECT_EQ(on_then_off[r].v_switch, off_then_on[r].v_switch);
    EXPECT_FALSE(on_then_off[r].m_switch.empty());
    // The device holds the offloaded state less, exactly (the rank checked the host's side by hand).
    const double per_elem = c.dtype == DType::kBFloat16 ? 12.0 : 8.0;
    EXPECT_GT(plain[r].state, 0.0);
    EXPECT_EQ(plain[r].live - off[r].live, per_elem * plain[r].state)
        << "device bytes without offload " << plain[r].live << ", with " << off[r].live;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OffloadParity,
    ::testing::Values(Case{"ddp", DType::kFloat32, 1}, Case{"ddp", DType::kFloat32, 2}, Case{"ddp", DType::kFloat32, 3},
                      Case{"zero1", DType::kFloat32, 1}, Case{"zero1", DType::kFloat32, 2},
                      Case{"zero1", DType::kFloat32, 3}, Case{"zero2", DType::kFloat32, 1},
                      Case{"zero2", DType::kFloat32, 2}, Case{"zero2", DType::kFloat32, 3},
                      Case{"zero3", DType::kFloat32, 1}, Case{"zero3", DType::kFloat32, 2},
                      Case{"zero3", DType::kFloat32, 3}, Case{"ddp", DType::kBFloat16, 2},
                      Case{"zero1", DType::kBFloat16, 3}, Case{"zero2", DType::kBFloat16, 2},
                      Case{"zero2", DType::kBFloat16, 3}, Case{"zero3", DType::kBFloat16, 1},
                      Case{"zero3", DType::kBFloat16, 3}),
    case_name);

}  // namespace
}  // namespace trident::offload_test
