// Registers the CUDA op table (cuda::device_ops()) with the kernels layer at static initialization, so
// kernels::device_ops(Device::kCuda) finds it without the kernels layer depending on CUDA. Its own
// library (trident_cuda_ops), linked whole into trident_nn (CMakeLists.txt) so the linker never drops it.
#include "trident/cuda/device.h"
#include "trident/kernels/device.h"

namespace trident::cuda {
namespace {

// "" when a GPU can be used, else why not (the cudaGetDeviceCount result).
std::string probe() { return device_count() > 0 ? std::string() : no_device_reason(); }

const bool kRegistered = [] {
  kernels::register_device(kernels::Device::kCuda, &device_ops(), probe);
  return true;
}();

}  // namespace
}  // namespace trident::cuda
