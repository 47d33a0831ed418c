// Error checks for the CUDA runtime and cuBLAS: every call is wrapped at its call site, and a failure
// throws trident::CudaError naming the call, the CUDA error string and file:line (STYLE.md #7).
//
// Ownership: none. Blocking: none (the macros only inspect return codes). Thread-safety: stateless.
// Timeouts: none. Built only where nvcc is found (TRIDENT_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include "trident/core/error.h"

namespace trident {

// A CUDA runtime, driver or cuBLAS call failed. `code` is the library's return code.
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code = 0) : Error(what), code(code) {}
  int code;
};

namespace cuda::detail {
[[noreturn]] void throw_cuda_error(cudaError_t rc, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
}  // namespace cuda::detail

}  // namespace trident

#define TRIDENT_CUDA_CHECK(call)                                                          \
  do {                                                                                    \
    cudaError_t trident_cuda_rc_ = (call);                                                \
    if (trident_cuda_rc_ != cudaSuccess)                                                  \
      ::trident::cuda::detail::throw_cuda_error(trident_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, asynchronous ones at the next sync.
#define TRIDENT_CUDA_CHECK_LAUNCH(what) TRIDENT_CUDA_CHECK(cudaGetLastError())

#define TRIDENT_CUBLAS_CHECK(call)                                                            \
  do {                                                                                        \
    int trident_cublas_rc_ = static_cast<int>(call);                                          \
    if (trident_cublas_rc_ != 0)                                                              \
      ::trident::cuda::detail::throw_cublas_error(trident_cublas_rc_, #call, __FILE__, __LINE__); \
  } while (0)
