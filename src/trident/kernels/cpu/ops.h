// CPU kernels for training (float32 storage; GEMMs optionally in bfloat16 with float32 accumulation).
//
// Conventions: row-major; a "row" is one of N = B*T positions. Linear weights use PyTorch's layout
// W[out, in] (y = x W^T + b). Gradient outputs named d<param> ACCUMULATE (+=) so micro-steps can add
// into one gradient buffer; activation gradients overwrite unless the argument says otherwise.
// Pointers documented "nullable" may be null (e.g. bias=False models).
// Ownership: kernels own no memory beyond thread-local scratch (bfloat16 conversion, GEMM packing,
// attention scores). Blocking/threads: each call returns when done; with more than one thread
// (set_num_threads) it runs on the kernels' own pool (thread_pool.h), split by shape alone (GEMM tiles,
// heads, row, column and element chunks), so results are bitwise the same for any thread count.
// Thread-safety: calls on disjoint outputs may run concurrently. No timeouts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident::kernels::cpu {

// Threads the kernels run on: the caller plus n - 1 workers of the kernels' pool (OpenBLAS, where a level
// uses it, runs one thread inside the pool's tasks). n <= 0 restores the default: the number of CPUs this
// process may run on.
void set_num_threads(int n);
int num_threads();

// Which implementation runs is chosen by the ISA level (isa.h: detected once, TRIDENT_ISA forces a lower
// one): trident's AVX-512 GEMMs and the attention built on them at avx512 and up, its AVX2 GEMM and the
// same attention on it at avx2, OpenBLAS and row-by-row attention at portable; elementwise and row kernels
// compiled for x86-64, x86-64-v3 or x86-64-v4. The levels compute the same functions; results differ in
// the last bits (summation order).

enum class Precision : uint8_t { kFloat32 = 0, kBFloat16 = 1 };
enum class GeluKind : uint8_t { kExact = 0, kTanh = 1 };

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(X) = X^T when trans_x. With kBFloat16 the
// operands are rounded to bfloat16 (round-to-nearest-even) and multiplied with float32 accumulation
// (at ISA level amx, trident's AMX tile kernel; at avx512bf16, trident's vdpbf16ps kernel;
// otherwise cblas_sbgemm where OpenBLAS has it, else a float32 GEMM on operands rounded to bfloat16, the
// same numbers up to summation order). Float32 products with alpha 1 and beta 0 or 1 run
// on trident's AVX-512 GEMM at level avx512 and up and on its AVX2 GEMM at avx2 (each element one FMA
// chain over k in order, independent of M and tiling), else OpenBLAS.
bool have_native_bf16_gemm();
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc, Precision p = Precision::kFloat32);

// out[N,OC] = inp[N,C] W[OC,C]^T + bias[OC] (bias nullable).
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p = Precision::kFloat32);
// dinp[N,C] = dinp_beta * dinp + dout W (dinp nullable: skipped); dweight[OC,C] += dout^T inp;
// dbias[OC] += column sums of dout (nullable). dinp_mul (nullable, N x C): dinp is then multiplied by it
// elementwise (an activation's derivative), the same result as a separate mul(dinp, dinp, dinp_mul), applied
// block by block while the product is in cache.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float dinp_beta = 0.0f,
                     Precision p = Precision::kFloat32, const float* dinp_mul = nullptr);

// out = gelu(inp); exact = 0.5 x (1 + erf(x/sqrt2)) (nn.GELU()), tanh = GPT-2's approximation.
void gelu_forward(float* out, const float* inp, size_t n, GeluKind kind);
// out = gelu(inp) and grad = gelu'(inp) in one pass (grad may alias inp): a layer can keep gelu'(x) in
// place of x, and its backward becomes mul(dinp, dout, grad).
void gelu_forward_and_grad(float* out, float* grad, const float* inp, size_t n, GeluKind kind);
// out = a * b elementwise (out may alias a or b).
void mul(float* out, const float* a, const float* b, size_t n);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, GeluKind kind);

// out = a + b (out may alias a or b); acc += x.
void add(float* out, const float* a, const float* b, size_t n);
void add_inplace(float* acc, const float* x, size_t n);

// LayerNorm over the last dim C with eps (PyTorch's default 1e-5): out = (x-mean)*rstd*w + b.
// mean/rstd [N] are saved for backward (nullable in forward when not needed). bias nullable.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps = 1e-5f);
// dinp += ...; dweight += ...; dbias += ... (nullable).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// Row-wise softmax of inp[N,C] into out (may alias).
void softmax_forward(float* out, const float* inp, int N, int C);

// ---- Llama-family layers (llama.cc): RMSNorm, rotary embeddings, SwiGLU, grouped-query key/value sharing ----
// RMSNorm over the last dim C: out = inp * rstd * weight, rstd[r] = 1/sqrt(mean_c(inp[r,c]^2) + eps) (the
// mean of squares summed in double); rstd [N] saved for backward (nullable).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// dinp += d inp (accumulates, as layernorm_backward); dweight += sum over rows of dout * inp * rstd.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);
// Rotary position embedding in place, Hugging Face's rotate-half layout: x holds N rows of `stride` floats; row
// r is position p = r % T; heads h in [0, n_heads) start at x + r*stride + h*hd (hd even). For i < hd/2, with
// c = cos[p*(hd/2)+i], s = sin[p*(hd/2)+i], a = x[i], b = x[i+hd/2]: forward x[i] = a*c - b*s,
// x[i+hd/2] = b*c + a*s; inverse (the backward: rotation by -angle) x[i] = a*c + b*s, x[i+hd/2] = b*c - a*s.
// cos/sin: tables [T_max, hd/2] (position-major), T <= T_max.
void rope(float* x, const float* cos, const float* sin, int N, int T, int stride, int n_heads, int hd, bool inverse);
// SwiGLU: h[N, 2I] holds each row's [gate (I) | up (I)]; out[N, I] = silu(gate) * up, silu(g) = g * sigmoid(g).
void swiglu_forward(float* out, const float* h, int N, int I);
// dh[N, 2I] (overwritten): d gate = dout * up * sig(g) * (1 + g * (1 - sig(g))), d up = dout * silu(g).
void swiglu_backward(float* dh, const float* dout, const float* h, int N, int I);
// Grouped-query attention's key/value sharing as multi-head attention's packed layout: src[N, (nh + 2*nkv)*hd]
// holds each row's q (nh heads) | k (nkv heads) | v (nkv heads); dst[N, 3*nh*hd] = q | k | v with nh heads
// each, where local q head j reads k and v of local kv head (h0 + j) / group - kv0 (h0: global index of the
// first local q head, group = n_head / n_kv_head, kv0: global index of the first local kv head). Every kv
// index must lie in [0, nkv): checked, throws InvalidArgument.
void kv_expand(float* dst, const float* src, int N, int nh, int nkv, int hd, int h0, int group, int kv0);
// The adjoint: dsrc[N, (nh + 2*nkv)*hd] (overwritten) from ddst[N, 3*nh*hd]: dq copied; d k (d v) of each local
// kv head = the sum of d k (d v) of the q heads that read it, in ascending j order (0 for a kv head none reads).
void kv_reduce(float* dsrc, const float* ddst, int N, int nh, int nkv, int hd, int h0, int group, int kv0);

// Causal multi-head self-attention. qkv[B,T,3C] holds q | k | v, head h in columns h*hd..(h+1)*hd of each
// (hd = C/NH), scale 1/sqrt(hd). out[B,T,C] (heads concatenated), lse[B,NH,T] the log-sum-exp of each
// score row, saved for backward. Memory-light: no T x T matrix is kept; backward recomputes scores.
// Grouped-query attention passes its key/value heads widened to NH first (kv_expand; kv_reduce after the
// backward). With kBFloat16, at levels avx512bf16 and amx where vdpbf16ps pays (bf16_dot_in_use, isa.h)
// and T > 64, a flash-style kernel runs: q, k, v, dout and the probabilities rounded to bfloat16, float32
// accumulation, tiles of 64 x 64 (attention_bf16.cc); elsewhere bfloat16 runs the float32 kernel.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       Precision p = Precision::kFloat32);
// dqkv[B,T,3C] = gradient of out with respect to qkv (overwritten), from dout, qkv, out, lse (of the
// forward at the same precision).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int B, int T, int C, int NH, Precision p = Precision::kFloat32);

// out[B*T,C] = wte[tokens[b,t]] + wpe[t] (wpe nullable). Tokens must lie in [0, V): checked, throws.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                       int V);
// dwte[tok] += dout; dwpe[t] += dout (either nullable).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

// Fused softmax + cross-entropy over logits[N,V] with targets[N] in [0, V) (checked, throws).
// Returns the SUM of per-row losses (-log softmax[target]) in double. When dlogits is non-null, writes
// dlogits = (softmax - onehot) * dscale (dlogits may alias logits; dscale = loss_scale / N for a mean).
double cross_entropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                      float dscale);

// One AdamW step over n elements (PyTorch semantics, decoupled decay): t is the 1-based step count.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int64_t t);

// Sum of squares in double (gradient norms); x *= a.
double sum_squares(const float* x, size_t n);
void scale_inplace(float* x, float a, size_t n);

// Float32 <-> bfloat16 (round-to-nearest-even).
void to_bf16(uint16_t* out, const float* in, size_t n);
void from_bf16(float* out, const uint16_t* in, size_t n);

}  // namespace trident::kernels::cpu
