// cuBLAS and cuBLASLt, opened on first use (dlopen) rather than linked. Loading libcublas, and the 540 MB libcublasLt it
// depends on, costs about 0.45 s of CPU at the start of every process that links it, GPU or not: every
// `trident` command, every rank it launches and every test process paid it. Only a process that runs a
// GEMM on a GPU opens it now.
//
// Ownership: the library stays open for the life of the process. Thread-safety: cublas() may be called from
// any thread; the first call opens the library once. Blocking: the first call reads the library from disk.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>
#include <vector>

namespace trident::cuda {

// The cuBLAS functions trident calls (cublas_v2.h's names; the _v2 symbols where it maps a name to one).
struct CublasApi {
  decltype(&cublasCreate) create;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSgemm) sgemm;
  // The C function (the header also has a C++ overload taking the compute type as a cudaDataType).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The cuBLASLt functions trident calls: GEMMs with an epilogue (the bias added as the product is written).
struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// Opens cuBLAS on the first call and returns its functions. Throws CudaError naming every file tried with
// the loader's reason, and what to do, when it cannot be opened or lacks one of the functions.
const CublasApi& cublas();
// Opens cuBLASLt (the library cuBLAS itself loads) the same way.
const CublasLtApi& cublas_lt();

// Where cuBLAS is looked for, in order: the file of the toolkit this build was configured with, then its
// name alone (the dynamic loader's search: LD_LIBRARY_PATH, the system's library folders).
std::vector<std::string> cublas_library_candidates();
std::vector<std::string> cublas_lt_library_candidates();

}  // namespace trident::cuda
