#include "trident/kernels/device.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "trident/kernels/aligned.h"

namespace trident::kernels {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  TRIDENT_THROW(InvalidArgument, "device must be cpu or cuda, got '{}'", name);
}

namespace {

void* cpu_alloc(size_t bytes) {
  void* p = ::operator new(bytes, std::align_val_t(kAlignment));
  std::memset(p, 0, bytes);
  return p;
}
void cpu_free(void* p) {
  if (p) ::operator delete(p, std::align_val_t(kAlignment));
}
void cpu_copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void cpu_memset_zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}
void cpu_synchronize() {}

// Lambdas drop the defaulted arguments of the CPU kernels, so every entry has the table's exact type.
const DeviceOps kCpuOps = {
    Device::kCpu,
    cpu_alloc,
    cpu_free,
    cpu_copy,
    cpu_copy,
    cpu_copy,
    cpu_memset_zero,
    cpu_synchronize,
    [](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
       float beta, float* C, int ldc, cpu::Precision p) {
      cpu::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, p);
    },
    [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC, cpu::Precision p) {
      cpu::linear_forward(out, inp, w, b, N, C, OC, p);
    },
    [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, int N, int C, int OC,
       float beta, cpu::Precision p) { cpu::linear_backward(dinp, dw, db, dout, inp, w, N, C, OC, beta, p); },
    cpu::gelu_forward,
    cpu::gelu_forward_and_grad,
    cpu::gelu_backward,
    cpu::mul,
    cpu::add,
    cpu::add_inplace,
    cpu::layernorm_forward,
    cpu::layernorm_backward,
    cpu::softmax_forward,
    cpu::attention_forward,
    cpu::attention_backward,
    cpu::embedding_forward,
    cpu::embedding_backward,
    cpu::cross_entropy_forward_backward,
    cpu::adamw_update,
    cpu::sum_squares,
    cpu::scale_inplace,
    cpu::to_bf16,
    cpu::from_bf16,
};

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
