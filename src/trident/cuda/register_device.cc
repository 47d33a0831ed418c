// Registers the CUDA op table (cuda::device_ops()) with the kernels layer, and CUDA memory with the
// communication layer (comm/device_memory.h: a process group stages a CUDA buffer through host memory where
// its backend reads host memory only), at static initialization, so neither layer depends on CUDA. Its own
// library (trident_cuda_ops), linked whole into trident_nn (CMakeLists.txt) so the linker never drops it.
#include <cuda_runtime_api.h>

#include <string>

#include "trident/comm/device_memory.h"
#include "trident/core/error.h"
#include "trident/cuda/check.h"
#include "trident/cuda/device.h"
#include "trident/kernels/device.h"

namespace trident::cuda {
namespace {

// "" when a GPU can be used, else why not (the cudaGetDeviceCount result). Makes the process's device
// current on the calling thread (the thread that builds and runs the model).
std::string probe() {
  if (device_count() == 0) return no_device_reason();
  select_device();
  return {};
}

bool contains(const void* p) {
  if (!allocated_device_memory()) return false;  // never start the runtime for a host-only process
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}
// Copies run on whichever thread the group uses (its worker for async calls): each names the device first.
void to_host(void* dst, const void* src, size_t bytes) {
  TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));  // Default: UVA tells the direction
}
void to_device(void* dst, const void* src, size_t bytes) {
  TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  TRIDENT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void* alloc(size_t bytes) {
  const std::string why = kernels::device_unavailable_reason(kernels::Device::kCuda);  // selects the device
  if (!why.empty()) TRIDENT_THROW(Unsupported, "device cuda is not available: {}", why);
  return device_ops().alloc(bytes);
}
void release(void* p) { device_ops().free(p); }

const DeviceMemory kCudaMemory{"cuda", contains, to_host, to_device, alloc, release};

const bool kRegistered = [] {
  kernels::register_device(kernels::Device::kCuda, &device_ops(), probe);
  register_device_memory(&kCudaMemory);
  return true;
}();

}  // namespace
}  // namespace trident::cuda
