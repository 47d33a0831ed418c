#include "trident/cuda/cublas_api.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include "trident/cuda/check.h"

// The name of a cuBLAS function after cublas_v2.h's macros (cublasCreate -> "cublasCreate_v2").
#define TRIDENT_CUBLAS_NAME2(f) #f
#define TRIDENT_CUBLAS_NAME(f) TRIDENT_CUBLAS_NAME2(f)

namespace trident::cuda {
namespace {

template <typename F>
void bind(F* out, void* lib, const char* name, const std::string& path) {
  void* p = dlsym(lib, name);
  if (!p) {
    throw CudaError(fmt::format("cuBLAS library {} has no function {} ({}): it is older than the CUDA toolkit "
                                "trident was built with; install the cuBLAS of that toolkit",
                                path, name, dlerror()));
  }
  *out = reinterpret_cast<F>(p);
}

CublasApi open_cublas() {
  std::string tried;
  for (const auto& path : cublas_library_candidates()) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      tried += fmt::format("\n  {}: {}", path, dlerror());
      continue;
    }
    CublasApi a{};
    bind(&a.create, lib, TRIDENT_CUBLAS_NAME(cublasCreate), path);
    bind(&a.set_math_mode, lib, TRIDENT_CUBLAS_NAME(cublasSetMathMode), path);
    bind(&a.set_stream, lib, TRIDENT_CUBLAS_NAME(cublasSetStream), path);
    bind(&a.sgemm, lib, TRIDENT_CUBLAS_NAME(cublasSgemm), path);
    bind(&a.gemm_ex, lib, TRIDENT_CUBLAS_NAME(cublasGemmEx), path);
    bind(&a.status_name, lib, TRIDENT_CUBLAS_NAME(cublasGetStatusName), path);
    bind(&a.status_string, lib, TRIDENT_CUBLAS_NAME(cublasGetStatusString), path);
    return a;
  }
  throw CudaError(fmt::format("cannot open cuBLAS, which GEMMs on the GPU need; tried:{}\ninstall the CUDA "
                              "toolkit's cuBLAS, or add the folder holding {} to LD_LIBRARY_PATH",
                              tried, TRIDENT_CUBLAS_SONAME));
}

}  // namespace

std::vector<std::string> cublas_library_candidates() { return {TRIDENT_CUBLAS_PATH, TRIDENT_CUBLAS_SONAME}; }

const CublasApi& cublas() {
  // A failed open throws out of the initializer, so the next call tries again.
  static const CublasApi api = open_cublas();
  return api;
}

}  // namespace trident::cuda
