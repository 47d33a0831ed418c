// Ranks as threads over one HashStore (STYLE.md #10, first tier): the collective sweep without the
// large counts, over shared memory and TCP, in one process — fast, and the target of ThreadSanitizer.
#include <gtest/gtest.h>

#include "harness/collective_sweep.h"
#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/reduce.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

class ThreadRanks : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ThreadRanks, CollectiveSweepSmall) {
  auto [world, transport] = GetParam();
  auto res = testing::run_threads(world, [transport = transport](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = transport;
    go.timeout = Seconds(120);
    go.name = "threads_" + transport;
    auto pg = new_process_group(st, r, n, go);
    testing::run_collective_sweep(*pg, {.all_algorithms = true, .large = false});
  });
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, ThreadRanks,
                         ::testing::Combine(::testing::Values(1, 3, 4), ::testing::Values("shm", "tcp")),
                         [](const auto& info) {
                           return fmt::format("w{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(ProcessGroupArgs, BadArgumentsAreRejectedBeforeAnythingMoves) {
  auto res = testing::run_threads(2, [](int r, int n, std::shared_ptr<Store> st) {
    auto pg = new_process_group(st, r, n, {});
    std::vector<uint8_t> b(16);
    std::vector<float> f(16);
    auto expect_invalid = [&](auto fn, const char* needle) {
      try {
        fn();
      } catch (const InvalidArgument& e) {
        TRIDENT_RANK_CHECK(std::string(e.what()).find(needle) != std::string::npos, "message lacks '{}': {}", needle,
                           e.what());
        return;
      }
      testing::rank_fail(fmt::format("no InvalidArgument for '{}'", needle));
    };
    expect_invalid([&] { pg->all_reduce(b.data(), 16, DType::kUInt8, ReduceOp::kSum); }, "uint8");
    expect_invalid([&] { pg->broadcast(f.data(), 16, DType::kFloat32, 2); }, "root 2");
    expect_invalid([&] { pg->send(f.data(), 16, DType::kFloat32, r); }, "itself");
    expect_invalid([&] { pg->all_reduce(nullptr, 16, DType::kFloat32, ReduceOp::kSum); }, "null");
    // new_group's checks, in the base class for every backend.
    expect_invalid([&] { pg->new_group({0, 0}); }, "twice");
    expect_invalid([&] { pg->new_group({0, 2}); }, "rank 2 is outside");
    expect_invalid([&] { pg->new_group({}); }, "empty");
    CallOptions o;
    o.algo = Algo::kPairwise;
    expect_invalid([&] { pg->all_reduce(f.data(), 16, DType::kFloat32, ReduceOp::kSum, o); }, "not available");
    // Nothing was sent: the group still works.
    std::fill(f.begin(), f.end(), 1.0f);
    pg->all_reduce(f.data(), 16, DType::kFloat32, ReduceOp::kSum);
    TRIDENT_RANK_CHECK(f[3] == 2.0f, "after errors: {}", f[3]);
  });
  EXPECT_EQ(testing::failures(res), "");
}

// Backends are rows of backend_table(): new_process_group finds them by name and names the table's rows
// when the name is unknown; every row says whether it is built.
TEST(Backends, TheTableNamesEveryBackendAndUnknownNamesAreRefused) {
  std::vector<std::string> names;
  for (const auto& b : backend_table()) names.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"native", "mpi", "nccl"}));
  EXPECT_TRUE(backend_table().front().built());
  GroupOptions o;
  o.backend = "gloo";
  try {
    new_process_group(nullptr, 0, 1, o);
    FAIL() << "an unknown backend was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("native, mpi, nccl"), std::string::npos) << e.what();
  }
}

TEST(Reduce, HalfTypesAccumulateInFloat32AndRoundOnce) {
  // bfloat16 keeps 8 significant bits: 1 + 2^-7 is exact, 1 + 2^-9 rounds back to 1 (to nearest even).
  uint16_t a = float_to_bf16(1.0f), b = float_to_bf16(0.0078125f);
  reduce_into(&a, &b, 1, DType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(bf16_to_float(a), 1.0078125f);
  uint16_t c = float_to_bf16(1.0f), d = float_to_bf16(0.001953125f);
  reduce_into(&c, &d, 1, DType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(bf16_to_float(c), 1.0f);
  uint16_t h = float_to_fp16(65504.0f), one = float_to_fp16(1.0f);
  reduce_into(&h, &one, 1, DType::kFloat16, ReduceOp::kMax);
  EXPECT_EQ(fp16_to_float(h), 65504.0f);
  int32_t x[3] = {7, -7, 9}, y[3] = {2, 2, -3};
  reduce_into(x, y, 3, DType::kInt32, ReduceOp::kProd);
  EXPECT_EQ(x[0], 14);
  EXPECT_EQ(x[1], -14);
  EXPECT_EQ(x[2], -27);
  scale_divide(x, 3, DType::kInt32, 4);
  EXPECT_EQ(x[0], 3);   // truncation toward zero
  EXPECT_EQ(x[1], -3);
}

}  // namespace
}  // namespace trident
