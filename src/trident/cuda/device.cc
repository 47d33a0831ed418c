#include "trident/cuda/device.h"

#include "trident/cuda/cublas_api.h"

#include <cstdlib>

#include "trident/core/log.h"

namespace trident::cuda {

namespace detail {
void throw_cuda_error(cudaError_t rc, const char* call, const char* file, int line) {
  throw CudaError(::trident::detail::with_location(fmt::format("CUDA call {} failed: {} ({})", call,
                                                               cudaGetErrorString(rc), cudaGetErrorName(rc)),
                                                   file, line),
                  static_cast<int>(rc));
}
void throw_cublas_error(int status, const char* call, const char* file, int line) {
  throw CudaError(::trident::detail::with_location(
                      fmt::format("cuBLAS call {} failed: {} ({})", call,
                                  cublas().status_string(static_cast<cublasStatus_t>(status)),
                                  cublas().status_name(static_cast<cublasStatus_t>(status))),
                      file, line),
                  status);
}
}  // namespace detail

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int process_device() {
  static const int d = [] {
    const int n = device_count();
    const char* lr = std::getenv("LOCAL_RANK");
    if (n <= 0 || lr == nullptr || *lr == '\0') return 0;
    char* end = nullptr;
    const long r = std::strtol(lr, &end, 10);
    if (*end != '\0' || r < 0)
      TRIDENT_THROW(InvalidArgument, "LOCAL_RANK='{}' is not a non-negative integer (the launcher sets it: "
                    "trident launch, torchrun, or the mpirun/Slurm mapping)", lr);
    return static_cast<int>(r % n);
  }();
  return d;
}

void select_device() { TRIDENT_CUDA_CHECK(cudaSetDevice(process_device())); }

std::string no_device_reason() {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device: cudaGetDeviceCount returned {} ({})", cudaGetErrorName(rc),
                       cudaGetErrorString(rc));
  }
  if (n == 0) return "no CUDA device on this machine (cudaGetDeviceCount = 0)";
  return {};
}

std::string device_description(int d) {
  cudaDeviceProp p{};
  TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / (1ull << 30));
}

Stream::Stream() { TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_ && cudaStreamDestroy(s_) != cudaSuccess) log_warn("cuda: cudaStreamDestroy failed at teardown");
}
void Stream::synchronize() { TRIDENT_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) { TRIDENT_CUDA_CHECK(cudaEventRecord(e_, s)); }
bool Event::query() {
  cudaError_t rc = cudaEventQuery(e_);
  if (rc == cudaErrorNotReady) return false;
  TRIDENT_CUDA_CHECK(rc);
  return true;
}
void Event::synchronize() { TRIDENT_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms_since(const Event& start) {
  float ms = 0;
  TRIDENT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

}  // namespace trident::cuda
