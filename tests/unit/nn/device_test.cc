// Devices and op tables (kernels/device.h): names, the CPU table against the CPU kernels it wraps, and the
// error when cuda is asked for where it cannot run. The CUDA table itself is checked against the CPU one
// in tests/unit/cuda (GPU only).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "harness/op_table.h"
#include "kernel_test_util.h"
#include "harness/temp_dir.h"
#include "trident/core/error.h"
#include "trident/kernels/device.h"
#include "trident/nn/models.h"

using namespace trident;
using kernels::Device;

using kernel_test::same_bits;

namespace {

std::vector<float> randoms(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}


}  // namespace

TEST(Device, NamesRoundTripAndBadNamesAreRefused) {
  EXPECT_EQ(kernels::parse_device("cpu"), Device::kCpu);
  EXPECT_EQ(kernels::parse_device("cuda"), Device::kCuda);
  EXPECT_STREQ(kernels::device_name(Device::kCpu), "cpu");
  EXPECT_STREQ(kernels::device_name(Device::kCuda), "cuda");
  try {
    kernels::parse_device("gpu");
    ADD_FAILURE() << "'gpu' was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "cpu or cuda");
  }
}

TEST(Device, CpuTableMemoryIsAlignedZeroedAndCopies) {
  const auto& ops = kernels::device_ops(Device::kCpu);
  EXPECT_EQ(ops.device, Device::kCpu);
  EXPECT_TRUE(kernels::device_unavailable_reason(Device::kCpu).empty());
  kernels::DeviceArray<float> a(ops, 1000);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], 0.0f);
  auto src = randoms(1000, 1);
  ops.to_device(a.data(), src.data(), 1000 * sizeof(float));
  kernels::DeviceArray<float> b(ops, 1000);
  ops.copy(b.data(), a.data(), 1000 * sizeof(float));
  std::vector<float> back(1000);
  ops.to_host(back.data(), b.data(), 1000 * sizeof(float));
  EXPECT_TRUE(same_bits(back, src));
  ops.memset_zero(b.data(), 10 * sizeof(float));
  EXPECT_EQ(b.data()[9], 0.0f);
  EXPECT_EQ(b.data()[10], src[10]);
  b.resize(ops, 7);  // reallocates, zero-filled
  EXPECT_EQ(b.size(), 7u);
  EXPECT_EQ(b.data()[0], 0.0f);
  ops.synchronize();
}

// Every entry of the CPU table is set (a designated initializer left out would leave it null).
TEST(Device, CpuTableHasEveryEntry) {
  const auto& ops = kernels::device_ops(Device::kCpu);
  // 7 memory entries, 22 kernels, 7 tensor-parallel steps, 7 Llama kernels, describe, kernel_summary: the check
  // reads every one (a new entry updates this count).
  EXPECT_EQ(trident::testing::op_table_entries(), 46u);
  EXPECT_EQ(trident::testing::null_op_entries(ops), std::vector<size_t>{})
      << "null entries of the CPU op table (0 = alloc, in kernels/device.h's order)";
}

// The table's entries forward every argument to the CPU kernels: the same bits as calling them directly.
TEST(Device, CpuTableGivesTheCpuKernelsBits) {
  namespace kc = kernels::cpu;
  const auto& ops = kernels::device_ops(Device::kCpu);
  const int N = 7, C = 12, OC = 9;
  auto x = randoms(N * C, 2), w = randoms(OC * C, 3), bias = randoms(OC, 4), dy = randoms(N * OC, 5);
  for (auto p : {kc::Precision::kFloat32, kc::Precision::kBFloat16}) {
    std::vector<float> y1(N * OC), y2(N * OC);
    kc::linear_forward(y1.data(), x.data(), w.data(), bias.data(), N, C, OC, p);
    ops.linear_forward(y2.data(), x.data(), w.data(), bias.data(), N, C, OC, p);
    EXPECT_TRUE(same_bits(y1, y2));
    std::vector<float> dx1(N * C, 1.0f), dx2 = dx1, dw1(OC * C, 0.5f), dw2 = dw1, db1(OC, 0.25f), db2 = db1;
    kc::linear_backward(dx1.data(), dw1.data(), db1.data(), dy.data(), x.data(), w.data(), N, C, OC, 1.0f, p);
    ops.linear_backward(dx2.data(), dw2.data(), db2.data(), dy.data(), x.data(), w.data(), N, C, OC, 1.0f, p,
                        nullptr);
    EXPECT_TRUE(same_bits(dx1, dx2) && same_bits(dw1, dw2) && same_bits(db1, db2));
    kc::linear_backward(dx1.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, C, OC, 0.0f, p, x.data());
    ops.linear_backward(dx2.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, C, OC, 0.0f, p, x.data());
    EXPECT_TRUE(same_bits(dx1, dx2));
    std::vector<float> c1(N * OC, 2.0f), c2 = c1;
    kc::gemm(false, true, N, OC, C, 0.5f, x.data(), C, w.data(), C, 1.0f, c1.data(), OC, p);
    ops.gemm(false, true, N, OC, C, 0.5f, x.data(), C, w.data(), C, 1.0f, c2.data(), OC, p);
    EXPECT_TRUE(same_bits(c1, c2));
  }
  std::vector<float> m1(N * C), m2(N * C), r1(N), r2(N), s1(N), s2(N);
  kc::layernorm_forward(m1.data(), r1.data(), s1.data(), x.data(), w.data(), nullptr, N, C);
  ops.layernorm_forward(m2.data(), r2.data(), s2.data(), x.data(), w.data(), nullptr, N, C, 1e-5f);
  EXPECT_TRUE(same_bits(m1, m2) && same_bits(r1, r2) && same_bits(s1, s2));
  EXPECT_EQ(kc::sum_squares(x.data(), x.size()), ops.sum_squares(x.data(), x.size()));
}

// Asking for cuda where it cannot run: a DeviceUnavailable whose reason names what was looked for, from
// the op table and from every model constructor.
TEST(Device, CudaUnavailableIsAClearError) {
  const std::string why = kernels::device_unavailable_reason(Device::kCuda);
  if (why.empty())
    GTEST_SKIP() << "a CUDA device is visible here; the CLI test covers the error with CUDA_VISIBLE_DEVICES=''";
#ifdef TRIDENT_HAVE_CUDA
  EXPECT_CONTAINS(why, "cudaGetDeviceCount");
  EXPECT_CONTAINS(why, "CUDA_VISIBLE_DEVICES");
#else
  EXPECT_CONTAINS(why, "this build of trident has no CUDA: nvcc was not found");
#endif
  try {
    kernels::device_ops(Device::kCuda);
    ADD_FAILURE() << "device_ops(cuda) returned";
  } catch (const kernels::DeviceUnavailable& e) {
    EXPECT_EQ(e.device, Device::kCuda);
    EXPECT_EQ(e.reason, why);
    EXPECT_CONTAINS(e.what(), "device cuda is not available: " + why);
  }
  for (const char* kind : {"gpt", "mlp"}) {
    nlohmann::json j = {{"kind", kind}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 4},
                        {"vocab_size", 5}, {"device", "cuda"}};
    EXPECT_THROW(nn::make_model(j), kernels::DeviceUnavailable) << kind;
  }
}

TEST(Device, ModelConfigTakesDeviceButDoesNotEchoIt) {
  nlohmann::json j = {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"block_size", 4}, {"vocab_size", 5},
                      {"device", "cpu"}};
  auto m = nn::make_model(j);
  EXPECT_EQ(m->device(), Device::kCpu);
  EXPECT_FALSE(m->config().contains("device"));  // checkpoints stay device-independent
  j["device"] = "tpu";
  try {
    nn::make_model(j);
    ADD_FAILURE() << "device tpu was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), "'device' must be one of cpu|cuda");
  }
}

// The tensor-parallel layers' entries of the CPU table: strided copies and adds (a broadcast row with
// ldb 0), the vocab-shard embedding and the three cross-entropy passes, which over one shard holding the
// whole vocabulary give the plain cross-entropy kernel's loss.
TEST(Device, CpuTableTensorParallelEntries) {
  const auto& ops = kernels::device_ops(Device::kCpu);
  const size_t R = 3, C = 7, c0 = 2, w = 4;
  std::vector<float> big = randoms(R * C, 1), small = randoms(R * w, 2), row = randoms(C, 3);
  std::vector<float> out(R * C, 0.0f);
  ops.copy_2d(out.data() + c0, C, small.data(), w, R, w);
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < C; ++c)
      EXPECT_EQ(out[r * C + c], c >= c0 && c < c0 + w ? small[r * w + c - c0] : 0.0f) << r << "," << c;
  std::vector<float> sum(R * C);
  ops.add_2d(sum.data(), C, big.data(), C, row.data(), 0, R, C);
  for (size_t i = 0; i < R * C; ++i) EXPECT_EQ(sum[i], big[i] + row[i % C]);

  const int N = 5, Cm = 3, V = 6;
  const std::vector<int32_t> tokens = {0, 5, 2, 3, 1};
  std::vector<float> wte = randoms(static_cast<size_t>(V) * Cm, 4), emb(N * Cm, -1.0f);
  ops.embedding_shard_forward(emb.data(), tokens.data(), wte.data() + 2 * Cm, 2, 2, V, N, Cm);  // rows 2, 3
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < Cm; ++j)
      EXPECT_EQ(emb[i * Cm + j], tokens[i] == 2 || tokens[i] == 3 ? wte[tokens[i] * Cm + j] : 0.0f);
  const std::vector<int32_t> bad = {0, 6, 1, 1, 1};
  EXPECT_THROW(ops.embedding_shard_forward(emb.data(), bad.data(), wte.data(), 0, V, V, N, Cm), InvalidArgument);

  std::vector<float> logits = randoms(static_cast<size_t>(N) * V, 5), mx(N), st(2 * N);
  std::vector<float> d1(logits.size()), d2(logits.size());
  ops.ce_shard_max(mx.data(), logits.data(), tokens.data(), N, V, V);
  ops.ce_shard_sumexp(st.data(), d1.data(), logits.data(), mx.data(), tokens.data(), N, V, 0);
  const double sharded = ops.ce_shard_finish(d1.data(), st.data(), mx.data(), tokens.data(), N, V, 0, 0.5f);
  const double plain = ops.cross_entropy_forward_backward(d2.data(), logits.data(), tokens.data(), N, V, 0.5f);
  EXPECT_NEAR(sharded, plain, 1e-5 * N);
  for (size_t i = 0; i < d1.size(); ++i) EXPECT_NEAR(d1[i], d2[i], 1e-6) << i;
  EXPECT_THROW(ops.ce_shard_max(mx.data(), logits.data(), bad.data(), N, V, V), InvalidArgument);
}

// An allocation the machine cannot satisfy is a typed OutOfMemory naming the size and the way out, not an
// escaped std::bad_alloc (which aborted `trident train --model llama3-8b` on a small machine). In a child
// whose address space is capped, so the test never takes the memory it asks for.
TEST(Device, AnAllocationTheMachineCannotSatisfyIsOutOfMemory) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit lim{size_t(2) << 30, size_t(2) << 30};
    if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
    const size_t bytes = size_t(8) << 30;
    try {
      void* p = kernels::device_ops(Device::kCpu).alloc(bytes);
      kernels::device_ops(Device::kCpu).free(p);
      ::_exit(1);
    } catch (const OutOfMemory& e) {
      const std::string m = e.what();
      ::_exit(e.bytes == bytes && m.find("cannot allocate 8.59 GB") != std::string::npos &&
                      m.find("trident plan") != std::string::npos
                  ? 0
                  : 2);
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the allocation succeeded; 2: wrong size or message; 3: setrlimit; "
                                       "4: another exception";
}
