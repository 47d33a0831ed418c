#include "trident/kernels/device.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include <sys/mman.h>

#include "trident/kernels/aligned.h"
#include "trident/kernels/cpu/isa.h"

namespace trident::kernels {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  TRIDENT_THROW(InvalidArgument, "device must be cpu or cuda, got '{}'", name);
}

namespace {

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
double available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// Host memory of the CPU device, zero-filled. Large buffers (kMapBytes and up) are anonymous mappings: the
// kernel hands them out as shared zero pages that become resident only when written, so a buffer a rank
// never touches in full (ZeRO-3's flat parameter buffer outside the units it gathers, an optimizer's moments
// before its first step) costs no memory, and no memset faults every page in up front. Smaller ones come
// from the heap and are cleared. A header just before the returned (64-byte aligned) pointer says which, for
// cpu_free.
struct HostBlockHeader {
  size_t bytes;
  uint64_t mapped;  // kMappedTag: an mmap of kPage + bytes; kHeapTag: operator new of kAlignment + bytes
};
constexpr size_t kMapBytes = size_t{1} << 20;
constexpr size_t kPage = 4096;
constexpr uint64_t kMappedTag = 0x6d61707065642121ull, kHeapTag = 0x6865617021212121ull;
static_assert(sizeof(HostBlockHeader) <= kAlignment);

[[noreturn]] void host_oom(size_t bytes) {
  throw OutOfMemory(::trident::detail::with_location(
                        fmt::format("cannot allocate {:.2f} GB of host memory ({:.2f} GB available); use a smaller "
                                    "model or batch, or shard the model over more ranks (--tp, --pp, --parallel "
                                    "zero3): `trident plan` predicts each layout's memory",
                                    bytes / 1e9, available_bytes() / 1e9),
                        __FILE__, __LINE__),
                    bytes);
}

void* cpu_alloc(size_t bytes) {
  char* p = nullptr;
  uint64_t tag = kHeapTag;
  if (bytes >= kMapBytes) {
    void* base = ::mmap(nullptr, kPage + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) host_oom(bytes);
    p = static_cast<char*>(base) + kPage;
    tag = kMappedTag;
  } else {
    try {
      p = static_cast<char*>(::operator new(kAlignment + bytes, std::align_val_t(kAlignment))) + kAlignment;
    } catch (const std::bad_alloc&) {
      host_oom(bytes);
    }
    std::memset(p, 0, bytes);
  }
  auto* h = reinterpret_cast<HostBlockHeader*>(p - kAlignment);
  h->bytes = bytes;
  h->mapped = tag;
  return p;
}
void cpu_free(void* ptr) {
  if (ptr == nullptr) return;
  char* p = static_cast<char*>(ptr);
  const auto* h = reinterpret_cast<const HostBlockHeader*>(p - kAlignment);
  if (h->mapped == kMappedTag) {
    ::munmap(p - kPage, kPage + h->bytes);
    return;
  }
  TRIDENT_CHECK(h->mapped == kHeapTag, InvalidArgument,
                "cpu_free: {} was not allocated by the CPU device's alloc (or its header was overwritten)", ptr);
  ::operator delete(p - kAlignment, std::align_val_t(kAlignment));
}
void cpu_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void cpu_memset_zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}
void cpu_synchronize() {}

void cpu_copy_2d(float* dst, size_t ldd, const float* src, size_t lds, size_t rows, size_t cols) {
  if (cols == 0) return;
  for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * ldd, src + r * lds, sizeof(float) * cols);
}

void cpu_fill_2d(float* dst, size_t ldd, float value, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) std::fill(dst + r * ldd, dst + r * ldd + cols, value);
}

void cpu_add_2d(float* out, size_t ldo, const float* a, size_t lda, const float* b, size_t ldb, size_t rows,
                size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    float* o = out + r * ldo;
    const float* x = a + r * lda;
    const float* y = b + r * ldb;
    for (size_t c = 0; c < cols; ++c) o[c] = x[c] + y[c];
  }
}

void cpu_embedding_shard_forward(float* out, const int32_t* tokens, const float* wte_shard, int64_t v0, int64_t vl,
                                 int64_t V, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const int64_t tok = tokens[i];
    TRIDENT_CHECK(tok >= 0 && tok < V, InvalidArgument,
                  "embedding: token {} at position {} is outside the vocabulary [0, {}); check the data and "
                  "vocab_size",
                  tok, i, V);
    float* o = out + static_cast<size_t>(i) * C;
    if (tok >= v0 && tok < v0 + vl) std::memcpy(o, wte_shard + static_cast<size_t>(tok - v0) * C, sizeof(float) * C);
    else std::memset(o, 0, sizeof(float) * C);
  }
}

void cpu_embedding_shard_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int64_t v0,
                                  int64_t vl, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const int64_t tok = tokens[i];
    if (tok < v0 || tok >= v0 + vl) continue;
    float* d = dwte_shard + static_cast<size_t>(tok - v0) * C;
    const float* g = dout + static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) d[j] += g[j];
  }
}

void cpu_ce_shard_max(float* mx, const float* logits, const int32_t* targets, int N, int64_t vl, int64_t V) {
  for (int i = 0; i < N; ++i) {
    TRIDENT_CHECK(targets[i] >= 0 && targets[i] < V, InvalidArgument,
                  "cross-entropy: target {} at position {} is outside the vocabulary [0, {})", targets[i], i, V);
    const float* row = logits + static_cast<size_t>(i) * vl;
    float m = -INFINITY;
    for (int64_t j = 0; j < vl; ++j) m = std::max(m, row[j]);
    mx[i] = m;
  }
}

void cpu_ce_shard_sumexp(float* st, float* dlogits, const float* logits, const float* mx, const int32_t* targets,
                         int N, int64_t vl, int64_t v0) {
  for (int i = 0; i < N; ++i) {
    const float* row = logits + static_cast<size_t>(i) * vl;
    const int64_t t = targets[i] - v0;
    st[N + i] = (t >= 0 && t < vl) ? row[t] : 0.0f;  // read before dlogits (which may alias) overwrites it
    float* ex = dlogits != nullptr ? dlogits + static_cast<size_t>(i) * vl : nullptr;
    double s = 0;
    for (int64_t j = 0; j < vl; ++j) {
      const float v = std::exp(row[j] - mx[i]);
      if (ex != nullptr) ex[j] = v;
      s += v;
    }
    st[i] = static_cast<float>(s);
  }
}

double cpu_ce_shard_finish(float* dlogits, const float* st, const float* mx, const int32_t* targets, int N,
                           int64_t vl, int64_t v0, float dscale) {
  double total = 0;
  for (int i = 0; i < N; ++i) {
    total += std::log(static_cast<double>(st[i])) + mx[i] - st[N + i];
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(i) * vl;
      const float k = static_cast<float>(dscale / static_cast<double>(st[i]));
      for (int64_t j = 0; j < vl; ++j) d[j] *= k;
      const int64_t t = targets[i] - v0;
      if (t >= 0 && t < vl) d[t] -= dscale;
    }
  }
  return total;
}

// Lambdas drop the defaulted arguments of the CPU kernels, so every entry has the table's exact type.
// Designated initializers in declaration order: a misordered entry does not compile, nor (by the pragma) a
// missing one; the device tests check every entry is non-null as well.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"
const DeviceOps kCpuOps = {
    .device = Device::kCpu,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .gemm = [](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc,
               cpu::Precision p) { cpu::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p); },
    .linear_forward = [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC,
                         cpu::Precision p) { cpu::linear_forward(out, inp, w, b, N, C, OC, p); },
    .linear_backward = [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          int N, int C, int OC, float beta, cpu::Precision p,
                          const float* dinp_mul) {
      cpu::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, beta, p, dinp_mul);
    },
    .gelu_forward = cpu::gelu_forward,
    .gelu_forward_and_grad = cpu::gelu_forward_and_grad,
    .gelu_backward = cpu::gelu_backward,
    .mul = cpu::mul,
    .add = cpu::add,
    .add_inplace = cpu::add_inplace,
    .layernorm_forward = cpu::layernorm_forward,
    .layernorm_backward = cpu::layernorm_backward,
    .softmax_forward = cpu::softmax_forward,
    .attention_forward = [](float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                            cpu::Precision p) { cpu::attention_forward(out, lse, qkv, B, T, C, NH, p); },
    .attention_backward = [](float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                             int B, int T, int C, int NH,
                             cpu::Precision p) { cpu::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, p); },
    .embedding_forward = cpu::embedding_forward,
    .embedding_backward = cpu::embedding_backward,
    .cross_entropy_forward_backward = cpu::cross_entropy_forward_backward,
    .adamw_update = cpu::adamw_update,
    .sum_squares = cpu::sum_squares,
    .scale_inplace = cpu::scale_inplace,
    .to_bf16 = cpu::to_bf16,
    .from_bf16 = cpu::from_bf16,
    .copy_2d = cpu_copy_2d,
    .fill_2d = cpu_fill_2d,
    .add_2d = cpu_add_2d,
    .embedding_shard_forward = cpu_embedding_shard_forward,
    .embedding_shard_backward = cpu_embedding_shard_backward,
    .ce_shard_max = cpu_ce_shard_max,
    .ce_shard_sumexp = cpu_ce_shard_sumexp,
    .ce_shard_finish = cpu_ce_shard_finish,
    .rmsnorm_forward = cpu::rmsnorm_forward,
    .rmsnorm_backward = cpu::rmsnorm_backward,
    .rope = cpu::rope,
    .swiglu_forward = cpu::swiglu_forward,
    .swiglu_backward = cpu::swiglu_backward,
    .kv_expand = cpu::kv_expand,
    .kv_reduce = cpu::kv_reduce,
    .describe = [] { return std::string("cpu"); },
    .kernel_summary = [](int, cpu::Precision) { return cpu::kernel_summary(); },
};
#pragma GCC diagnostic pop

struct Entry {
  const DeviceOps* ops = nullptr;
  std::string (*probe)() = nullptr;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
Entry& cuda_entry() {
  static Entry e;
  return e;
}

std::string cuda_visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? fmt::format("CUDA_VISIBLE_DEVICES='{}'", v) : std::string("CUDA_VISIBLE_DEVICES unset");
}

}  // namespace

void register_device(Device d, const DeviceOps* ops, std::string (*probe)()) {
  TRIDENT_CHECK(d == Device::kCuda && ops && probe, InvalidArgument,
                "register_device: only the cuda table registers (with its ops and a probe)");
  std::lock_guard<std::mutex> lock(registry_mutex());
  cuda_entry() = Entry{ops, probe};
}

std::string device_unavailable_reason(Device d) {
  if (d == Device::kCpu) return {};
  Entry e;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    e = cuda_entry();
  }
  if (!e.ops)
    return "this build of trident has no CUDA: nvcc was not found when it was configured (install the CUDA "
           "toolkit and reconfigure, e.g. cmake -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)";
  std::string why = e.probe();
  if (why.empty()) return {};
  return fmt::format("{}; {}", why, cuda_visible_devices());
}

const DeviceOps& device_ops(Device d) {
  if (d == Device::kCpu) return kCpuOps;
  std::string why = device_unavailable_reason(d);
  if (!why.empty())
    throw DeviceUnavailable(
        ::trident::detail::with_location(fmt::format("device cuda is not available: {}", why), __FILE__, __LINE__), d,
        why);
  std::lock_guard<std::mutex> lock(registry_mutex());
  return *cuda_entry().ops;
}

}  // namespace trident::kernels
