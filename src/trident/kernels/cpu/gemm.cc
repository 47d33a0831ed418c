// GEMM and Linear layers: trident's kernels by ISA level (gemm_avx2.cc, gemm_avx512.cc), OpenBLAS
// (cblas_sgemm; cblas_sbgemm for bfloat16) below them and for other alpha and beta.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "trident/core/error.h"
#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/gemm_avx2.h"
#include "trident/kernels/cpu/gemm_avx512.h"
#include "trident/kernels/cpu/isa.h"
#include "trident/kernels/cpu/ops.h"
#include "trident/kernels/cpu/simd.h"
#include "trident/kernels/cpu/thread_pool.h"

// Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16: cblas.h declares cblas_sbgemm but the library
// lacks it. A weak reference lets one binary use it where present and emulate it elsewhere.
extern "C" void cblas_sbgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                             float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*, blasint)
    __attribute__((weak));

namespace trident::kernels::cpu {

bool have_native_bf16_gemm() { return cblas_sbgemm != nullptr; }

namespace {
// Copies op-less matrix X (rows x cols, leading dim ld) into contiguous bfloat16.
void pack_bf16(std::vector<uint16_t>& dst, const float* x, int rows, int cols, int ld) {
  if (dst.size() < static_cast<size_t>(rows) * cols) dst.resize(static_cast<size_t>(rows) * cols);  // grows only
  for (int r = 0; r < rows; ++r) to_bf16(dst.data() + static_cast<size_t>(r) * cols, x + static_cast<size_t>(r) * ld, cols);
}

// Rounds X to bfloat16 precision, kept as float32 (products of two bfloat16 values are exact in float32,
// so sgemm on rounded operands computes what a bfloat16 GEMM with float32 accumulation does).
// out (leading dim ldo) = X (rows x cols, leading dim ld) rounded; out may be x (in place, ldo == ld).
TRIDENT_KERNEL_BODY void round_bf16_rows_body(float* out, int ldo, const float* x, int rows, int cols, int ld) {
  for (int r = 0; r < rows; ++r) {
    const float* src = x + static_cast<size_t>(r) * ld;
    float* o = out + static_cast<size_t>(r) * ldo;
    for (int c = 0; c < cols; ++c) {
      uint32_t u;
      std::memcpy(&u, &src[c], 4);
      u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
      std::memcpy(&o[c], &u, 4);
    }
  }
}
TRIDENT_ISA_CLONES(void, round_bf16_rows, (float* out, int ldo, const float* x, int rows, int cols, int ld),
                   (out, ldo, x, rows, cols, ld));
void round_bf16_rows(float* out, int ldo, const float* x, int rows, int cols, int ld) {
  return TRIDENT_ISA_CALL(round_bf16_rows, (out, ldo, x, rows, cols, ld));
}
// The whole of X into dst (leading dim cols). dst only grows: resize() to a larger size would zero the new
// tail that this fills anyway, and the callers' shapes alternate within a step.
void round_bf16(std::vector<float>& dst, const float* x, int rows, int cols, int ld) {
  if (dst.size() < static_cast<size_t>(rows) * cols) dst.resize(static_cast<size_t>(rows) * cols);
  round_bf16_rows(dst.data(), cols, x, rows, cols, ld);
}

// A task's block of an operand, rounded to bfloat16 precision, in this thread's buffer: the bfloat16 products
// that run on float32 FMAs round inside their tasks, block by block, while the block is in cache, instead of
// rounding both operands whole in a pass before the product (which wrote and re-read them through L3: 16-19%
// of the input- and weight-gradient products' time at nanoGPT's shapes). Consecutive tasks of one thread
// often need the same block (the column panels of one row group): it is kept and reused within one call.
// Rows are rounded 128 at a time as they are asked for, so a weight gradient rounds each 128-deep block of
// its A right before the kernel reads it.
struct RoundedRows {
  AlignedFloats buf;
  std::vector<char> done;  // per 128 rows
  uint64_t call = 0;
  const float* src = nullptr;
  int rows = 0, cols = 0, ld = 0, ldo = 0;
  // Rows [r0, r0 + n) (r0 a multiple of 128) of X (r x c, leading dim l), rounded, with leading dim *out_ld
  // (c rounded up to 16).
  const float* get(uint64_t call_id, const float* x, int r, int c, int l, int r0, int n, int* out_ld) {
    if (call_id != call || x != src || r != rows || c != cols || l != ld) {
      call = call_id;
      src = x;
      rows = r;
      cols = c;
      ld = l;
      ldo = (c + 15) / 16 * 16;
      if (buf.size() < static_cast<size_t>(r) * ldo) buf.resize(static_cast<size_t>(r) * ldo);
      done.assign(static_cast<size_t>((r + 127) / 128), 0);
    }
    for (int blk = r0 / 128; blk * 128 < r0 + n; ++blk) {
      if (done[static_cast<size_t>(blk)]) continue;
      const int b0 = blk * 128;
      round_bf16_rows(buf.data() + static_cast<ptrdiff_t>(b0) * ldo, ldo, x + static_cast<ptrdiff_t>(b0) * l,
                      std::min(128, r - b0), c, l);
      done[static_cast<size_t>(blk)] = 1;
    }
    *out_ld = ldo;
    return buf.data() + static_cast<ptrdiff_t>(r0) * ldo;
  }
  // All of X.
  const float* get(uint64_t call_id, const float* x, int r, int c, int l, int* out_ld) {
    return get(call_id, x, r, c, l, 0, r, out_ld);
  }
};
// Tells one product's blocks from the next one's (the same pointer may hold new values by then).
std::atomic<uint64_t> g_round_call{0};
}  // namespace

namespace {
// trident's kernels (AVX2 and AVX-512) serve products with alpha 1 and beta 0 or 1 (every call the models
// make); anything else goes to OpenBLAS (one thread inside each task).
bool use_native_gemm(float alpha, float beta) {
  return alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && detail::native_kernels_enabled();
}

// The GEMM each ISA level runs, by precision: trident's kernel (one thread, alpha 1, beta 0 or 1), or
// null for OpenBLAS (and, for bfloat16, operands rounded to bfloat16 first). One table: gemm() and the
// kernel summary read it.
using NativeGemm = void (*)(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int);
void gemm_f32_native(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, bool acc,
                     float* C, int ldc) {
  detail::gemm_avx512(ta, tb, M, N, K, A, lda, B, ldb, acc, C, ldc);
}
void gemm_f32_avx2(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, bool acc,
                   float* C, int ldc) {
  detail::gemm_avx2(ta, tb, M, N, K, A, lda, B, ldb, acc, C, ldc);
}
// How a level multiplies bfloat16 operands.
enum class Bf16Path {
  kRounded,  // round the operands to bfloat16 values in float32, then the float32 kernel (or OpenBLAS sbgemm)
  kDpbf16,   // vdpbf16ps on operands packed once per call and shared by every task (run_packed_dpbf16)
  kTiles,    // GemmEntry::bf16 per task (AMX tiles; it packs its own operands)
};
struct GemmEntry {
  NativeGemm f32;
  const char* f32_name;
  Bf16Path bf16_path;
  NativeGemm bf16;  // kTiles only
  const char* bf16_name;
};
const GemmEntry kGemmTable[] = {
    {nullptr, "openblas", Bf16Path::kRounded, nullptr, "bf16-rounded operands on openblas sgemm"},  // portable
    {gemm_f32_avx2, "avx2-fma", Bf16Path::kRounded, nullptr, "bf16-rounded operands on avx2-fma"},  // avx2
    {gemm_f32_native, "avx512-fma", Bf16Path::kRounded, nullptr, "bf16-rounded operands on avx512-fma"},  // avx512
    {gemm_f32_native, "avx512-fma", Bf16Path::kDpbf16, nullptr, "avx512bf16-dpbf16 (float32 accumulation)"},  // avx512bf16
    {gemm_f32_native, "avx512-fma", Bf16Path::kTiles, detail::gemm_amx_bf16,
     "amx-bf16 tiles (float32 accumulation)"},  // amx
};
// Level avx512bf16 where vdpbf16ps is not faster than the FMAs (isa.h, bf16_dot_in_use).
const GemmEntry kAvx512Bf16OnFma = {gemm_f32_native, "avx512-fma", Bf16Path::kRounded, nullptr,
                                    "bf16-rounded operands on avx512-fma"};
const GemmEntry& entry_for(int level) {
  if (level == static_cast<int>(Isa::kAvx512Bf16) && !bf16_dot_in_use()) return kAvx512Bf16OnFma;
  return kGemmTable[level];
}
const GemmEntry& gemm_entry() { return entry_for(detail::isa_level()); }
}  // namespace

namespace detail {
bool native_kernels_enabled() { return isa_level() >= static_cast<int>(Isa::kAvx2); }
TriGemm native_tri_gemm() { return isa_level() >= static_cast<int>(Isa::kAvx512) ? gemm_avx512 : gemm_avx2; }
const char* gemm_f32_kernel(Isa isa) { return entry_for(static_cast<int>(isa)).f32_name; }
const char* gemm_bf16_kernel(Isa isa) {
  const GemmEntry& e = entry_for(static_cast<int>(isa));
  return cblas_sbgemm != nullptr && e.bf16_path == Bf16Path::kRounded ? "openblas sbgemm" : e.bf16_name;
}
}  // namespace detail

namespace {
// Work per task of a split GEMM: about 15 us at the GEMMs' speed, so waking a worker pays off and the tasks
// are many enough to balance two threads when one of them loses its core for a while.
constexpr double kFlopsPerTask = 2.0e6;
constexpr int kMaxTasks = 64;
// The AVX2 kernel packs op(B) inside each task: larger tasks pack it fewer times over.
constexpr double kAvx2FlopsPerTask = 4 * kFlopsPerTask;
constexpr int kPanel = 64;  // columns of the AVX-512 kernels' register tile
constexpr int kRowStep = 6;  // rows of their register tile

// Runs f(i0, rows, j0, cols) over a grid of C's tiles that depends on M, N and K alone, never on the thread
// count: every thread count computes the same sub-products. Column groups are whole 64-column panels;
// when there are fewer panels than tasks wanted, rows are split too, in multiples of 6.
template <class F>
void for_each_tile(int M, int N, int K, double flops_per_task, F&& f) {
  const double flops = 2.0 * M * N * K * detail::task_size_divisor();
  const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(flops / flops_per_task), 1, kMaxTasks);
  const int panels = (N + kPanel - 1) / kPanel;
  int col_groups = 0, row_groups = 1, rows_per = M;
  if (panels >= want) {
    col_groups = static_cast<int>(want);
  } else {
    col_groups = panels;
    const int64_t rg = (want + panels - 1) / panels;
    rows_per = static_cast<int>((M + rg - 1) / rg);
    rows_per = std::max(kRowStep, (rows_per + kRowStep - 1) / kRowStep * kRowStep);
    row_groups = (M + rows_per - 1) / rows_per;
  }
  parallel_for(static_cast<int64_t>(row_groups) * col_groups, [&](int64_t t) {
    const int rg = static_cast<int>(t / col_groups), cg = static_cast<int>(t % col_groups);
    const int p0 = static_cast<int>(static_cast<int64_t>(cg) * panels / col_groups);
    const int p1 = static_cast<int>(static_cast<int64_t>(cg + 1) * panels / col_groups);
    const int j0 = p0 * kPanel, j1 = std::min(N, p1 * kPanel);
    const int i0 = rg * rows_per, i1 = std::min(M, i0 + rows_per);
    f(i0, i1 - i0, j0, j1 - j0);
  });
}

// The grid of the vdpbf16ps products (both operands packed once for all tasks): tasks of kRowBlock rows, so A's rows stay in L2 while a task crosses its panels, with the columns split only as far
// as the pool needs tasks. Like for_each_tile, it depends on M, N and K alone.
constexpr int kRowBlock = 96;  // 16 register tiles
template <class F>
void for_each_row_block(int M, int N, int K, F&& f) {
  const double flops = 2.0 * M * N * K * detail::task_size_divisor();
  const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(flops / kFlopsPerTask), 1, kMaxTasks);
  const int panels = (N + kPanel - 1) / kPanel;
  const int row_groups = (M + kRowBlock - 1) / kRowBlock;
  const int col_groups = static_cast<int>(std::clamp<int64_t>((want + row_groups - 1) / row_groups, 1, panels));
  parallel_for(static_cast<int64_t>(row_groups) * col_groups, [&](int64_t t) {
    const int rg = static_cast<int>(t / col_groups), cg = static_cast<int>(t % col_groups);
    const int p0 = static_cast<int>(static_cast<int64_t>(cg) * panels / col_groups);
    const int p1 = static_cast<int>(static_cast<int64_t>(cg + 1) * panels / col_groups);
    const int j0 = p0 * kPanel, i0 = rg * kRowBlock;
    f(i0, std::min(M, i0 + kRowBlock) - i0, j0, std::min(N, p1 * kPanel) - j0);
  });
}
}  // namespace

// c[i * ldc + j] *= m[i * ldc + j] for a rows x cols block: the elementwise factor of an Epilogue, applied
// by the task that computed the block while it is still in cache.
TRIDENT_KERNEL_BODY void mul_block_body(float* c, const float* m, int ldc, int rows, int cols) {
  for (int i = 0; i < rows; ++i) {
    float* ci = c + static_cast<ptrdiff_t>(i) * ldc;
    const float* mi = m + static_cast<ptrdiff_t>(i) * ldc;
    for (int j = 0; j < cols; ++j) ci[j] *= mi[j];
  }
}
TRIDENT_ISA_CLONES(void, mul_block, (float* c, const float* m, int ldc, int rows, int cols), (c, m, ldc, rows, cols));

namespace {
// What a task does to its finished block of C: nothing, or C *= mul (laid out like C).
struct Epilogue {
  const float* mul = nullptr;
  void operator()(float* C, int ldc, int i0, int rows, int j0, int cols) const {
    if (mul == nullptr) return;
    const ptrdiff_t off = static_cast<ptrdiff_t>(i0) * ldc + j0;
    TRIDENT_ISA_CALL(mul_block, (C + off, mul + off, ldc, rows, cols));
  }
};
}  // namespace

namespace {
// Rows of C per task of a transposed-A product: each task packs its 64-column panel of op(B) block by block
// into L1 and runs every row tile over it, so the more rows, the fewer times B is read.
constexpr int kBlockRows = 512;

// The AVX-512 float32 product with a transposed A, a weight gradient dY^T X (K = tokens, the largest
// dimension): one task per 64-column panel and up to kBlockRows rows, B packed per block inside the task.
// Packing all of op(B) first (run_packed_f32) writes K x N floats out and reads them back once per row
// group: at nanoGPT's shapes its dW products ran 8-15% slower that way.
// round: bfloat16 precision of both operands (RoundedRows), else float32.
void run_blocks_f32(bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                    bool accumulate, float* C, int ldc, const Epilogue& epi, bool round) {
  const uint64_t call = round ? g_round_call.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  const int panels = (N + kPanel - 1) / kPanel;
  const int row_groups = (M + kBlockRows - 1) / kBlockRows;
  const int rows_per = ((M + row_groups - 1) / row_groups + kRowStep - 1) / kRowStep * kRowStep;
  parallel_for(static_cast<int64_t>(row_groups) * panels, [&](int64_t t) {
    // Panels inner: a row group's A (K x rows) stays in L2 while the task moves across the panels.
    const int i0 = static_cast<int>(t / panels) * rows_per, j0 = static_cast<int>(t % panels) * kPanel;
    const int mi = std::min(M, i0 + rows_per) - i0, nj = std::min(N, j0 + kPanel) - j0;
    if (mi <= 0) return;
    const float* b = trans_b ? B + static_cast<ptrdiff_t>(j0) * ldb : B + j0;
    float* c = C + static_cast<ptrdiff_t>(i0) * ldc + j0;
    if (!round) {
      detail::gemm_avx512(true, trans_b, mi, nj, K, A + i0, lda, b, ldb, accumulate, c, ldc);
    } else {
      // 128 deep at a time, each block's operands rounded just before it: the kernel's own k blocks are 128
      // deep and carry C between them, so a call per block gives the same bits as one call.
      thread_local RoundedRows ra, rb;
      for (int k0 = 0; k0 < K; k0 += 128) {
        const int kc = std::min(128, K - k0);
        int la = 0, lb = 0;
        const float* ak = ra.get(call, A + i0, K, mi, lda, k0, kc, &la);  // A is stored K x M
        const float* bk = trans_b ? rb.get(call, b + k0, nj, kc, ldb, &lb)   // op(B)'s panel stored nj x K
                                  : rb.get(call, b + static_cast<ptrdiff_t>(k0) * ldb, kc, nj, ldb, &lb);
        detail::gemm_avx512(true, trans_b, mi, nj, kc, ak, la, bk, lb, accumulate || k0 > 0, c, ldc);
      }
    }
    epi(C, ldc, i0, mi, j0, nj);
  });
}

// The AVX-512 float32 product: a transposed A goes to run_blocks_f32; otherwise (forward and input-gradient
// products) op(B) is packed once into 64-column panels (one task per panel), then the tiles of
// for_each_tile all read the shared panels. Packing per tile instead cost about a tenth of the forward
// Linear GEMMs at nanoGPT's shapes (a transposed weight re-packed for every 72-row tile); packing an
// untransposed B too (rather than striding through its rows) made dX 3-10% faster.
void run_packed_f32(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                    bool accumulate, float* C, int ldc, const Epilogue& epi, bool round = false) {
  if (trans_a) return run_blocks_f32(trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, epi, round);
  const uint64_t call = round ? g_round_call.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  thread_local AlignedFloats packed;
  const size_t need = detail::gemm_avx512_packed_b_floats(N, K);
  if (packed.size() < need) packed.resize(need);
  float* pk = packed.data();
  const int panels = (N + kPanel - 1) / kPanel;
  parallel_for(panels, [&](int64_t p) {
    detail::gemm_avx512_pack_b(trans_b, N, K, B, ldb, pk, static_cast<int>(p), static_cast<int>(p) + 1);
    if (round) {  // the panel in place, while in cache (K x 64 floats, gemm_avx512.h)
      float* panel = pk + static_cast<ptrdiff_t>(p) * K * kPanel;
      round_bf16_rows(panel, kPanel, panel, K, kPanel, kPanel);
    }
  });
  for_each_tile(M, N, K, kFlopsPerTask, [&](int i0, int mi, int j0, int nj) {
    const float* a = A + static_cast<ptrdiff_t>(i0) * lda;
    int la = lda;
    if (round) {
      thread_local RoundedRows ra;
      a = ra.get(call, a, mi, K, lda, &la);
    }
    detail::gemm_avx512_packed(false, mi, nj, K, a, la, pk, j0, accumulate,
                               C + static_cast<ptrdiff_t>(i0) * ldc + j0, ldc);
    epi(C, ldc, i0, mi, j0, nj);
  });
}

// The vdpbf16ps product: both operands converted to bfloat16 once per call (A's rows in 64-row chunks, op(B)
// per 64-column panel, both split across the pool), then the tiles of for_each_tile read the shared packed
// operands. Converting inside each task instead re-packed A once per column panel and a transposed weight
// once per row group: at GPT-2 widths (C 768, N 1024 tokens) half the product's time.
void run_packed_dpbf16(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                       int ldb, bool accumulate, float* C, int ldc, const Epilogue& epi) {
  thread_local std::vector<uint16_t, AlignedAllocator<uint16_t>> pa;
  thread_local std::vector<uint32_t, AlignedAllocator<uint32_t>> pb;
  const size_t need_a = detail::dpbf16_packed_a_halves(M, K), need_b = detail::dpbf16_packed_b_words(N, K);
  if (pa.size() < need_a) pa.resize(need_a);
  if (pb.size() < need_b) pb.resize(need_b);
  uint16_t* a = pa.data();
  uint32_t* b = pb.data();
  const int panels = (N + kPanel - 1) / kPanel, np = panels * kPanel;
  const int a_chunks = (M + 63) / 64;
  parallel_for(panels + a_chunks, [&](int64_t t) {
    if (t < panels) {
      detail::dpbf16_pack_b(trans_b, N, K, B, ldb, b, static_cast<int>(t), static_cast<int>(t) + 1);
    } else {
      const int i0 = static_cast<int>(t - panels) * 64;
      detail::dpbf16_pack_a(trans_a, M, K, A, lda, a, i0, std::min(M, i0 + 64));
    }
  });
  const ptrdiff_t kp2 = 2 * detail::dpbf16_pairs(K);
  const int mp = (M + 15) / 16 * 16;  // a transposed A's pair rows
  for_each_row_block(M, N, K, [&](int i0, int mi, int j0, int nj) {
    const uint16_t* ai = trans_a ? a + 2 * static_cast<ptrdiff_t>(i0) : a + i0 * kp2;
    detail::dpbf16_packed(trans_a, mi, nj, K, ai, mp, b, np, j0, accumulate,
                          C + static_cast<ptrdiff_t>(i0) * ldc + j0, ldc);
    epi(C, ldc, i0, mi, j0, nj);
  });
}

// gemm with its epilogue: every path's tasks apply epi to the block they computed.
void gemm_epilogue(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc, Precision p, const Epilogue& epi) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[static_cast<size_t>(i) * ldc + j] = beta == 0.0f ? 0.0f : beta * C[static_cast<size_t>(i) * ldc + j];
    epi(C, ldc, 0, M, 0, N);
    return;
  }
  const GemmEntry& e = gemm_entry();
  const bool native = use_native_gemm(alpha, beta);
  // The tile (i0, rows) x (j0, cols) of C reads rows i0.. of op(A) and columns j0.. of op(B).
  auto a_at = [&](const float* a, int ld, int i0) { return trans_a ? a + i0 : a + static_cast<ptrdiff_t>(i0) * ld; };
  auto b_at = [&](const float* b, int ld, int j0) { return trans_b ? b + static_cast<ptrdiff_t>(j0) * ld : b + j0; };
  auto c_at = [&](int i0, int j0) { return C + static_cast<ptrdiff_t>(i0) * ldc + j0; };
  // Each C element is one product over k whatever the tile it falls in: trident's kernels compute it the
  // same way in any tile; OpenBLAS gets the same tiles for every thread count.
  auto run_native = [&](NativeGemm f, const float* a, int la, const float* b, int lb, double grain) {
    for_each_tile(M, N, K, grain, [&](int i0, int mi, int j0, int nj) {
      f(trans_a, trans_b, mi, nj, K, a_at(a, la, i0), la, b_at(b, lb, j0), lb, beta == 1.0f, c_at(i0, j0), ldc);
      epi(C, ldc, i0, mi, j0, nj);
    });
  };
  auto run_blas = [&](const float* a, int la, const float* b, int lb) {
    for_each_tile(M, N, K, kFlopsPerTask, [&](int i0, int mi, int j0, int nj) {
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, mi, nj, K,
                  alpha, a_at(a, la, i0), la, b_at(b, lb, j0), lb, beta, c_at(i0, j0), ldc);
      epi(C, ldc, i0, mi, j0, nj);
    });
  };
  // The AVX-512 kernel shares packed panels across its tasks (run_packed_f32); the AVX2 one packs per task.
  const bool avx512 = e.f32 == gemm_f32_native;
  if (p == Precision::kFloat32) {
    if (native && avx512) return run_packed_f32(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc, epi);
    if (native && e.f32 != nullptr) return run_native(e.f32, A, lda, B, ldb, kAvx2FlopsPerTask);
    return run_blas(A, lda, B, ldb);
  }
  if (native && e.bf16_path == Bf16Path::kDpbf16)
    return run_packed_dpbf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc, epi);
  // The AMX kernel packs its operands per call: larger tiles amortize it.
  if (native && e.bf16_path == Bf16Path::kTiles) return run_native(e.bf16, A, lda, B, ldb, 4 * kFlopsPerTask);
  // Stored shape of A is (trans_a ? K x M : M x K); of B (trans_b ? N x K : K x N).
  int ar = trans_a ? K : M, ac = trans_a ? M : K;
  int br = trans_b ? N : K, bc = trans_b ? K : N;
  if (!have_native_bf16_gemm()) {
    if (native && avx512)  // rounds inside its tasks
      return run_packed_f32(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta == 1.0f, C, ldc, epi, true);
    thread_local std::vector<float> a32, b32;
    round_bf16(a32, A, ar, ac, lda);
    round_bf16(b32, B, br, bc, ldb);
    if (native && e.f32 != nullptr) return run_native(e.f32, a32.data(), ac, b32.data(), bc, kAvx2FlopsPerTask);
    return run_blas(a32.data(), ac, b32.data(), bc);
  }
  thread_local std::vector<uint16_t> a16, b16;
  pack_bf16(a16, A, ar, ac, lda);
  pack_bf16(b16, B, br, bc, ldb);
  for_each_tile(M, N, K, kFlopsPerTask, [&](int i0, int mi, int j0, int nj) {
    const uint16_t* a = trans_a ? a16.data() + i0 : a16.data() + static_cast<ptrdiff_t>(i0) * ac;
    const uint16_t* b = trans_b ? b16.data() + static_cast<ptrdiff_t>(j0) * bc : b16.data() + j0;
    cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, mi, nj, K,
                 alpha, reinterpret_cast<const bfloat16*>(a), ac, reinterpret_cast<const bfloat16*>(b), bc, beta,
                 c_at(i0, j0), ldc);
    epi(C, ldc, i0, mi, j0, nj);
  });
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p) {
  gemm_epilogue(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p, Epilogue{});
}

TRIDENT_KERNEL_BODY void fill_bias_rows_body(float* out, const float* bias, int N, int OC) {
  for (int i = 0; i < N; ++i) {
    float* o = out + static_cast<size_t>(i) * OC;
    for (int j = 0; j < OC; ++j) o[j] = bias[j];
  }
}
TRIDENT_ISA_CLONES(void, fill_bias_rows, (float* out, const float* bias, int N, int OC), (out, bias, N, OC));
static void fill_bias_rows(float* out, const float* bias, int N, int OC) {
  // Row chunks of about 64 KiB.
  parallel_chunks(N, std::max(1, 16384 / std::max(OC, 1)), [&](int64_t r0, int64_t rows) {
    TRIDENT_ISA_CALL(fill_bias_rows, (out + r0 * OC, bias, static_cast<int>(rows), OC));
  });
}

// dbias[0..w) += sum over rows of dout[r * ld + 0..w), rows in order.
TRIDENT_KERNEL_BODY void column_sums_acc_body(float* dbias, const float* dout, int N, int w, int ld) {
  for (int i = 0; i < N; ++i) {
    const float* d = dout + static_cast<size_t>(i) * ld;
    for (int j = 0; j < w; ++j) dbias[j] += d[j];
  }
}
TRIDENT_ISA_CLONES(void, column_sums_acc, (float* dbias, const float* dout, int N, int w, int ld),
                   (dbias, dout, N, w, ld));
static void column_sums_acc(float* dbias, const float* dout, int N, int OC) {
  // Column chunks: each sum still runs over the rows in order.
  parallel_chunks(OC, 128, [&](int64_t j0, int64_t w) {
    TRIDENT_ISA_CALL(column_sums_acc, (dbias + j0, dout + j0, N, static_cast<int>(w), OC));
  });
}

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p) {
  // With a bias, out starts as the bias rows and the GEMM accumulates (beta 1): this replaces BLAS's
  // zeroing pass for beta 0 and a separate bias pass.
  if (bias) fill_bias_rows(out, bias, N, OC);
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC, p);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float dinp_beta, Precision p, const float* dinp_mul) {
  if (dinp)
    gemm_epilogue(false, false, N, C, OC, 1.0f, dout, OC, weight, C, dinp_beta, dinp, C, p, Epilogue{dinp_mul});
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, p);
  if (dbias) column_sums_acc(dbias, dout, N, OC);
}

TRIDENT_KERNEL_BODY void to_bf16_body(uint16_t* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &in[i], 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    // NaN stays NaN (quiet).
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
  }
}
TRIDENT_ISA_CLONES(void, to_bf16, (uint16_t * out, const float* in, size_t n), (out, in, n));
void to_bf16(uint16_t* out, const float* in, size_t n) { return TRIDENT_ISA_CALL(to_bf16, (out, in, n)); }

TRIDENT_KERNEL_BODY void from_bf16_body(float* out, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &u, 4);
  }
}
TRIDENT_ISA_CLONES(void, from_bf16, (float* out, const uint16_t* in, size_t n), (out, in, n));
void from_bf16(float* out, const uint16_t* in, size_t n) { return TRIDENT_ISA_CALL(from_bf16, (out, in, n)); }

}  // namespace trident::kernels::cpu
