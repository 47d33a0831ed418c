// The kernels' own thread pool (kernels/cpu/thread_pool.h) and the kernels split over it: every task runs
// once, errors reach the caller, nested and concurrent callers and fork()ed children work; and at every
// ISA level the machine supports, every kernel (bfloat16 attention's flash kernel included) gives bitwise
// the same result on 1, 2, 3 and 5 threads (odd sizes; task sizes shrunk so small shapes split into many
// tiles and chunks), which also lies within float64 references.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/thread_pool.h"

namespace kc = trident::kernels::cpu;
using ref::Vec;

namespace {

// Threads and the test knob for a scope; restores one thread and whole tasks.
class ThreadsScope {
 public:
  ThreadsScope(int threads, int divisor) {
    kc::set_num_threads(threads);
    kc::detail::set_task_size_divisor(divisor);
  }
  ~ThreadsScope() {
    kc::set_num_threads(1);
    kc::detail::set_task_size_divisor(1);
  }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;
};

class PoolIsaScope {
 public:
  explicit PoolIsaScope(kc::Isa isa) : was_(kc::set_isa(isa)) {}
  ~PoolIsaScope() { kc::set_isa(was_); }
  PoolIsaScope(const PoolIsaScope&) = delete;
  PoolIsaScope& operator=(const PoolIsaScope&) = delete;

 private:
  kc::Isa was_;
};

std::vector<float> rnd(size_t n, uint64_t seed, double scale = 1.0) { return ref::to_float(ref::random_vec(n, seed, scale)); }

double pool_rel_err(const std::vector<float>& got, const Vec& want) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / den;
}

// Every kernel once on fixed inputs (odd sizes); the outputs by name.
struct Output {
  std::string name;
  std::vector<float> v;
};

std::vector<Output> run_all_kernels() {
  std::vector<Output> out;
  // GEMMs: every transpose, beta 0 and 1, float32 and bfloat16; shapes with ones, primes and panel tails.
  const int shapes[][3] = {{1, 7, 13}, {7, 1, 67}, {131, 67, 37}, {13, 197, 71}, {61, 131, 1}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    const auto a = rnd(static_cast<size_t>(M) * K, 1 + M), b = rnd(static_cast<size_t>(K) * N, 2 + N),
               c0 = rnd(static_cast<size_t>(M) * N, 3 + K);
    for (int bf = 0; bf < 2; ++bf)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (int acc = 0; acc < 2; ++acc) {
            const auto A = ref::stored(a, M, K, ta), B = ref::stored(b, K, N, tb);
            std::vector<float> C = c0;
            kc::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, acc ? 1.0f : 0.0f, C.data(), N,
                     bf ? kc::Precision::kBFloat16 : kc::Precision::kFloat32);
            out.push_back({"gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                               (bf ? " bf16" : " f32") + " ta " + std::to_string(ta) + " tb " + std::to_string(tb) +
                               " beta " + std::to_string(acc),
                           C});
          }
  }
  // alpha != 1 goes to OpenBLAS inside the tiles.
  {
    const int M = 67, N = 131, K = 29;
    const auto a = rnd(static_cast<size_t>(M) * K, 4), b = rnd(static_cast<size_t>(K) * N, 5);
    std::vector<float> C = rnd(static_cast<size_t>(M) * N, 6);
    kc::gemm(false, false, M, N, K, 0.5f, a.data(), K, b.data(), N, 0.25f, C.data(), N);
    out.push_back({"gemm alpha 0.5 beta 0.25", C});
  }
  // Linear with bias (forward and backward).
  {
    const int N = 53, C = 37, OC = 131;
    const auto x = rnd(static_cast<size_t>(N) * C, 7), w = rnd(static_cast<size_t>(OC) * C, 8), bias = rnd(OC, 9),
               dy = rnd(static_cast<size_t>(N) * OC, 10);
    std::vector<float> y(static_cast<size_t>(N) * OC), dx(static_cast<size_t>(N) * C, 0.0f),
        dw = rnd(static_cast<size_t>(OC) * C, 11), db = rnd(OC, 12);
    kc::linear_forward(y.data(), x.data(), w.data(), bias.data(), N, C, OC);
    kc::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
    out.push_back({"linear y", y});
    out.push_back({"linear dx", dx});
    out.push_back({"linear dw", dw});
    out.push_back({"linear db", db});
  }
  // Row kernels: LayerNorm, softmax, cross-entropy; elementwise: GELU, add, mul, scale, AdamW.
  {
    const int N = 67, C = 131;
    const auto x = rnd(static_cast<size_t>(N) * C, 13, 2.0), w = rnd(C, 14), bias = rnd(C, 15),
               dy = rnd(static_cast<size_t>(N) * C, 16);
    std::vector<float> y(x.size()), mean(N), rstd(N), dx = rnd(x.size(), 17), dw = rnd(C, 18), db = rnd(C, 19);
    kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
    kc::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                           C);
    out.push_back({"layernorm y", y});
    out.push_back({"layernorm mean", mean});
    out.push_back({"layernorm dx", dx});
    out.push_back({"layernorm dw", dw});
    out.push_back({"layernorm db", db});
    std::vector<float> sm(x.size());
    kc::softmax_forward(sm.data(), x.data(), N, C);
    out.push_back({"softmax", sm});
    std::vector<int32_t> tgt(N);
    for (int r = 0; r < N; ++r) tgt[r] = (r * 37) % C;
    std::vector<float> dl(x.size());
    const double loss = kc::cross_entropy_forward_backward(dl.data(), x.data(), tgt.data(), N, C, 1.0f / N);
    std::vector<float> lbits(2);
    std::memcpy(lbits.data(), &loss, sizeof(loss));
    out.push_back({"cross-entropy loss", lbits});
    out.push_back({"cross-entropy dlogits", dl});
    for (int kind = 0; kind < 2; ++kind) {
      const auto gk = static_cast<kc::GeluKind>(kind);
      std::vector<float> g(x.size()), gg(x.size()), gd(x.size());
      kc::gelu_forward(g.data(), x.data(), x.size(), gk);
      kc::gelu_forward_and_grad(gd.data(), gg.data(), x.data(), x.size(), gk);
      std::vector<float> gb(x.size());
      kc::gelu_backward(gb.data(), x.data(), dy.data(), x.size(), gk);
      out.push_back({"gelu " + std::to_string(kind), g});
      out.push_back({"gelu grad " + std::to_string(kind), gg});
      out.push_back({"gelu backward " + std::to_string(kind), gb});
    }
    std::vector<float> s(x.size()), m(x.size()), acc = dy;
    kc::add(s.data(), x.data(), dy.data(), x.size());
    kc::mul(m.data(), x.data(), dy.data(), x.size());
    kc::add_inplace(acc.data(), x.data(), x.size());
    kc::scale_inplace(acc.data(), 0.3f, x.size());
    out.push_back({"add", s});
    out.push_back({"mul", m});
    out.push_back({"add_inplace, scale", acc});
    std::vector<float> p = x, mo(x.size(), 0.0f), vo(x.size(), 0.0f);
    for (int t = 1; t <= 3; ++t)
      kc::adamw_update(p.data(), dy.data(), mo.data(), vo.data(), p.size(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    out.push_back({"adamw", p});
  }
  // Embeddings and causal attention.
  {
    const int B = 3, T = 13, C = 24, NH = 3, V = 11;
    std::vector<int32_t> tok(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7) % V;
    const auto wte = rnd(static_cast<size_t>(V) * C, 20), wpe = rnd(static_cast<size_t>(T) * C, 21),
               dy = rnd(static_cast<size_t>(B) * T * C, 22);
    std::vector<float> e(static_cast<size_t>(B) * T * C), dwte = rnd(wte.size(), 23), dwpe = rnd(wpe.size(), 24);
    kc::embedding_forward(e.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V);
    kc::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C);
    out.push_back({"embedding", e});
    out.push_back({"embedding dwte", dwte});
    out.push_back({"embedding dwpe", dwpe});
    const auto qkv = rnd(static_cast<size_t>(B) * T * 3 * C, 25, 0.7);
    std::vector<float> o(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size());
    kc::attention_forward(o.data(), lse.data(), qkv.data(), B, T, C, NH);
    kc::attention_backward(dqkv.data(), dy.data(), qkv.data(), o.data(), lse.data(), B, T, C, NH);
    out.push_back({"attention out", o});
    out.push_back({"attention lse", lse});
    out.push_back({"attention dqkv", dqkv});
  }
  // Causal attention in bfloat16: where the level has vdpbf16ps, the flash kernel (forced on, whatever this
  // CPU's rates), over several query tiles per head (T 131: tiles of 64, 64 and 3) and an odd head dim.
  {
    const int B = 2, T = 131, C = 18, NH = 2;
    const bool flash = kc::active_isa() >= kc::Isa::kAvx512Bf16;
    const kc::Bf16Dot was = kc::set_bf16_dot(flash ? kc::Bf16Dot::kOn : kc::bf16_dot_mode());
    const auto qkv = rnd(static_cast<size_t>(B) * T * 3 * C, 26, 0.7), dy = rnd(static_cast<size_t>(B) * T * C, 27);
    std::vector<float> o(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size());
    const auto bf = kc::Precision::kBFloat16;
    kc::attention_forward(o.data(), lse.data(), qkv.data(), B, T, C, NH, bf);
    kc::attention_backward(dqkv.data(), dy.data(), qkv.data(), o.data(), lse.data(), B, T, C, NH, bf);
    kc::set_bf16_dot(was);
    out.push_back({"attention bf16 out", o});
    out.push_back({"attention bf16 lse", lse});
    out.push_back({"attention bf16 dqkv", dqkv});
  }
  return out;
}

bool pool_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(ThreadPool, EveryTaskRunsOnceOnAnyThreadCount) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadsScope scope(threads, 1);
    EXPECT_EQ(kc::num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 13, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      kc::parallel_for(n, [&](int64_t t) { hits[static_cast<size_t>(t)].fetch_add(1); });
      for (int64_t t = 0; t < n; ++t) EXPECT_EQ(hits[static_cast<size_t>(t)].load(), 1) << threads << " " << n << " " << t;
    }
    // Chunks cover [0, n) once, the last one shorter.
    std::vector<std::atomic<int>> hits(101);
    kc::parallel_chunks(101, 7, [&](int64_t b, int64_t c) {
      EXPECT_EQ(b % 7, 0);
      EXPECT_EQ(c, std::min<int64_t>(7, 101 - b));
      for (int64_t i = b; i < b + c; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, TaskErrorReachesTheCallerAfterAllTasks) {
  ThreadsScope scope(3, 1);
  std::atomic<int> ran{0};
  EXPECT_THROW(kc::parallel_for(50,
                                [&](int64_t t) {
                                  ran.fetch_add(1);
                                  if (t == 17) throw std::runtime_error("task 17");
                                }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 50);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  kc::parallel_for(100, [&](int64_t t) { sum.fetch_add(t); });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedAndConcurrentCallersComplete) {
  ThreadsScope scope(2, 1);
  std::atomic<int64_t> sum{0};
  kc::parallel_for(7, [&](int64_t) { kc::parallel_for(11, [&](int64_t t) { sum.fetch_add(t); }); });
  EXPECT_EQ(sum.load(), 7 * 55);
  // Two threads calling at once: one runs on the pool, the other on its own thread; all tasks run.
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int r = 0; r < 300; ++r) kc::parallel_for(9, [&](int64_t t) { total.fetch_add(t + 1); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 300 * 45);
}

TEST(ThreadPool, ForkedChildMakesItsOwnWorkers) {
  ThreadsScope scope(3, 1);
  std::atomic<int> warm{0};
  kc::parallel_for(20, [&](int64_t) { warm.fetch_add(1); });  // the parent's workers exist
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int> n{0};
    kc::parallel_for(40, [&](int64_t) { n.fetch_add(1); });
    _exit(n.load() == 40 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ThreadPool, EveryKernelBitwiseTheSameOnAnyThreadCount) {
  for (int i = 0; i <= static_cast<int>(kc::machine_isa()); ++i) {
    const auto isa = static_cast<kc::Isa>(i);
    PoolIsaScope level(isa);
    for (int divisor : {1, 97}) {
      std::vector<Output> base;
      {
        ThreadsScope scope(1, divisor);
        base = run_all_kernels();
      }
      for (int threads : {2, 3, 5}) {
        ThreadsScope scope(threads, divisor);
        const auto got = run_all_kernels();
        ASSERT_EQ(got.size(), base.size());
        for (size_t k = 0; k < got.size(); ++k)
          EXPECT_TRUE(pool_same_bits(got[k].v, base[k].v))
              << kc::isa_name(isa) << " " << got[k].name << ": " << threads << " threads vs 1, task size / " << divisor;
      }
    }
  }
}

// Many tiles at once, checked against float64: the split itself computes the right thing.
TEST(ThreadPool, SplitKernelsMatchFloat64) {
  for (int i = 0; i <= static_cast<int>(kc::machine_isa()); ++i) {
    const auto isa = static_cast<kc::Isa>(i);
    PoolIsaScope level(isa);
    ThreadsScope scope(3, 97);
    const int M = 131, N = 197, K = 71;
    const auto a = rnd(static_cast<size_t>(M) * K, 30), b = rnd(static_cast<size_t>(K) * N, 31);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const auto A = ref::stored(a, M, K, ta), B = ref::stored(b, K, N, tb);
        std::vector<float> C(static_cast<size_t>(M) * N, 0.0f);
        kc::gemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0f, C.data(), N);
        Vec want(C.size());
        for (int r = 0; r < M; ++r)
          for (int c = 0; c < N; ++c) {
            double s = 0;
            for (int k = 0; k < K; ++k) s += static_cast<double>(a[r * K + k]) * b[k * N + c];
            want[r * N + c] = s;
          }
        EXPECT_LT(pool_rel_err(C, want), 2e-6 * (K / 16 + 1)) << kc::isa_name(isa) << " ta " << ta << " tb " << tb;
      }
    const int B = 3, T = 13, C = 24, NH = 3;
    const Vec qkv = ref::random_vec(static_cast<size_t>(B) * T * 3 * C, 32, 0.7);
    const auto qf = ref::to_float(qkv);
    std::vector<float> o(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T);
    kc::attention_forward(o.data(), lse.data(), qf.data(), B, T, C, NH);
    EXPECT_LT(pool_rel_err(o, ref::attention(qkv, B, T, C, NH)), 1e-5) << kc::isa_name(isa);
    const int R = 67, W = 131;
    const Vec x = ref::random_vec(static_cast<size_t>(R) * W, 33, 2.0), w = ref::random_vec(W, 34),
              bias = ref::random_vec(W, 35);
    const auto xf = ref::to_float(x), wf = ref::to_float(w), bf = ref::to_float(bias);
    std::vector<float> y(xf.size());
    kc::layernorm_forward(y.data(), nullptr, nullptr, xf.data(), wf.data(), bf.data(), R, W);
    EXPECT_LT(pool_rel_err(y, ref::layernorm(x, w, &bias, R, W)), 2e-5) << kc::isa_name(isa);
    std::vector<int32_t> tgt(R);
    for (int r = 0; r < R; ++r) tgt[r] = (r * 13) % W;
    const double loss = kc::cross_entropy_forward_backward(nullptr, xf.data(), tgt.data(), R, W, 1.0f);
    EXPECT_NEAR(loss / R, ref::cross_entropy(x, tgt, R, W), 1e-5) << kc::isa_name(isa);
  }
}
