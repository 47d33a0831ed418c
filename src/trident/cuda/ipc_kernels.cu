// Element-wise reduction of several device buffers (the device path of collectives on one host, where the
// sources are peers' buffers mapped through CUDA IPC). Sources are combined in index order, so every rank
// that reduces the same slice gets the same bits.
#include "trident/cuda/launch.h"

namespace trident::cuda::launch {
namespace {

struct Sources {
  const void* p[kMaxReduceSources];
};

template <class T>
__device__ T combine(T a, T b, int op) {
  switch (op) {
    case 1: return a > b ? a : b;
    case 2: return a < b ? a : b;
    case 3: return a * b;
    default: return a + b;
  }
}

template <class T>
__global__ void reduce_sources_k(T* dst, Sources s, int nsrc, size_t n, int op, int divide) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    T acc = static_cast<const T*>(s.p[0])[i];
    for (int k = 1; k < nsrc; ++k) acc = combine(acc, static_cast<const T*>(s.p[k])[i], op);
    if (divide) acc = acc / static_cast<T>(nsrc);
    dst[i] = acc;
  }
}

template <class T>
void launch_reduce(void* dst, const void* const* srcs, int nsrc, size_t n, int op, int divide, cudaStream_t st) {
  Sources s{};
  for (int k = 0; k < nsrc; ++k) s.p[k] = srcs[k];
  const size_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 2048 ? blocks : 2048);
  reduce_sources_k<T><<<grid, 256, 0, st>>>(static_cast<T*>(dst), s, nsrc, n, op, divide);
}

}  // namespace

bool reduce_sources(void* dst, const void* const* srcs, int nsrc, size_t n, int dtype, int op, int divide,
                    cudaStream_t s) {
  if (nsrc < 1 || nsrc > kMaxReduceSources || op < 0 || op > 3) return false;
  auto run = [&](auto tag) {
    if (n > 0) launch_reduce<decltype(tag)>(dst, srcs, nsrc, n, op, divide, s);
    return true;
  };
  switch (dtype) {
    case kReduceFloat32: return run(float{});
    case kReduceFloat64: return run(double{});
    case kReduceInt32: return run(int32_t{});
    case kReduceInt64: return run(int64_t{});
    default: return false;
  }
}

}  // namespace trident::cuda::launch
