// The test double enforces the AlgoContext contract: these tests show each violation is caught, so a
// clean sweep in algorithms_test.cc means something.
#include <gtest/gtest.h>

#include <cstring>

#include "thread_world.h"

namespace trident::testing {
namespace {

bool mentions(const ThreadWorld::Result& r, const std::string& what) {
  return r.summary().find(what) != std::string::npos;
}

TEST(ThreadWorld, DeliversDataInOrderAndZeroByteMessages) {
  ThreadWorld w(2);
  int got[3] = {0, 0, 0};
  auto res = w.run([&](AlgoContext& ctx) {
    if (ctx.rank() == 0) {
      int a = 11, b = 22;
      ctx.wait({ctx.isend(1, 0, &a, sizeof a), ctx.isend(1, 1, &b, sizeof b), ctx.isend(1, 2, &a, 0)});
    } else {
      ctx.wait({ctx.irecv(0, 0, &got[0], sizeof(int)), ctx.irecv(0, 1, &got[1], sizeof(int)), ctx.irecv(0, 2, &got[2], 0)});
    }
  });
  EXPECT_TRUE(res.ok()) << res.summary();
  EXPECT_EQ(got[0], 11);
  EXPECT_EQ(got[1], 22);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(res.messages, 3u);
}

TEST(ThreadWorld, RecvReduceCombinesIntoDestination) {
  ThreadWorld w(3);
  float acc[2] = {1, 2};
  auto res = w.run([&](AlgoContext& ctx) {
    float mine[2] = {10.f * ctx.rank(), 100.f * ctx.rank()};
    if (ctx.rank() == 0)
      ctx.wait({ctx.irecv_reduce(1, 0, acc, 2, DType::kFloat32, ReduceOp::kSum),
                ctx.irecv_reduce(2, 0, acc, 2, DType::kFloat32, ReduceOp::kSum)});
    else
      ctx.send(0, 0, mine, sizeof mine);
  });
  EXPECT_TRUE(res.ok()) << res.summary();
  EXPECT_EQ(acc[0], 1 + 10 + 20);
  EXPECT_EQ(acc[1], 2 + 100 + 200);
}

TEST(ThreadWorld, SizeMismatchFails) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    char buf[8] = {};
    if (ctx.rank() == 0) ctx.send(1, 0, buf, 8);
    else ctx.recv(0, 0, buf, 4);
  });
  EXPECT_TRUE(mentions(res, "size mismatch")) << res.summary();
}

TEST(ThreadWorld, RecvReduceSizeIsCountTimesElementSize) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    double buf[2] = {};
    if (ctx.rank() == 0) ctx.send(1, 0, buf, 16);
    else ctx.wait({ctx.irecv_reduce(0, 0, buf, 2, DType::kFloat32, ReduceOp::kSum)});  // 8 bytes
  });
  EXPECT_TRUE(mentions(res, "size mismatch")) << res.summary();
}

TEST(ThreadWorld, StepMismatchFails) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    int x = 0;
    if (ctx.rank() == 0) ctx.send(1, 5, &x, 4);
    else ctx.recv(0, 6, &x, 4);
  });
  EXPECT_TRUE(mentions(res, "step mismatch")) << res.summary();
}

TEST(ThreadWorld, UnreceivedMessageIsALeftover) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    int x = 1;
    if (ctx.rank() == 0) ctx.isend(1, 0, &x, 0);  // never waited, never received
  });
  EXPECT_TRUE(mentions(res, "never received")) << res.summary();
  EXPECT_TRUE(mentions(res, "without waiting")) << res.summary();
}

TEST(ThreadWorld, DeadlockIsReportedWithoutTimeout) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    int x = 0;
    ctx.recv(1 - ctx.rank(), 0, &x, 4);  // both receive first
    ctx.send(1 - ctx.rank(), 0, &x, 4);
  });
  EXPECT_TRUE(mentions(res, "deadlock")) << res.summary();
}

TEST(ThreadWorld, ModifyingAnInFlightSendBufferFails) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    int x = 7;
    if (ctx.rank() == 0) {
      Request r = ctx.isend(1, 0, &x, 4);
      x = 8;
      ctx.wait({r});
    } else {
      ctx.recv(0, 0, &x, 4);
    }
  });
  EXPECT_TRUE(mentions(res, "modified the buffer")) << res.summary();
}

TEST(ThreadWorld, SendingToOneselfFails) {
  ThreadWorld w(2);
  auto res = w.run([&](AlgoContext& ctx) {
    int x = 0;
    if (ctx.rank() == 0) ctx.send(0, 0, &x, 4);
  });
  EXPECT_TRUE(mentions(res, "sending to oneself")) << res.summary();
}

TEST(ThreadWorld, ExceptionsFromARankAreReported) {
  ThreadWorld w(3);
  auto res = w.run([&](AlgoContext& ctx) {
    if (ctx.rank() == 2) throw std::runtime_error("boom");
    int x = 0;
    ctx.recv(2, 0, &x, 4);  // would wait forever; the failure wakes it
  });
  EXPECT_TRUE(mentions(res, "rank 2 threw: boom")) << res.summary();
}

TEST(ThreadWorld, ScratchIsAlignedAndDistinctPerSlot) {
  ThreadWorld w(1);
  auto res = w.run([&](AlgoContext& ctx) {
    void* a = ctx.scratch(100, 0);
    void* b = ctx.scratch(100, 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
    EXPECT_NE(a, b);
    std::memset(a, 0, 100);
    std::memset(b, 1, 100);
  });
  EXPECT_TRUE(res.ok()) << res.summary();
}

TEST(ThreadWorld, AskingForOneScratchSlotTwiceFails) {
  ThreadWorld w(1);
  auto res = w.run([&](AlgoContext& ctx) {
    ctx.scratch(8, 0);
    ctx.scratch(16, 0);
  });
  EXPECT_TRUE(mentions(res, "scratch slot 0 twice")) << res.summary();
}

}  // namespace
}  // namespace trident::testing
