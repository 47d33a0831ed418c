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

// The first of `candidates` that opens, and its path; throws CudaError naming each one tried and the loader's
// reason, for `what` (the library and what needs it) and the file name to put on LD_LIBRARY_PATH.
void* open_first(const std::vector<std::string>& candidates, const char* what, const char* soname, std::string* path) {
  std::string tried;
  for (const auto& c : candidates) {
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *path = c;
      return lib;
    }
    tried += fmt::format("\n  {}: {}", c, dlerror());
  }
  throw CudaError(fmt::format("cannot open {}; tried:{}\ninstall the CUDA toolkit's cuBLAS, or add the folder "
                              "holding {} to LD_LIBRARY_PATH",
                              what, tried, soname));
}

CublasApi open_cublas() {
  std::string path;
  void* lib = open_first(cublas_library_candidates(), "cuBLAS, which GEMMs on the GPU need", TRIDENT_CUBLAS_SONAME,
                         &path);
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

CublasLtApi open_cublas_lt() {
  std::string path;
  void* lib = open_first(cublas_lt_library_candidates(), "cuBLASLt, which GEMMs with a bias on the GPU need",
                         TRIDENT_CUBLASLT_SONAME, &path);
  CublasLtApi a{};
  bind(&a.create, lib, "cublasLtCreate", path);
  bind(&a.matmul_desc_create, lib, "cublasLtMatmulDescCreate", path);
  bind(&a.matmul_desc_destroy, lib, "cublasLtMatmulDescDestroy", path);
  bind(&a.matmul_desc_set, lib, "cublasLtMatmulDescSetAttribute", path);
  bind(&a.layout_create, lib, "cublasLtMatrixLayoutCreate", path);
  bind(&a.layout_destroy, lib, "cublasLtMatrixLayoutDestroy", path);
  bind(&a.preference_create, lib, "cublasLtMatmulPreferenceCreate", path);
  bind(&a.preference_destroy, lib, "cublasLtMatmulPreferenceDestroy", path);
  bind(&a.preference_set, lib, "cublasLtMatmulPreferenceSetAttribute", path);
  bind(&a.heuristic, lib, "cublasLtMatmulAlgoGetHeuristic", path);
  bind(&a.matmul, lib, "cublasLtMatmul", path);
  return a;
}

}  // namespace

std::vector<std::string> cublas_library_candidates() { return {TRIDENT_CUBLAS_PATH, TRIDENT_CUBLAS_SONAME}; }
std::vector<std::string> cublas_lt_library_candidates() { return {TRIDENT_CUBLASLT_PATH, TRIDENT_CUBLASLT_SONAME}; }

const CublasLtApi& cublas_lt() {
  static const CublasLtApi api = open_cublas_lt();
  return api;
}

const CublasApi& cublas() {
  // A failed open throws out of the initializer, so the next call tries again.
  static const CublasApi api = open_cublas();
  return api;
}

}  // namespace trident::cuda
