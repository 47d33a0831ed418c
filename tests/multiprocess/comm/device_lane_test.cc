// The device path's lane between real processes: a rank killed while its peers wait in a device-path call on
// the lane is named by the survivors within seconds (PeerDiedError, led by the call they issued), not at the
// group's deadline. The device is a stand-in: one shared anonymous mapping made before the ranks are forked,
// so it lies at the same address in every rank and a handle is the pointer itself (as CUDA IPC maps a peer's
// allocation); its reduce and copy run on the host. The tests with threads (tests/unit/comm/
// device_staging_test.cc) check the lane's results and order; this one needs processes that can die.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "harness/multiproc.h"
#include "harness/pointer_handles.h"
#include "trident/comm/device_memory.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

constexpr size_t kArenaBytes = 4 << 20;

// The shared arena: its first cache line holds the bump allocator's offset, shared by every rank.
struct SharedArena {
  std::byte* base = nullptr;
  std::atomic<size_t>* used() const { return reinterpret_cast<std::atomic<size_t>*>(base); }
  bool contains(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return base != nullptr && b >= base + 64 && b < base + kArenaBytes;
  }
};
SharedArena g_arena;

DeviceMemory make_shared_device() {
  DeviceMemory m;
  m.name = "shared-stand-in";
  m.contains = [](const void* p) { return g_arena.contains(p); };
  m.to_host = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  m.to_device = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  testing::use_pointer_handles(m);
  m.reduce = [](void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) {
    if (dtype != DType::kFloat32 || op != ReduceOp::kSum) return false;
    if (count == 0) return true;  // the question "can you reduce this?": nothing to do
    std::vector<float> acc(count, 0.0f);
    for (int k = 0; k < nsrc; ++k)
      for (size_t i = 0; i < count; ++i) acc[i] += static_cast<const float*>(srcs[k])[i];
    std::memcpy(dst, acc.data(), count * sizeof(float));
    return true;
  };
  m.copy = [](void* dst, const void* src, size_t bytes) {
    if (dst != src) std::memmove(dst, src, bytes);
  };
  return m;
}
const DeviceMemory kSharedDevice = make_shared_device();

float* device_floats(size_t n) {
  const size_t off = g_arena.used()->fetch_add((n * sizeof(float) + 63) / 64 * 64);
  if (off + n * sizeof(float) > kArenaBytes) throw std::runtime_error("shared stand-in arena exhausted");
  return reinterpret_cast<float*>(g_arena.base + off);
}

class DeviceLaneProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    void* p = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    g_arena.base = static_cast<std::byte*>(p);
    new (g_arena.used()) std::atomic<size_t>(64);
    prev_ = register_device_memory(&kSharedDevice);
  }
  void TearDown() override {
    register_device_memory(prev_);
    munmap(g_arena.base, kArenaBytes);
    g_arena.base = nullptr;
  }
  const DeviceMemory* prev_ = nullptr;
};

TEST_F(DeviceLaneProcesses, AKilledRankIsNamedToPeersWaitingOnTheLane) {
  auto res = testing::run_processes(3, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(60);  // far beyond the check below: the death must be seen, not the deadline
    o.name = "world";
    auto pg = new_process_group(store, rank, size, o);
    const size_t n = 1000;
    float* a = device_floats(n);  // each rank's own buffer in the shared arena
    for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(rank + 1);
    pg->all_reduce(a, n, DType::kFloat32, ReduceOp::kSum);  // the first device-path call starts the lane
    TRIDENT_RANK_CHECK(a[n - 1] == static_cast<float>(size * (size + 1) / 2), "device all_reduce gave {}", a[n - 1]);
    pg->barrier();
    if (rank == 2) raise(SIGKILL);  // before issuing the next call: its peers wait for it on the lane
    const auto start = std::chrono::steady_clock::now();
    auto w = pg->all_reduce_async(a, n, DType::kFloat32, ReduceOp::kSum);
    try {
      w->wait();
      testing::rank_fail("the device-path call finished without the killed rank");
    } catch (const PeerDiedError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string what = e.what();
      TRIDENT_RANK_CHECK(s < 20, "the killed rank was named only after {:.1f} s", s);
      TRIDENT_RANK_CHECK(e.peer == 2, "PeerDiedError::peer is {}, not the killed rank 2: {}", e.peer, what);
      TRIDENT_RANK_CHECK(what.find("all_reduce(count=1000, float32, sum) on the device path of group 'world'") !=
                             std::string::npos,
                         "the error does not lead with the call issued: {}", what);
    }
  }, testing::RunOptions{.deadline_s = 90, .env = {}});
  ASSERT_EQ(res.size(), 3u);
  EXPECT_TRUE(res[0].ok) << testing::failures(res);
  EXPECT_TRUE(res[1].ok) << testing::failures(res);
  EXPECT_EQ(res[2].signal, SIGKILL);
}

}  // namespace
}  // namespace trident
