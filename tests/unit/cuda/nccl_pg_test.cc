// The NCCL backend on one GPU. NCCL refuses two ranks on one device, so the collectives here run at world
// size 1, where every reduction is the identity and a backend that moved nothing would pass: those tests
// are smoke tests (NcclWorldOneSmoke: built, callable on every op, dtype and buffer kind, results in place),
// named so. What the collectives compute across ranks is asserted by the multi-rank NCCL tests
// (multirank_test.cc, CudaNcclTwoGpus: `bench comm --check` of every collective, and every layout against
// one process), which need two GPUs and skip, saying so, on one. Abort and the init deadline are asserted
// here: they do not depend on what a reduction computes.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "cuda_test_util.h"
#include "trident/comm/backends/nccl_pg.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"

#ifdef TRIDENT_HAVE_NCCL

namespace trident {
namespace {

using cuda::DeviceBuffer;

std::shared_ptr<ProcessGroup> world1(const std::string& name = "world") {
  GroupOptions o;
  o.backend = "nccl";
  o.name = name;
  o.timeout = Seconds(60);
  auto store = std::make_shared<HashStore>();
  return new_process_group(store, 0, 1, o);  // through the backend factory
}

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Bitwise equality with the first mismatch, the number of mismatches and the values there.
template <typename T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at " << first
                     << " (got " << +got[first] << ", want " << +want[first] << ")";
}

TEST(NcclWorldOneSmoke, BuiltAndNamed) {
  EXPECT_TRUE(nccl_backend_built());
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  EXPECT_EQ(pg->backend_name(), "nccl");
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
}

TEST(NcclWorldOneSmoke, EveryCollectiveRunsAtWorldOne) {
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1) << 20 | 5}) {
    const auto x = iota_floats(n, 1.0f);
    DeviceBuffer<float> send(n), recv(n);
    send.upload(x);
    // all_reduce out of place and in place: sum, avg, max, min, prod of one rank are the input.
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd}) {
      recv.zero();
      pg->all_reduce(send.data(), recv.data(), n, DType::kFloat32, op);
      expect_same(recv.to_host(), x, fmt::format("all_reduce {} n={}", reduce_op_name(op), n));
    }
    DeviceBuffer<float> buf(n);
    buf.upload(x);
    pg->all_reduce(buf.data(), n, DType::kFloat32, ReduceOp::kSum);
    expect_same(buf.to_host(), x, fmt::format("in-place all_reduce n={}", n));
    pg->broadcast(buf.data(), n, DType::kFloat32, 0);
    expect_same(buf.to_host(), x, fmt::format("broadcast n={}", n));
    recv.zero();
    pg->reduce(send.data(), recv.data(), n, DType::kFloat32, ReduceOp::kSum, 0);
    expect_same(recv.to_host(), x, fmt::format("reduce n={}", n));
    recv.zero();
    pg->all_gather(send.data(), recv.data(), n, DType::kFloat32);
    expect_same(recv.to_host(), x, fmt::format("all_gather n={}", n));
    recv.zero();
    pg->all_gatherv(send.data(), recv.data(), std::vector<size_t>{n}, DType::kFloat32);
    expect_same(recv.to_host(), x, fmt::format("all_gatherv n={}", n));
    recv.zero();
    pg->reduce_scatter(send.data(), recv.data(), n, DType::kFloat32, ReduceOp::kSum);
    expect_same(recv.to_host(), x, fmt::format("reduce_scatter n={}", n));
    recv.zero();
    pg->all_to_all(send.data(), recv.data(), n, DType::kFloat32);
    expect_same(recv.to_host(), x, fmt::format("all_to_all n={}", n));
    recv.zero();
    pg->gather(send.data(), recv.data(), n, DType::kFloat32, 0);
    expect_same(recv.to_host(), x, fmt::format("gather n={}", n));
    recv.zero();
    pg->scatter(send.data(), recv.data(), n, DType::kFloat32, 0);
    expect_same(recv.to_host(), x, fmt::format("scatter n={}", n));
  }
  pg->barrier();
}

TEST(NcclWorldOneSmoke, OtherDtypesAndAsyncWorks) {
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  std::vector<int32_t> xi(1001);
  std::iota(xi.begin(), xi.end(), -500);
  DeviceBuffer<int32_t> di(xi.size());
  di.upload(xi);
  std::vector<uint16_t> xb(513);
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = static_cast<uint16_t>(0x3f80 + i % 64);  // bf16 1.0 .. ~1.5
  DeviceBuffer<uint16_t> db(xb.size());
  db.upload(xb);
  std::vector<double> xd = {1.5, -2.25, 1e300};
  DeviceBuffer<double> dd(xd.size());
  dd.upload(xd);
  // Several async calls in flight; Works complete in issue order and the data are in place after wait().
  std::vector<std::shared_ptr<Work>> works;
  works.push_back(pg->all_reduce_async(di.data(), xi.size(), DType::kInt32, ReduceOp::kSum));
  works.push_back(pg->all_reduce_async(db.data(), xb.size(), DType::kBFloat16, ReduceOp::kMax));
  works.push_back(pg->all_reduce_async(dd.data(), xd.size(), DType::kFloat64, ReduceOp::kSum));
  works.push_back(pg->barrier_async());
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->completed());
  EXPECT_EQ(di.to_host(), xi);
  EXPECT_EQ(db.to_host(), xb);
  EXPECT_EQ(dd.to_host(), xd);
}

// Host buffers reach NCCL through device copies (ProcessGroup's staging, comm/device_memory.h): the
// training loop's host scalars (loss averages, norms, health) run on the same group as the gradients.
TEST(NcclWorldOneSmoke, HostBuffersAreStagedThroughTheDevice) {
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  std::vector<float> host = iota_floats(13, 1.0f);
  const std::vector<float> want = host;  // one rank: the sum is the input
  pg->all_reduce(host.data(), host.size(), DType::kFloat32, ReduceOp::kSum);
  expect_same(host, want, "blocking all_reduce on a host buffer");
  pg->all_reduce_async(host.data(), host.size(), DType::kFloat32, ReduceOp::kMax)->wait();
  expect_same(host, want, "async all_reduce on a host buffer");
  double scalar = 2.5;
  pg->all_reduce(&scalar, 1, DType::kFloat64, ReduceOp::kAvg);
  EXPECT_EQ(scalar, 2.5);
  // Mixed: a host send buffer gathered into device memory.
  DeviceBuffer<float> dev(13);
  pg->all_gather(host.data(), dev.data(), host.size(), DType::kFloat32);
  expect_same(dev.to_host(), want, "all_gather host -> device");
}

TEST(NcclWorldOneSmoke, SubgroupsFromCommSplit) {
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  auto sub = pg->new_group({0}, "solo");
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->global_rank(0), 0);
  auto x = iota_floats(33, 2.0f);
  DeviceBuffer<float> d(x.size());
  d.upload(x);
  sub->all_reduce(d.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(d.to_host(), x);
  auto s = pg->split(5, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->size(), 1);
  s->broadcast(d.data(), x.size(), DType::kFloat32, 0);
  EXPECT_EQ(d.to_host(), x);
  EXPECT_EQ(pg->split(-1, 0), nullptr);
}

TEST(NcclProcessGroup, AbortFailsLaterCallsWithTheReason) {
  TRIDENT_REQUIRE_GPU();
  auto pg = world1();
  DeviceBuffer<float> d(4);
  d.zero();
  pg->abort("test abort reason");
  try {
    pg->all_reduce(d.data(), 4, DType::kFloat32, ReduceOp::kSum);
    FAIL() << "a call on an aborted group succeeded";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("test abort reason"), std::string::npos) << e.what();
  }
}

TEST(NcclProcessGroup, InitTimesOutWhenAPeerNeverJoins) {
  TRIDENT_REQUIRE_GPU();
  // World of 2 where rank 1 never shows up: rank 0's ncclCommInitRankConfig cannot finish; the group's
  // deadline aborts it (ncclCommAbort) and reports a TimeoutError instead of hanging.
  GroupOptions o;
  o.backend = "nccl";
  o.name = "lonely";
  o.timeout = Seconds(3);
  auto store = std::make_shared<HashStore>();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(new_process_group(store, 0, 2, o), TimeoutError);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("init timeout raised after %.2f s (deadline 3 s)\n", s);
}

}  // namespace
}  // namespace trident

#endif  // TRIDENT_HAVE_NCCL
