// Device buffers on a backend whose transports read host memory (comm/device_memory.h): ProcessGroup
// stages them through host memory around every collective, sync and async, or, where the device lets ranks
// of one host map each other's memory, runs all_reduce, reduce_scatter, all_gather and broadcast on the
// device itself (the device path). The device here is a stand-in whose memory holds every byte XOR 0xA5: a
// backend that read or wrote it directly would compute garbage, so a correct result proves that the call
// ran on the host copies (or in the stand-in's own reduce and copy), and that results were in place before
// the call (or its Work) completed. Ranks run as threads over the native backend at world sizes 1, 2, 3 and
// 5, with counts 0, 1, 7 and 13; expected values come from the rank formula, not from another collective.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "harness/multiproc.h"
#include "harness/pointer_handles.h"
#include "trident/comm/device_memory.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

constexpr size_t kArenaBytes = 8 << 20;
constexpr std::byte kMask{0xA5};

// Ranks are threads here, and the barriers between the device path's phases run over shared memory that each
// rank maps at an address of its own, where ThreadSanitizer cannot see them order anything; yet the device
// path's ranks read each other's arena memory directly. So the stand-in orders its own accesses, as a real
// device's synchronize does: each is bracketed by read-modify-writes of one counter, and an access that
// follows another in time (after the barrier) follows it in ThreadSanitizer's happens-before too. An access
// without the barrier would still read wrong bytes, which the value checks catch.
std::atomic<uint64_t> device_order{0};
struct Ordered {
  Ordered() { device_order.fetch_add(1, std::memory_order_acq_rel); }
  ~Ordered() { device_order.fetch_add(1, std::memory_order_acq_rel); }
  Ordered(const Ordered&) = delete;
  Ordered& operator=(const Ordered&) = delete;
};

// The stand-in device: one arena, handed out by a bump allocator; contents stored XOR kMask.
struct FakeDevice {
  static std::byte* arena() {
    static std::vector<std::byte> a(kArenaBytes);
    return a.data();
  }
  static inline std::atomic<size_t> used{0};
  static inline std::atomic<int> to_host_calls{0}, to_device_calls{0};

  static void* alloc(size_t bytes) {
    const size_t off = used.fetch_add((bytes + 63) / 64 * 64 + 64);
    if (off + bytes > kArenaBytes) throw std::runtime_error("fake device arena exhausted");
    return arena() + off;
  }
  static bool contains(const void* p) {
    auto* b = static_cast<const std::byte*>(p);
    return b >= arena() && b < arena() + kArenaBytes;
  }
  static void code(void* dst, const void* src, size_t bytes) {
    const Ordered ordered;
    auto* d = static_cast<std::byte*>(dst);
    auto* s = static_cast<const std::byte*>(src);
    for (size_t i = 0; i < bytes; ++i) d[i] = s[i] ^ kMask;
  }
  static void to_host(void* dst, const void* src, size_t bytes) {
    if (!contains(src) || contains(dst)) throw std::runtime_error("to_host: not device -> host");
    ++to_host_calls;
    code(dst, src, bytes);
  }
  static void to_device(void* dst, const void* src, size_t bytes) {
    if (!contains(dst) || contains(src)) throw std::runtime_error("to_device: not host -> device");
    ++to_device_calls;
    code(dst, src, bytes);
  }
};

const DeviceMemory kFake{"fake", FakeDevice::contains, FakeDevice::to_host, FakeDevice::to_device};

// The stand-in with a device path: threads share an address space, so a handle is the pointer itself; the
// reduce decodes int32 sources and encodes the sum or maximum, the copy moves encoded bytes as they are.
// A rank whose `refuse_export` is set cannot share its memory: every rank must then stage.
thread_local bool refuse_export = false;
std::atomic<int> reduce_calls{0}, copy_calls{0};
DeviceMemory make_fake_ipc() {
  DeviceMemory m = kFake;
  m.name = "fake-ipc";
  testing::use_pointer_handles(m, [] { return refuse_export; });
  m.reduce = [](void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) {
    if (dtype != DType::kInt32 || (op != ReduceOp::kSum && op != ReduceOp::kMax)) return false;
    if (count == 0) return true;
    ++reduce_calls;
    std::vector<int32_t> acc(count), x(count);
    FakeDevice::code(acc.data(), srcs[0], count * 4);
    for (int k = 1; k < nsrc; ++k) {
      FakeDevice::code(x.data(), srcs[k], count * 4);
      for (size_t i = 0; i < count; ++i) acc[i] = op == ReduceOp::kSum ? acc[i] + x[i] : std::max(acc[i], x[i]);
    }
    FakeDevice::code(dst, acc.data(), count * 4);
    return true;
  };
  m.copy = [](void* dst, const void* src, size_t bytes) {
    ++copy_calls;
    const Ordered ordered;
    if (dst != src) std::memmove(dst, src, bytes);
  };
  return m;
}
const DeviceMemory kFakeIpc = make_fake_ipc();

// Installs the stand-in for one test and restores what was registered before (the CUDA memory, in a build
// whose test binary links it).
class DeviceStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    prev_ = register_device_memory(&kFake);
    FakeDevice::used = 0;
    FakeDevice::to_host_calls = 0;
    FakeDevice::to_device_calls = 0;
  }
  void TearDown() override { register_device_memory(prev_); }
  const DeviceMemory* prev_ = nullptr;
};

// A device array of n int32 on the stand-in.
struct DevInts {
  explicit DevInts(size_t n) : n(n), p(static_cast<int32_t*>(FakeDevice::alloc(std::max<size_t>(n, 1) * 4))) {}
  void set(const std::vector<int32_t>& v) { FakeDevice::code(p, v.data(), v.size() * 4); }
  std::vector<int32_t> get() const {
    std::vector<int32_t> v(n);
    FakeDevice::code(v.data(), p, n * 4);
    return v;
  }
  size_t n;
  int32_t* p;
};

int32_t value(int rank, size_t i) { return rank * 1000 + static_cast<int32_t>(i) + 1; }
std::vector<int32_t> values(int rank, size_t n, size_t base = 0) {
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, base + i);
  return v;
}

#define CHECK_VEC(got, want, what) \
  TRIDENT_RANK_CHECK((got) == (want), "{}: rank {} count {} {}", what, rank, n, async ? "async" : "sync")

// Every collective once, each buffer on the device (and one call mixing host and device buffers).
void sweep(ProcessGroup& pg, size_t n, bool async) {
  const int rank = pg.rank(), W = pg.size();
  const size_t Wn = n * static_cast<size_t>(W);
  auto run = [&](auto&& sync_call, auto&& async_call) {
    if (async) async_call()->wait();
    else sync_call();
  };
  const DType i32 = DType::kInt32;
  std::vector<int32_t> sum(n, 0);
  for (int r = 0; r < W; ++r)
    for (size_t i = 0; i < n; ++i) sum[i] += value(r, i);

  {  // all_reduce in place
    DevInts b(n);
    b.set(values(rank, n));
    run([&] { pg.all_reduce(b.p, n, i32, ReduceOp::kSum); },
        [&] { return pg.all_reduce_async(b.p, n, i32, ReduceOp::kSum); });
    CHECK_VEC(b.get(), sum, "all_reduce in place");
  }
  {  // all_reduce from host memory into device memory
    std::vector<int32_t> send = values(rank, n);
    DevInts recv(n);
    run([&] { pg.all_reduce(send.data(), recv.p, n, i32, ReduceOp::kSum); },
        [&] { return pg.all_reduce_async(send.data(), recv.p, n, i32, ReduceOp::kSum); });
    CHECK_VEC(recv.get(), sum, "all_reduce host -> device");
    CHECK_VEC(send, values(rank, n), "all_reduce's host send buffer");
  }
  {  // broadcast from the last rank
    DevInts b(n);
    b.set(values(rank, n));
    run([&] { pg.broadcast(b.p, n, i32, W - 1); }, [&] { return pg.broadcast_async(b.p, n, i32, W - 1); });
    CHECK_VEC(b.get(), values(W - 1, n), "broadcast");
  }
  {  // reduce to rank 0
    DevInts send(n), recv(n);
    send.set(values(rank, n));
    run([&] { pg.reduce(send.p, recv.p, n, i32, ReduceOp::kSum, 0); },
        [&] { return pg.reduce_async(send.p, recv.p, n, i32, ReduceOp::kSum, 0); });
    if (rank == 0) CHECK_VEC(recv.get(), sum, "reduce");
  }
  std::vector<int32_t> every;  // every rank's values(r, n), rank order
  for (int r = 0; r < W; ++r) {
    auto v = values(r, n);
    every.insert(every.end(), v.begin(), v.end());
  }
  {  // all_gather
    DevInts send(n), recv(Wn);
    send.set(values(rank, n));
    run([&] { pg.all_gather(send.p, recv.p, n, i32); }, [&] { return pg.all_gather_async(send.p, recv.p, n, i32); });
    CHECK_VEC(recv.get(), every, "all_gather");
  }
  {  // gather to rank 0 (the others pass no receive buffer), then scatter it back
    DevInts send(n), all(Wn), back(n);
    send.set(values(rank, n));
    int32_t* recv = rank == 0 ? all.p : nullptr;
    run([&] { pg.gather(send.p, recv, n, i32, 0); }, [&] { return pg.gather_async(send.p, recv, n, i32, 0); });
    if (rank == 0) CHECK_VEC(all.get(), every, "gather");
    const int32_t* from = rank == 0 ? all.p : nullptr;
    run([&] { pg.scatter(from, back.p, n, i32, 0); }, [&] { return pg.scatter_async(from, back.p, n, i32, 0); });
    CHECK_VEC(back.get(), values(rank, n), "scatter");
  }
  {  // reduce_scatter: block r of every rank's W x n values, summed, lands on rank r
    DevInts send(Wn), recv(n);
    send.set(values(rank, Wn));
    run([&] { pg.reduce_scatter(send.p, recv.p, n, i32, ReduceOp::kSum); },
        [&] { return pg.reduce_scatter_async(send.p, recv.p, n, i32, ReduceOp::kSum); });
    std::vector<int32_t> want(n, 0);
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < n; ++i) want[i] += value(r, static_cast<size_t>(rank) * n + i);
    CHECK_VEC(recv.get(), want, "reduce_scatter");
  }
  {  // all_to_all: block s of rank r goes to rank s
    DevInts send(Wn), recv(Wn);
    send.set(values(rank, Wn));
    run([&] { pg.all_to_all(send.p, recv.p, n, i32); }, [&] { return pg.all_to_all_async(send.p, recv.p, n, i32); });
    std::vector<int32_t> want;
    for (int r = 0; r < W; ++r) {
      auto v = values(r, n, static_cast<size_t>(rank) * n);
      want.insert(want.end(), v.begin(), v.end());
    }
    CHECK_VEC(recv.get(), want, "all_to_all");
  }
  {  // all_gatherv: rank r contributes r + n values
    std::vector<size_t> counts(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r) counts[static_cast<size_t>(r)] = static_cast<size_t>(r) + n;
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    DevInts send(counts[static_cast<size_t>(rank)]), recv(total);
    send.set(values(rank, send.n));
    const int32_t* from = send.n == 0 ? nullptr : send.p;  // a rank contributing nothing may pass no buffer
    run([&] { pg.all_gatherv(from, recv.p, counts, i32); },
        [&] { return pg.all_gatherv_async(from, recv.p, counts, i32); });
    std::vector<int32_t> want;
    for (int r = 0; r < W; ++r) {
      auto v = values(r, counts[static_cast<size_t>(r)]);
      want.insert(want.end(), v.begin(), v.end());
    }
    TRIDENT_RANK_CHECK(recv.get() == want, "all_gatherv: rank {} count {}", rank, n);
  }
  if (W > 1) {  // a ring of sends: rank r sends to r + 1 and receives from r - 1
    DevInts send(n), recv(n);
    send.set(values(rank, n));
    const int to = (rank + 1) % W, from = (rank + W - 1) % W;
    auto r = pg.recv_async(recv.p, n, i32, from, 3);
    if (async) pg.send_async(send.p, n, i32, to, 3)->wait();
    else pg.send(send.p, n, i32, to, 3);
    r->wait();
    CHECK_VEC(recv.get(), values(from, n), "send/recv");
  }
}

class DeviceStagingWorlds : public DeviceStaging, public ::testing::WithParamInterface<int> {};

TEST_P(DeviceStagingWorlds, EveryCollectiveSyncAndAsync) {
  const int world = GetParam();
  auto res = testing::run_threads(world, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(120);
    o.name = "staging";
    auto pg = new_process_group(store, rank, size, o);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{13}})
      for (bool async : {false, true}) sweep(*pg, n, async);
  });
  EXPECT_EQ(testing::failures(res), "");
  // Count 0 copies nothing; every other call copied in and out.
  EXPECT_GT(FakeDevice::to_host_calls.load(), 0);
  EXPECT_GT(FakeDevice::to_device_calls.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceStagingWorlds, ::testing::Values(1, 2, 3, 5));

// The device path: all_reduce, reduce_scatter, all_gather and broadcast run in the device's own reduce and
// copy (no host copies of theirs); the other collectives still stage. With one rank unable to share its
// memory, every rank stages (the handshake decides for all), and the results are the same.
class DevicePathWorlds : public DeviceStaging, public ::testing::WithParamInterface<int> {};

TEST_P(DevicePathWorlds, EveryCollectiveWithAndWithoutTheDevicePath) {
  const int world = GetParam();
  register_device_memory(&kFakeIpc);
  for (int refusing : {-1, world - 1}) {
    reduce_calls = 0;
    copy_calls = 0;
    auto res = testing::run_threads(world, [refusing](int rank, int size, std::shared_ptr<Store> store) {
      refuse_export = rank == refusing;
      GroupOptions o;
      o.timeout = Seconds(120);
      o.name = "device_path";
      auto pg = new_process_group(store, rank, size, o);
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{13}})
        for (bool async : {false, true}) sweep(*pg, n, async);
    });
    EXPECT_EQ(testing::failures(res), "") << "refusing rank " << refusing;
    if (world > 1 && refusing < 0) {
      EXPECT_GT(reduce_calls.load(), 0) << "the device path never reduced";
      EXPECT_GT(copy_calls.load(), 0) << "the device path never copied";
    } else {
      EXPECT_EQ(reduce_calls.load(), 0) << "world " << world << ", refusing rank " << refusing;
      EXPECT_EQ(copy_calls.load(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, DevicePathWorlds, ::testing::Values(1, 2, 3, 5));

// After a group's first device-path call, its device-path calls run on a lane of their own: an async one
// returns before its peers have even issued it, the group's host collectives run meanwhile, and device-path
// calls still run in the order each rank issued them (sync ones included). Rank 0 issues two device calls
// and then a host one; its peers wait until rank 0's calls have returned, then issue the host call first. A
// device path that blocked its caller would leave rank 0 waiting for peers that wait for it.
class DeviceLaneWorlds : public DeviceStaging, public ::testing::WithParamInterface<int> {};

TEST_P(DeviceLaneWorlds, AsyncCallsReturnAtOnceAndKeepTheirOrder) {
  const int world = GetParam();
  register_device_memory(&kFakeIpc);
  reduce_calls = 0;
  auto res = testing::run_threads(world, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(60);
    o.name = "lane";
    auto pg = new_process_group(store, rank, size, o);
    const DType i32 = DType::kInt32;
    const bool async = true;
    for (size_t n : {size_t{1}, size_t{7}, size_t{13}}) {
      std::vector<int32_t> sum(n, 0), max(n, 0);
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < n; ++i) {
          sum[i] += value(r, i);
          max[i] = std::max(max[i], value(r + 7, i));
        }
      DevInts first(n), a(n), b(n), c(n);
      first.set(values(rank, n));
      a.set(values(rank, n));
      b.set(values(rank + 7, n));
      c.set(values(rank, n));
      pg->all_reduce(first.p, n, i32, ReduceOp::kSum);  // the first one starts the lane (on every pass: a no-op)
      CHECK_VEC(first.get(), sum, "first all_reduce");
      std::vector<int32_t> host(n, rank + 1);
      const std::string posted = fmt::format("posted/{}", n);
      std::shared_ptr<Work> wa, wb;
      if (rank == 0) {
        wa = pg->all_reduce_async(a.p, n, i32, ReduceOp::kSum);
        wb = pg->all_reduce_async(b.p, n, i32, ReduceOp::kMax);
        TRIDENT_RANK_CHECK(!wa->completed() && !wb->completed(), "a device call finished before its peers issued it");
        store->set_string(posted, "1");
        pg->all_reduce(host.data(), n, i32, ReduceOp::kSum);
      } else {
        store->get_string(posted, Seconds(60));
        pg->all_reduce(host.data(), n, i32, ReduceOp::kSum);
        wa = pg->all_reduce_async(a.p, n, i32, ReduceOp::kSum);
        wb = pg->all_reduce_async(b.p, n, i32, ReduceOp::kMax);
      }
      TRIDENT_RANK_CHECK(host == std::vector<int32_t>(n, size * (size + 1) / 2), "host all_reduce beside the lane");
      // Issued after an async call on the same buffer, a blocking broadcast runs after it: every rank ends
      // with rank 0's sum (the broadcast first would leave rank 0's own values summed).
      auto wc = pg->all_reduce_async(c.p, n, i32, ReduceOp::kSum);
      pg->broadcast(c.p, n, i32, 0);
      TRIDENT_RANK_CHECK(wc->completed(), "a blocking device call returned before the async one issued before it");
      wa->wait();
      wb->wait();
      CHECK_VEC(a.get(), sum, "lane all_reduce sum");
      CHECK_VEC(b.get(), max, "lane all_reduce max");
      CHECK_VEC(c.get(), sum, "lane all_reduce then broadcast");
    }
  });
  EXPECT_EQ(testing::failures(res), "");
  EXPECT_GT(reduce_calls.load(), 0) << "the device path never reduced";
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceLaneWorlds, ::testing::Values(2, 3, 5));

// Ranks that issue different device-path calls are told so in the handshake, before any rank reads a peer's
// buffer with its own idea of the sizes: every rank raises MismatchError naming rank 0's call and the first
// rank whose call differs (all_gatherv: whose counts differ). On the group's first device-path call (the
// caller's thread; the group is then aborted) and on the lane (the call's Work fails; the group's host
// collectives go on).
TEST_F(DeviceStaging, MismatchedDeviceCallsAreNamedBeforeAnyRead) {
  register_device_memory(&kFakeIpc);
  for (bool lane : {false, true}) {
    reduce_calls = 0;
    copy_calls = 0;
    auto res = testing::run_threads(3, [lane](int rank, int size, std::shared_ptr<Store> store) {
      GroupOptions o;
      o.timeout = Seconds(60);
      o.name = lane ? "mismatch_lane" : "mismatch_first";
      auto pg = new_process_group(store, rank, size, o);
      const DType i32 = DType::kInt32;
      DevInts a(9), g(40);
      a.set(values(rank, 9));
      if (lane) pg->all_reduce(a.p, 9, i32, ReduceOp::kSum);  // starts the lane
      const size_t n = rank == 2 ? 7 : 9;
      std::string what;
      std::vector<int> named;
      try {
        pg->all_reduce_async(a.p, n, i32, ReduceOp::kSum)->wait();
      } catch (const MismatchError& e) {
        what = e.what();
        named = e.ranks;
      }
      TRIDENT_RANK_CHECK(what.find("all_reduce(count=9, int32, sum)") != std::string::npos &&
                             what.find("all_reduce(count=7, int32, sum)") != std::string::npos &&
                             named == (std::vector<int>{0, 2}),
                         "not a MismatchError naming both calls and ranks 0 and 2: '{}'", what);
      if (!lane) {  // the group is aborted; a new one: all_gatherv whose counts disagree on rank 1
        o.name = "mismatch_gatherv";
        auto pg2 = new_process_group(store, rank, size, o);
        std::vector<size_t> counts = {3, 4, 5};
        if (rank == 1) counts[2] = 6;
        DevInts mine(counts[static_cast<size_t>(rank)]);
        what.clear();
        named.clear();
        try {
          pg2->all_gatherv(mine.p, g.p, counts, i32);
        } catch (const MismatchError& e) {
          what = e.what();
          named = e.ranks;
        }
        TRIDENT_RANK_CHECK(what.find("all_gatherv") != std::string::npos && named == (std::vector<int>{0, 1}),
                           "all_gatherv with rank 1's counts different: not a MismatchError naming ranks 0 and 1: '{}'",
                           what);
        return;
      }
      std::vector<int32_t> host(2, 1);
      pg->all_reduce(host.data(), 2, i32, ReduceOp::kSum);
      TRIDENT_RANK_CHECK(host[1] == size, "host all_reduce after a lane mismatch gave {}", host[1]);
    });
    EXPECT_EQ(testing::failures(res), "") << (lane ? "on the lane" : "first call");
    if (!lane) {
      EXPECT_EQ(reduce_calls.load(), 0) << "a rank reduced despite the mismatch";
      EXPECT_EQ(copy_calls.load(), 0);
    }
  }
}

// A device-path call that fails on the lane fails its Work with an error naming the call and the lane's
// group, and so does every later one; the group's host collectives go on. A peer that never issues the call
// makes it time out (its deadline is the call's); aborting the group fails what the lane still holds.
TEST_F(DeviceStaging, ALaneCallThatFailsNamesItself) {
  register_device_memory(&kFakeIpc);
  auto res = testing::run_threads(2, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(60);
    o.name = "lanefail";
    auto pg = new_process_group(store, rank, size, o);
    const DType i32 = DType::kInt32;
    DevInts a(7), b(7);
    a.set(values(rank, 7));
    pg->all_reduce(a.p, 7, i32, ReduceOp::kSum);  // starts the lane
    if (rank == 0) {
      CallOptions quick;
      quick.timeout = Seconds(1);
      auto w = pg->all_reduce_async(b.p, 7, i32, ReduceOp::kSum, quick);  // rank 1 never issues it
      std::string what;
      try {
        w->wait();
      } catch (const TimeoutError& e) {
        what = e.what();
      }
      TRIDENT_RANK_CHECK(what.find("all_reduce") != std::string::npos &&
                             what.find("lanefail.device-lane") != std::string::npos,
                         "the timeout does not name the call and the lane's group: '{}'", what);
      std::string later;
      try {
        pg->all_reduce(b.p, 7, i32, ReduceOp::kSum);
      } catch (const Error& e) {
        later = e.what();
      }
      TRIDENT_RANK_CHECK(!later.empty(), "a device call after the lane failed did not fail");
    }
    std::vector<int32_t> host(3, 1);
    pg->all_reduce(host.data(), 3, i32, ReduceOp::kSum);  // the group itself is unharmed
    TRIDENT_RANK_CHECK(host[2] == size, "host all_reduce after the lane failed gave {}", host[2]);
  });
  EXPECT_EQ(testing::failures(res), "");

  res = testing::run_threads(2, [](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(60);
    o.name = "laneabort";
    auto pg = new_process_group(store, rank, size, o);
    DevInts a(7);
    a.set(values(rank, 7));
    pg->all_reduce(a.p, 7, DType::kInt32, ReduceOp::kSum);
    std::vector<int32_t> host(1, 1);
    pg->all_reduce(host.data(), 1, DType::kInt32, ReduceOp::kSum);  // both ranks are past the lane's start
    if (rank == 0) {
      auto w = pg->all_reduce_async(a.p, 7, DType::kInt32, ReduceOp::kSum);  // rank 1 never issues it
      pg->abort("stopping the test");
      std::string what;
      try {
        w->wait();
      } catch (const Error& e) {
        what = e.what();
      }
      TRIDENT_RANK_CHECK(what.find("stopping the test") != std::string::npos,
                         "the abort's reason is not the lane call's error: '{}'", what);
    }
  });
  EXPECT_EQ(testing::failures(res), "");
}

TEST_F(DeviceStaging, HostBuffersAreNeverCopied) {
  auto res = testing::run_threads(3, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = new_process_group(store, rank, size, {});
    std::vector<float> v(7, 1.0f + rank);
    pg->all_reduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
    pg->all_reduce_async(v.data(), v.size(), DType::kFloat32, ReduceOp::kMax)->wait();
    TRIDENT_RANK_CHECK(v[6] == 6.0f, "all_reduce gave {}", v[6]);
  });
  EXPECT_EQ(testing::failures(res), "");
  EXPECT_EQ(FakeDevice::to_host_calls.load(), 0);
  EXPECT_EQ(FakeDevice::to_device_calls.load(), 0);
}

// A copy that fails (a device error) fails the call's Work with that error, on every rank where it happens.
const DeviceMemory kBrokenBack{"broken", FakeDevice::contains, FakeDevice::to_host,
                               [](void*, const void*, size_t) { throw std::runtime_error("device copy failed"); }};

TEST_F(DeviceStaging, AFailedCopyBackFailsTheWork) {
  register_device_memory(&kBrokenBack);
  auto res = testing::run_threads(2, [](int rank, int size, std::shared_ptr<Store> store) {
    auto pg = new_process_group(store, rank, size, {});
    DevInts b(5);
    b.set(values(rank, 5));
    auto w = pg->all_reduce_async(b.p, 5, DType::kInt32, ReduceOp::kSum);
    bool threw = false;
    try {
      w->wait();
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "device copy failed";
    }
    TRIDENT_RANK_CHECK(threw, "the async call's Work did not carry the copy's error");
    TRIDENT_RANK_CHECK(w->completed() && w->error() != nullptr, "the Work is not finished with the error");
    threw = false;
    try {
      pg->all_reduce(b.p, 5, DType::kInt32, ReduceOp::kSum);
    } catch (const std::runtime_error&) {
      threw = true;
    }
    TRIDENT_RANK_CHECK(threw, "the blocking call did not throw the copy's error");
  });
  EXPECT_EQ(testing::failures(res), "");
}

}  // namespace
}  // namespace trident
