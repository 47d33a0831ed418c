// Checkpoint round trip with resharding: ZeRO-3 at 2 ranks trains 5 steps and saves through the trainer's
// checkpoint path (gather_optimizer_state materialises the full parameters and moments on every rank,
// rank 0 writes them with train::save_checkpoint); the checkpoint then loads at another world size and
// stage (zero1 at 3 ranks, zero3 at 4, zero2 at 4) and in a single process, and each continues for 5 steps
// on the same global batch. Every continuation must reproduce the uninterrupted single-process run (loss
// sequence and final parameters, 1e-4 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "harness/multiproc.h"
#include "harness/synthetic_data.h"
#include "harness/temp_dir.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/nn/flat_model.h"
#include "trident/nn/models.h"
#include "trident/optim/adamw.h"
#include "trident/optim/schedule.h"
#include "trident/parallel/data_parallel.h"
#include "trident/train/checkpoint.h"

namespace trident::zero_checkpoint_test {
namespace {

constexpr int kRows = 12, kT = 8, kVocab = 17, kSave = 5, kSteps = 10;

nlohmann::json gpt() {
  return {{"kind", "gpt"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"block_size", kT},
          {"vocab_size", kVocab}, {"bias", false}, {"seed", 3}};
}

void batch_rows(int step, int first_row, int rows, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  trident::testing::token_windows(step, first_row, rows, kT, kVocab, x, y, 9);
}

optim::AdamWConfig adamw_config() { return {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}; }

struct Ref {
  std::vector<double> losses;
  std::vector<float> params;
};

// One process, steps [first, kSteps), from a fresh model or from a checkpoint.
Ref single_process(const std::string& ckpt_dir) {
  std::unique_ptr<nn::Model> model;
  Ref out;
  int first = 0;
  std::unique_ptr<optim::AdamW> opt;
  if (ckpt_dir.empty()) {
    model = nn::make_model(gpt());
    opt = std::make_unique<optim::AdamW>(*model, adamw_config());
  } else {
    auto ck = train::load_checkpoint(ckpt_dir, true);
    model = nn::make_model(ck.meta.model_config);
    train::load_weights(*model, ck.weights, ck.dir);
    opt = std::make_unique<optim::AdamW>(*model, adamw_config());
    std::vector<float> m, v;
    train::load_optimizer_moments(*model, ck.optimizer, m, v, ck.dir);
    opt->load_state(m, v, ck.meta.optimizer_step);
    first = static_cast<int>(ck.meta.step);
  }
  std::vector<int32_t> x, y;
  for (int s = first; s < kSteps; ++s) {
    model->zero_grad();
    batch_rows(s, 0, kRows, &x, &y);
    out.losses.push_back(model->forward_backward(x.data(), y.data(), kRows, kT, true));
    optim::clip_grad_norm(model->grad_data(), model->num_params(), 1.0f);
    opt->step(1e-2f);
  }
  out.params.assign(model->param_data(), model->param_data() + model->num_params());
  return out;
}

// One data-parallel step of global step s on rows [first_row, first_row + rows) (clipping at 1, lr 1e-2);
// returns the loss averaged over the ranks.
double dp_step(nn::Model& model, parallel::DataParallel& dp, ProcessGroup& pg, int s, int first_row, int rows,
               std::vector<int32_t>* x, std::vector<int32_t>* y) {
  model.zero_grad();
  batch_rows(s, first_row, rows, x, y);
  double loss = model.forward_backward(x->data(), y->data(), rows, kT, true);
  dp.finish_gradient_sync();
  dp.clip_grad_norm(1.0f);
  dp.step(1e-2f);
  pg.all_reduce(&loss, 1, DType::kFloat64, ReduceOp::kAvg);
  return loss;
}

// Largest difference relative to each tensor's RMS (so near-zero elements are judged by their tensor).
double max_rel_diff(const nn::Model& model, const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (const auto& p : model.parameters()) {
    double ss = 0;
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) ss += double(b[i]) * b[i];
    const double scale = std::max(1e-6, std::sqrt(ss / p.numel));
    for (size_t i = p.offset; i < p.offset + p.numel; ++i)
      worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(scale, std::abs(double(b[i]))));
  }
  return worst;
}

// Ranks train steps [first, last) with `strategy`, from a fresh model (ckpt "") or a checkpoint; with
// save_dir, save at `last` through the checkpoint path. Rank 0 checks losses and final parameters.
void run_ranks(const std::string& strategy, int world, const std::string& ckpt, int first, int last,
               const std::string& save_dir, const Ref& ref, int continue_to = 0) {
  auto res = testing::run_processes(
      world,
      [&](int rank, int size, std::shared_ptr<Store> store) {
        GroupOptions go;
        go.timeout = Seconds(120);
        auto pg = new_process_group(store, rank, size, go);
        std::unique_ptr<nn::Model> model;
        std::vector<float> m, v;
        int64_t opt_step = 0;
        if (ckpt.empty()) {
          model = nn::make_model(gpt());
        } else {
          auto ck = train::load_checkpoint(ckpt, true);
          model = nn::make_model(ck.meta.model_config);
          train::load_weights(*model, ck.weights, ck.dir);
          train::load_optimizer_moments(*model, ck.optimizer, m, v, ck.dir);
          opt_step = ck.meta.optimizer_step;
          TRIDENT_RANK_CHECK(ck.meta.step == first, "checkpoint step {} want {}", ck.meta.step, first);
        }
        parallel::DataParallelOptions o;
        o.strategy = parallel::parse_strategy(strategy);
        o.bucket_bytes = 2048;
        o.adamw = adamw_config();
        parallel::DataParallel dp(*model, pg, o);
        dp.broadcast_parameters();
        if (!ckpt.empty()) dp.load_optimizer_state(m, v, opt_step);
        const int per = kRows / size;
        std::vector<int32_t> x, y;
        for (int s = first; s < last; ++s) {
          const double loss = dp_step(*model, dp, *pg, s, rank * per, per, &x, &y);
          const double want = ref.losses[s];
          TRIDENT_RANK_CHECK(std::abs(loss - want) <= 1e-4 * std::abs(want), "{} N={} step {}: loss {} want {}",
                             strategy, size, s, loss, want);
        }
        // The trainer's before_save path: every rank gathers; rank 0 writes.
        std::vector<float> gm, gv;
        int64_t gstep = 0;
        dp.gather_optimizer_state(&gm, &gv, &gstep);
        TRIDENT_RANK_CHECK(gstep == opt_step + (last - first), "optimizer step {} want {}", gstep,
                           opt_step + (last - first));
        std::vector<float> params(model->param_data(), model->param_data() + model->num_params());
        if (last == kSteps) {
          const double d = max_rel_diff(*model, params, ref.params);
          TRIDENT_RANK_CHECK(d < 1e-4, "{} N={}: final parameters differ by {} (relative)", strategy, size, d);
        }
        if (!save_dir.empty() && rank == 0) {
          train::CheckpointMeta meta;
          meta.step = last;
          meta.model_config = model->config();
          meta.optimizer_step = gstep;
          meta.has_optimizer = true;
          train::save_checkpoint(save_dir, *model, meta, train::OptimizerState{&gm, &gv});
        }
        // Training goes on after a save, as in the trainer: zero3 starts from materialised parameters (the
        // forward gathers nothing, the backward goes back to shards) and must stay on the reference run.
        for (int s = last; s < continue_to; ++s) {
          const double loss = dp_step(*model, dp, *pg, s, rank * per, per, &x, &y);
          TRIDENT_RANK_CHECK(std::abs(loss - ref.losses[s]) <= 1e-4 * std::abs(ref.losses[s]),
                             "{} N={} step {} after the save: loss {} want {}", strategy, size, s, loss, ref.losses[s]);
        }
        if (continue_to == kSteps) {
          dp.gather_full_parameters();
          std::vector<float> fin(model->param_data(), model->param_data() + model->num_params());
          const double d = max_rel_diff(*model, fin, ref.params);
          TRIDENT_RANK_CHECK(d < 1e-4, "{} N={}: final parameters after the save differ by {}", strategy, size, d);
        }
      },
      {.deadline_s = 240, .env = {}});
  ASSERT_EQ(testing::failures(res), "") << strategy << " at " << world << " ranks";
}

TEST(ZeroCheckpoint, Zero3SavesAndLoadsAtOtherWorldSizesStagesAndInOneProcess) {
  testing::TempDir tmp("zero-ckpt");
  const Ref ref = single_process("");
  const std::string out = (tmp.path / "ckpt").string();
  run_ranks("zero3", 2, "", 0, kSave, out, ref, kSteps);
  const std::string dir = train::find_checkpoint(out);
  ASSERT_FALSE(dir.empty());
  // The saved model is the whole model (not a shard): its weights equal the reference after kSave steps.
  {
    auto ck = train::load_checkpoint(dir, true);
    EXPECT_EQ(ck.meta.step, kSave);
    EXPECT_EQ(ck.meta.optimizer_step, kSave);
  }
  // In one process, from the checkpoint: the rest of the reference run.
  const Ref cont = single_process(dir);
  ASSERT_EQ(cont.losses.size(), static_cast<size_t>(kSteps - kSave));
  for (int s = kSave; s < kSteps; ++s)
    EXPECT_NEAR(cont.losses[s - kSave], ref.losses[s], 1e-4 * std::abs(ref.losses[s])) << "step " << s;
  auto model = nn::make_model(gpt());
  EXPECT_LT(max_rel_diff(*model, cont.params, ref.params), 1e-4);
  // At other world sizes and stages.
  run_ranks("zero1", 3, dir, kSave, kSteps, "", ref);
  run_ranks("zero3", 4, dir, kSave, kSteps, "", ref);
  run_ranks("zero2", 4, dir, kSave, kSteps, "", ref);
  run_ranks("zero3", 3, dir, kSave, kSteps, "", ref);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
}

// ZeRO-3 writes checkpoints from its shards, one tensor gathered at a time (DataParallel::read_checkpoint_range
// as the trainer's streamed save): the files equal, byte for byte, those written from the whole gathered
// state; the model's buffer is not materialised for it; and a write that fails part-way (out_dir is a file)
// still runs every read, so the other ranks finish their drain instead of waiting on a collective.
TEST(ZeroCheckpoint, Zero3StreamedSaveEqualsTheGatheredOneAndNeverWaitsOnAFailedWriter) {
  testing::TempDir tmp("zero-stream");
  for (int world : {2, 3}) {
    const std::string streamed = (tmp.path / fmt::format("streamed{}", world)).string();
    const std::string gathered = (tmp.path / fmt::format("gathered{}", world)).string();
    const std::string blocked = (tmp.path / fmt::format("blocked{}", world)).string();
    std::ofstream(blocked) << "a file where out_dir should be a folder\n";
    auto res = testing::run_processes(
        world,
        [&](int rank, int size, std::shared_ptr<Store> store) {
          GroupOptions go;
          go.timeout = Seconds(120);
          auto pg = new_process_group(store, rank, size, go);
          auto model = nn::make_model(gpt(), false);
          parallel::DataParallelOptions o;
          o.strategy = parallel::Strategy::kZero3;
          o.bucket_bytes = 2048;
          o.adamw = adamw_config();
          parallel::DataParallel dp(*model, pg, o);
          dp.broadcast_parameters();
          TRIDENT_RANK_CHECK(dp.streams_checkpoints(), "zero3 float32 on the CPU does not stream checkpoints");
          const int per = kRows / size;
          std::vector<int32_t> x, y;
          for (int s = 0; s < 3; ++s) dp_step(*model, dp, *pg, s, rank * per, per, &x, &y);
          train::CheckpointSnapshot snap;
          snap.meta.step = 3;
          snap.meta.model_config = model->config();
          snap.meta.optimizer_step = dp.optimizer_step();
          snap.meta.has_optimizer = true;
          snap.parameters = model->parameters();
          snap.model_kind = model->kind();
          snap.read_moments = true;
          snap.read = [&](int which, size_t offset, size_t count, float* dst) {
            dp.read_checkpoint_range(which, offset, count, dst);
          };
          const size_t n = model->num_params();
          const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
          const double before = static_cast<double>(nn::resident_bytes(model->param_data(), n * 4));
          if (rank == 0) train::write_checkpoint(streamed, snap);
          else train::drain_checkpoint(snap);
          const double after = static_cast<double>(nn::resident_bytes(model->param_data(), n * 4));
          TRIDENT_RANK_CHECK(after <= before + 2 * page, "the streamed save made {} bytes of the model resident",
                             after - before);
          // A writer that cannot write: it throws, after running the reads, and every rank gets through.
          if (rank == 0) {
            bool threw = false;
            try {
              train::write_checkpoint(blocked, snap);
            } catch (const IoError&) {
              threw = true;
            }
            TRIDENT_RANK_CHECK(threw, "a save into a file instead of a folder did not fail");
          } else {
            train::drain_checkpoint(snap);
          }
          // The same state gathered whole and written as before.
          std::vector<float> m, v;
          int64_t step = 0;
          dp.gather_optimizer_state(&m, &v, &step);
          if (rank == 0) train::save_checkpoint(gathered, *model, snap.meta, train::OptimizerState{&m, &v});
          pg->barrier();
        },
        {.deadline_s = 240, .env = {}});
    ASSERT_EQ(testing::failures(res), "") << "world " << world;
    const std::string a = train::find_checkpoint(streamed), b = train::find_checkpoint(gathered);
    ASSERT_FALSE(a.empty());
    ASSERT_FALSE(b.empty());
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      auto read = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
      };
      const std::string sa = read(a + "/" + f), sb = read(b + "/" + f);
      EXPECT_GT(sa.size(), 1000u) << f;
      EXPECT_TRUE(sa == sb) << f << " differs between the streamed and the gathered save at world " << world;
    }
    EXPECT_EQ(train::load_checkpoint(a, true).meta.optimizer_step, 3);
  }
}

}  // namespace
}  // namespace trident::zero_checkpoint_test
