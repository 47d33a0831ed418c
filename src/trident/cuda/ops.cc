// Host side of the CUDA kernels: argument checks, cuBLAS calls, stream-ordered scratch, error checks.
#include "trident/cuda/ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "trident/core/env.h"
#include "trident/cuda/check.h"
#include "trident/cuda/cublas_api.h"
#include "trident/cuda/launch.h"
#include "trident/cuda/llama_launch.h"

namespace trident::cuda {

namespace {

// One cuBLAS handle per host thread and device, created on first use and kept until exit (destroying it
// from a thread_local destructor could run after the CUDA context is gone).
cublasHandle_t handle_for(cudaStream_t stream) {
  thread_local std::vector<cublasHandle_t> handles;
  int dev = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&dev));
  if (static_cast<size_t>(dev) >= handles.size()) handles.resize(dev + 1, nullptr);
  if (!handles[dev]) {
    TRIDENT_CUBLAS_CHECK(cublas().create(&handles[dev]));
    // Float32 GEMMs stay float32 (no TF32), as the CPU reference.
    TRIDENT_CUBLAS_CHECK(cublas().set_math_mode(handles[dev], CUBLAS_DEFAULT_MATH));
  }
  TRIDENT_CUBLAS_CHECK(cublas().set_stream(handles[dev], stream));
  return handles[dev];
}

// The device's default memory pool (where cudaMallocAsync draws scratch) keeps what it freed: by default it
// hands unused memory back to the driver at every synchronisation, and training synchronises every step,
// so each step would map its scratch afresh. TRIDENT_CUDA_POOL_RELEASE=1 keeps CUDA's default.
void keep_pool_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (env::param_bool("TRIDENT_CUDA_POOL_RELEASE")) return;
    int dev = 0;
    TRIDENT_CUDA_CHECK(cudaGetDevice(&dev));
    cudaMemPool_t pool = nullptr;
    TRIDENT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = UINT64_MAX;
    TRIDENT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  });
}

// Stream-ordered scratch: allocated on `stream`, freed on it when the owner goes out of scope (the free
// is ordered after every kernel already queued on the stream that uses it).
template <typename T>
class Scratch {
 public:
  Scratch(size_t n, cudaStream_t s) : s_(s) {
    if (n == 0) return;
    keep_pool_memory();
    TRIDENT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), s));
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, s_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t s_;
};

void check_launch(const char* what) {
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    detail::throw_cuda_error(rc, what, __FILE__, __LINE__);
}

void check_dims(const char* op, long a, long b = 0, long c = 0) {
  TRIDENT_CHECK(a >= 0 && b >= 0 && c >= 0, InvalidArgument, "cuda {}: negative size ({}, {}, {})", op, a, b, c);
}

void gemm_ex(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda, const void* B,
             int ldb, float beta, float* C, int ldc, cudaDataType_t in_type, cudaStream_t stream) {
  check_dims("gemm", M, N, K);
  if (M == 0 || N == 0) return;
  // Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: swap the operands.
  cublasHandle_t h = handle_for(stream);
  const cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (in_type == CUDA_R_32F) {
    TRIDENT_CUBLAS_CHECK(cublas().sgemm(h, ob, oa, N, M, K, &alpha, static_cast<const float*>(B), ldb,
                                        static_cast<const float*>(A), lda, &beta, C, ldc));
  } else {
    TRIDENT_CUBLAS_CHECK(cublas().gemm_ex(h, ob, oa, N, M, K, &alpha, B, in_type, ldb, A, in_type, lda, &beta, C,
                                          CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// cuBLASLt's handle for the current device: one per device, shared by every thread and stream (a cuBLASLt
// handle holds no stream and is safe to use from several threads).
cublasLtHandle_t lt_handle() {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles;
  int dev = 0;
  TRIDENT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(dev) >= handles.size()) handles.resize(dev + 1, nullptr);
  if (!handles[dev]) TRIDENT_CUBLAS_CHECK(cublas_lt().create(&handles[dev]));
  return handles[dev];
}

// The largest power of two (at most 256) that divides the address: what cuBLASLt may assume of it.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & (~a + 1)));
}

std::atomic<long> g_bias_epilogue{0}, g_bias_fill{0};

// out[N,OC] = inp[N,C] W[OC,C]^T + bias in one cuBLASLt call: column-major, D[OC,N] = W^T (stored [C,OC])
// times inp (stored [C,N]), the bias (length OC, the rows of D) added in the epilogue. Operands of `type`
// (float32 or bfloat16), float32 accumulation and output. Returns false, having launched nothing, where
// cuBLASLt offers no algorithm for these operands and their alignment.
bool linear_bias_epilogue(float* out, const void* inp, const void* weight, const float* bias, int N, int C, int OC,
                          cudaDataType_t type, cudaStream_t stream) {
  const CublasLtApi& lt = cublas_lt();
  struct Descs {
    const CublasLtApi& lt;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Descs() {
      if (pref) lt.preference_destroy(pref);
      if (d) lt.layout_destroy(d);
      if (b) lt.layout_destroy(b);
      if (a) lt.layout_destroy(a);
      if (op) lt.matmul_desc_destroy(op);
    }
  } ds{lt};
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_create(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type = CUDA_R_32F;
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans));
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_set(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_set(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_set(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  TRIDENT_CUBLAS_CHECK(lt.matmul_desc_set(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  TRIDENT_CUBLAS_CHECK(lt.layout_create(&ds.a, type, C, OC, C));
  TRIDENT_CUBLAS_CHECK(lt.layout_create(&ds.b, type, C, N, C));
  TRIDENT_CUBLAS_CHECK(lt.layout_create(&ds.d, CUDA_R_32F, OC, N, OC));
  TRIDENT_CUBLAS_CHECK(lt.preference_create(&ds.pref));
  const uint64_t workspace = 32u << 20;
  TRIDENT_CUBLAS_CHECK(lt.preference_set(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  const uint32_t al_a = alignment_of(weight), al_b = alignment_of(inp), al_d = alignment_of(out);
  TRIDENT_CUBLAS_CHECK(lt.preference_set(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  TRIDENT_CUBLAS_CHECK(lt.preference_set(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  TRIDENT_CUBLAS_CHECK(lt.preference_set(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
  TRIDENT_CUBLAS_CHECK(lt.preference_set(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  const cublasLtHandle_t h = lt_handle();
  const cublasStatus_t hs = lt.heuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &best, &found);
  if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  TRIDENT_CUBLAS_CHECK(hs);
  Scratch<uint8_t> ws(best.workspaceSize, stream);
  const float one = 1.0f, zero = 0.0f;
  TRIDENT_CUBLAS_CHECK(lt.matmul(h, ds.op, &one, weight, ds.a, inp, ds.b, &zero, out, ds.d, out, ds.d, &best.algo,
                                 ws.get(), best.workspaceSize, stream));
  return true;
}

}  // namespace

LinearBiasPaths linear_bias_paths() { return {g_bias_epilogue.load(), g_bias_fill.load()}; }

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p, cudaStream_t stream) {
  if (p == Precision::kFloat32) {
    gemm_ex(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_32F, stream);
    return;
  }
  check_dims("gemm", M, N, K);
  if (M == 0 || N == 0) return;
  // Stored rows of each operand (row-major, leading dimension ld).
  const size_t a_elems = static_cast<size_t>(trans_a ? K : M) * lda;
  const size_t b_elems = static_cast<size_t>(trans_b ? N : K) * ldb;
  Scratch<uint16_t> a16(a_elems, stream), b16(b_elems, stream);
  if (a_elems) launch::to_bf16(a16.get(), A, a_elems, stream);
  if (b_elems) launch::to_bf16(b16.get(), B, b_elems, stream);
  check_launch("to_bf16 (gemm operands)");
  gemm_ex(trans_a, trans_b, M, N, K, alpha, a16.get(), lda, b16.get(), ldb, beta, C, ldc, CUDA_R_16BF, stream);
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A, int lda,
               const uint16_t* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream) {
  gemm_ex(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_16BF, stream);
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p, cudaStream_t stream) {
  check_dims("linear_forward", N, C, OC);
  if (N == 0 || OC == 0) return;
  if (bias && C > 0 && env::param_bool("TRIDENT_CUDA_BIAS_EPILOGUE")) {
    bool done = false;
    if (p == Precision::kFloat32) {
      done = linear_bias_epilogue(out, inp, weight, bias, N, C, OC, CUDA_R_32F, stream);
    } else {
      const size_t ni = static_cast<size_t>(N) * C, nw = static_cast<size_t>(OC) * C;
      Scratch<uint16_t> i16(ni, stream), w16(nw, stream);
      launch::to_bf16(i16.get(), inp, ni, stream);
      launch::to_bf16(w16.get(), weight, nw, stream);
      check_launch("to_bf16 (linear_forward operands)");
      done = linear_bias_epilogue(out, i16.get(), w16.get(), bias, N, C, OC, CUDA_R_16BF, stream);
      if (!done) {  // the fill + GEMM path, on the copies already made
        launch::fill_bias_rows(out, bias, N, OC, stream);
        check_launch("fill_bias_rows");
        gemm_ex(false, true, N, OC, C, 1.0f, i16.get(), C, w16.get(), C, 1.0f, out, OC, CUDA_R_16BF, stream);
        ++g_bias_fill;
        return;
      }
    }
    if (done) {
      ++g_bias_epilogue;
      return;
    }
  }
  if (bias) ++g_bias_fill;
  float beta = 0.0f;
  if (bias) {
    launch::fill_bias_rows(out, bias, N, OC, stream);
    check_launch("fill_bias_rows");
    beta = 1.0f;
  }
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC, p, stream);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float dinp_beta, Precision p, const float* dinp_mul,
                     cudaStream_t stream) {
  check_dims("linear_backward", N, C, OC);
  if (p == Precision::kBFloat16 && (dinp || dweight) && N > 0 && C > 0 && OC > 0) {
    // dout feeds both products: rounded to bfloat16 once (the same bits gemm() would produce twice).
    const size_t nd = static_cast<size_t>(N) * OC;
    Scratch<uint16_t> d16(nd, stream);
    launch::to_bf16(d16.get(), dout, nd, stream);
    if (dinp) {
      const size_t nw = static_cast<size_t>(OC) * C;
      Scratch<uint16_t> w16(nw, stream);
      launch::to_bf16(w16.get(), weight, nw, stream);
      check_launch("to_bf16 (linear_backward operands)");
      gemm_ex(false, false, N, C, OC, 1.0f, d16.get(), OC, w16.get(), C, dinp_beta, dinp, C, CUDA_R_16BF, stream);
    }
    if (dweight) {
      const size_t ni = static_cast<size_t>(N) * C;
      Scratch<uint16_t> i16(ni, stream);
      launch::to_bf16(i16.get(), inp, ni, stream);
      check_launch("to_bf16 (linear_backward operands)");
      gemm_ex(true, false, OC, C, N, 1.0f, d16.get(), OC, i16.get(), C, 1.0f, dweight, C, CUDA_R_16BF, stream);
    }
  } else {
    if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C, p, stream);
    if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, p, stream);
  }
  if (dinp && dinp_mul) mul(dinp, dinp, dinp_mul, static_cast<size_t>(N) * C, stream);
  if (dbias && N > 0 && OC > 0) {
    const int chunks = launch::column_chunks(N);
    Scratch<float> partial(static_cast<size_t>(chunks) * OC, stream);
    launch::column_sums_partial(partial.get(), dout, N, OC, stream);
    launch::column_sums_finish(dbias, partial.get(), chunks, OC, stream);
    check_launch("column sums (linear dbias)");
  }
}

#define TRIDENT_CUDA_ELEMENTWISE(what, n, ...) \
  do {                                         \
    if ((n) == 0) return;                      \
    __VA_ARGS__;                               \
    check_launch(what);                        \
  } while (0)

void gelu_forward(float* out, const float* inp, size_t n, GeluKind kind, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("gelu_forward", n, launch::gelu_forward(out, inp, n, kind == GeluKind::kTanh, s));
}
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, GeluKind kind, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("gelu_backward", n,
                           launch::gelu_backward(dinp, inp, dout, n, kind == GeluKind::kTanh, s));
}
void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, GeluKind kind, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("gelu_forward_and_grad", n,
                           launch::gelu_forward_and_grad(out, grad, inp, n, kind == GeluKind::kTanh, s));
}
void add(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("add", n, launch::add(out, a, b, n, s));
}
void add_inplace(float* acc, const float* x, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("add_inplace", n, launch::add_inplace(acc, x, n, s));
}
void mul(float* out, const float* a, const float* b, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("mul", n, launch::mul(out, a, b, n, s));
}
void scale_inplace(float* x, float a, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("scale_inplace", n, launch::scale(x, a, n, s));
}
void copy(float* dst, const float* src, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("copy", n, launch::copy(dst, src, n, s));
}
void to_bf16(uint16_t* out, const float* in, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("to_bf16", n, launch::to_bf16(out, in, n, s));
}
void from_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t s) {
  TRIDENT_CUDA_ELEMENTWISE("from_bf16", n, launch::from_bf16(out, in, n, s));
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps, cudaStream_t s) {
  check_dims("layernorm_forward", N, C);
  TRIDENT_CHECK(C > 0 || N == 0, InvalidArgument, "cuda layernorm_forward: C must be positive");
  if (N == 0) return;
  launch::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, s);
  check_launch("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  check_dims("layernorm_backward", N, C);
  if (N == 0 || C == 0) return;
  launch::layernorm_backward_dinp(dinp, dout, inp, weight, mean, rstd, N, C, s);
  const int chunks = launch::column_chunks(N);
  Scratch<float> pw(static_cast<size_t>(chunks) * C, s), pb(dbias ? static_cast<size_t>(chunks) * C : 0, s);
  launch::layernorm_backward_params_partial(pw.get(), dbias ? pb.get() : nullptr, dout, inp, mean, rstd, N, C, s);
  launch::column_sums_finish(dweight, pw.get(), chunks, C, s);
  if (dbias) launch::column_sums_finish(dbias, pb.get(), chunks, C, s);
  check_launch("layernorm_backward");
}

void softmax_forward(float* out, const float* inp, int N, int C, cudaStream_t s) {
  check_dims("softmax_forward", N, C);
  if (N == 0 || C == 0) return;
  launch::softmax_forward(out, inp, N, C, s);
  check_launch("softmax_forward");
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps,
                     cudaStream_t s) {
  check_dims("rmsnorm_forward", N, C);
  TRIDENT_CHECK(C > 0 || N == 0, InvalidArgument, "cuda rmsnorm_forward: C must be positive");
  if (N == 0) return;
  launch::rmsnorm_forward(out, rstd, inp, weight, N, C, eps, s);
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, cudaStream_t s) {
  check_dims("rmsnorm_backward", N, C);
  if (N == 0 || C == 0) return;
  launch::rmsnorm_backward_dinp(dinp, dout, inp, weight, rstd, N, C, s);
  const int chunks = launch::column_chunks(N);
  Scratch<float> pw(static_cast<size_t>(chunks) * C, s);
  launch::rmsnorm_backward_weight_partial(pw.get(), dout, inp, rstd, N, C, s);
  launch::column_sums_finish(dweight, pw.get(), chunks, C, s);
  check_launch("rmsnorm_backward");
}

void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse,
          cudaStream_t s) {
  check_dims("rope", N, n_heads, hd);
  if (N == 0 || n_heads == 0 || hd == 0) return;
  TRIDENT_CHECK(hd % 2 == 0 && T > 0 && stride >= n_heads * hd, InvalidArgument,
                "cuda rope: needs an even head dim, T > 0 and stride >= n_heads * hd (hd {}, T {}, stride {}, "
                "n_heads {})",
                hd, T, stride, n_heads);
  launch::rope(x, cos, sin, N, T, stride, n_heads, hd, inverse, s);
  check_launch("rope");
}

void swiglu_forward(float* out, const float* h, int N, int I, cudaStream_t s) {
  check_dims("swiglu_forward", N, I);
  if (N == 0 || I == 0) return;
  launch::swiglu_forward(out, h, N, I, s);
  check_launch("swiglu_forward");
}

void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I, cudaStream_t s) {
  check_dims("swiglu_backward", N, I);
  if (N == 0 || I == 0) return;
  launch::swiglu_backward(dh, dout, h, N, I, s);
  check_launch("swiglu_backward");
}

namespace {
// As the CPU kernel's check: the kv index (h0 + j) / group - kv0 rises with j, so its ends bound it.
void check_kv_heads(const char* op, int N, int nh, int nkv, int hd, int h0, int group, int kv0) {
  check_dims(op, N, nh, nkv);
  TRIDENT_CHECK(hd >= 0 && group > 0, InvalidArgument, "cuda {}: bad shape (hd {}, group {})", op, hd, group);
  if (nh == 0) return;
  const int first = h0 / group - kv0, last = (h0 + nh - 1) / group - kv0;
  TRIDENT_CHECK(h0 >= 0 && first >= 0 && last < nkv, InvalidArgument,
                "cuda {}: query heads [{}, {}) with group {} read kv heads [{}, {}] of the local [0, {}) (kv0 {})", op,
                h0, h0 + nh, group, first, last, nkv, kv0);
}
}  // namespace

void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s) {
  check_kv_heads("kv_expand", N, nh, nkv, hd, h0, group, kv0);
  if (N == 0 || nh == 0 || hd == 0) return;
  launch::kv_expand(dst, src, N, nh, nkv, hd, h0, group, kv0, s);
  check_launch("kv_expand");
}

void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0,
               cudaStream_t s) {
  check_kv_heads("kv_reduce", N, nh, nkv, hd, h0, group, kv0);
  if (N == 0 || hd == 0 || nh + nkv == 0) return;
  launch::kv_reduce(dsrc, ddst, N, nh, nkv, hd, h0, group, kv0, s);
  check_launch("kv_reduce");
}

namespace {
// The tensor-core kernels serve bfloat16 at head dims 32, 64 and 128; every other case (float32, other head
// dims) takes the float32 kernels.
bool use_bf16_attention(Precision p, int C, int NH) {
  return p == Precision::kBFloat16 && launch::attention_bf16_supported(C, NH);
}
}  // namespace

std::string kernel_summary(int head_dim, Precision p) {
  const bool bf16 = p == Precision::kBFloat16;
  std::string s = bf16 ? "GEMMs: cuBLAS, bf16 operands (rounded to nearest even), float32 accumulation"
                       : "GEMMs: cuBLAS float32 (no TF32)";
  if (head_dim <= 0) return s;
  s += fmt::format("; attention (head dim {}): ", head_dim);
  if (bf16 && launch::attention_bf16_supported(head_dim, 1))
    return s + "tensor cores, bf16 operands, float32 softmax and accumulation (FlashAttention-2 on mma.sync)";
  s += head_dim <= 128 ? "float32 on CUDA cores, tiled (FlashAttention-2 style)"
                       : "float32 on CUDA cores, one row of scores per block in shared memory (head dim > 128)";
  if (bf16) s += "; the tensor-core kernels take head dims 32, 64 and 128";
  return s;
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, Precision p,
                       cudaStream_t s) {
  check_dims("attention_forward", B, T, C);
  TRIDENT_CHECK(NH > 0 && C % NH == 0, InvalidArgument, "cuda attention: n_embd {} must be divisible by n_head {}", C,
                NH);
  if (use_bf16_attention(p, C, NH)) {
    const size_t n = static_cast<size_t>(B) * T * 3 * C;
    Scratch<uint16_t> qkv16(n, s);
    if (n) launch::to_bf16(qkv16.get(), qkv, n, s);
    TRIDENT_CHECK(launch::attention_forward_bf16(out, lse, qkv16.get(), B, T, C, NH, s), Unsupported,
                  "cuda attention_forward (bfloat16): head dim {} needs more shared memory than this device allows",
                  C / NH);
  } else {
    TRIDENT_CHECK(launch::attention_forward(out, lse, qkv, B, T, C, NH, s), Unsupported,
                  "cuda attention_forward: sequence length {} needs more shared memory than this device allows "
                  "(the simple kernel keeps one score row of T floats per block); use a shorter block_size",
                  T);
  }
  check_launch("attention_forward");
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH, Precision p, cudaStream_t s) {
  check_dims("attention_backward", B, T, C);
  TRIDENT_CHECK(NH > 0 && C % NH == 0, InvalidArgument, "cuda attention: n_embd {} must be divisible by n_head {}", C,
                NH);
  Scratch<float> dbuf(static_cast<size_t>(B) * NH * T, s);
  if (use_bf16_attention(p, C, NH)) {
    launch::attention_row_dots(dbuf.get(), dout, out, B, T, C, NH, s);
    const size_t n = static_cast<size_t>(B) * T * C;
    Scratch<uint16_t> qkv16(3 * n, s), dout16(n, s);
    if (n) {
      launch::to_bf16(qkv16.get(), qkv, 3 * n, s);
      launch::to_bf16(dout16.get(), dout, n, s);
    }
    TRIDENT_CHECK(launch::attention_backward_bf16(dqkv, dbuf.get(), dout16.get(), qkv16.get(), lse, B, T, C, NH, s),
                  Unsupported,
                  "cuda attention_backward (bfloat16): head dim {} needs more shared memory than this device allows",
                  C / NH);
  } else {
    TRIDENT_CHECK(launch::attention_backward(dqkv, dbuf.get(), dout, qkv, out, lse, B, T, C, NH, s), Unsupported,
                  "cuda attention_backward: sequence length {} needs more shared memory than this device allows "
                  "(two score rows of T floats per block); use a shorter block_size",
                  T);
  }
  check_launch("attention_backward");
}

namespace {
// A device int flag read back after a synchronize; 0 = all indices fine, else 1 + a bad row.
int run_with_flag(cudaStream_t s, const char* what, auto&& launch_fn) {
  Scratch<int> flag(1, s);
  TRIDENT_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, sizeof(int), s));
  launch_fn(flag.get());
  check_launch(what);
  int host = 0;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&host, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, s));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V, cudaStream_t s) {
  check_dims("embedding_forward", B, T, C);
  if (static_cast<size_t>(B) * T * C == 0) return;
  int bad = run_with_flag(s, "embedding_forward", [&](int* flag) {
    launch::embedding_forward(out, tokens, wte, wpe, B, T, C, V, flag, s);
  });
  if (bad) {
    const int row = bad - 1;
    int32_t tok = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpy(&tok, tokens + row, sizeof(int32_t), cudaMemcpyDeviceToHost));
    TRIDENT_THROW(InvalidArgument,
                  "cuda embedding: token {} at (batch {}, position {}) is outside the vocabulary [0, {}); check the "
                  "tokenizer and vocab_size",
                  tok, row / T, row % T, V);
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        cudaStream_t s) {
  check_dims("embedding_backward", B, T, C);
  if (static_cast<size_t>(B) * T * C == 0) return;
  if (dwte) launch::embedding_backward_wte(dwte, dout, tokens, B * T, C, s);
  if (dwpe) launch::embedding_backward_wpe(dwpe, dout, B, T, C, s);
  check_launch("embedding_backward");
}

void cross_entropy_rows(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                        float dscale, cudaStream_t s) {
  check_dims("cross_entropy", N, V);
  if (N == 0) return;
  launch::cross_entropy(losses, dlogits, logits, targets, N, V, dscale, nullptr,
                        env::param_bool("TRIDENT_CUDA_XENT_ONE_PASS"), s);
  check_launch("cross_entropy");
}

double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                      float dscale, cudaStream_t s) {
  check_dims("cross_entropy", N, V);
  if (N == 0) return 0.0;
  Scratch<float> losses(static_cast<size_t>(N), s);
  int bad = run_with_flag(s, "cross_entropy", [&](int* flag) {
    launch::cross_entropy(losses.get(), dlogits, logits, targets, N, V, dscale, flag,
                          env::param_bool("TRIDENT_CUDA_XENT_ONE_PASS"), s);
  });
  if (bad) {
    int32_t y = 0;
    TRIDENT_CUDA_CHECK(cudaMemcpy(&y, targets + (bad - 1), sizeof(int32_t), cudaMemcpyDeviceToHost));
    TRIDENT_THROW(InvalidArgument, "cuda cross_entropy: target {} at row {} is outside the vocabulary [0, {})", y,
                  bad - 1, V);
  }
  std::vector<float> host(static_cast<size_t>(N));
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host.data(), losses.get(), host.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(s));
  double total = 0.0;
  for (float l : host) total += static_cast<double>(l);
  return total;
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t, cudaStream_t s) {
  TRIDENT_CHECK(t >= 1, InvalidArgument, "cuda adamw_update: step count t={} must be >= 1", t);
  if (n == 0) return;
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  launch::adamw(param, grad, m, v, n, lr, beta1, beta2, eps, 1.0f - lr * weight_decay, bc1, 1.0f / std::sqrt(bc2), s);
  check_launch("adamw_update");
}

double sum_squares(const float* x, size_t n, cudaStream_t s) {
  if (n == 0) return 0.0;
  Scratch<double> partial(launch::kSumSquaresBlocks + 1, s);
  launch::sum_squares_partial(partial.get(), x, n, s);
  launch::sum_squares_finish(partial.get() + launch::kSumSquaresBlocks, partial.get(), s);
  check_launch("sum_squares");
  double host = 0.0;
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(&host, partial.get() + launch::kSumSquaresBlocks, sizeof(double),
                                     cudaMemcpyDeviceToHost, s));
  TRIDENT_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}

}  // namespace trident::cuda
