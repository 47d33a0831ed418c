// Internal: reductions shared by the CUDA kernels.
#pragma once

#include <cuda_runtime.h>

namespace trident::cuda::detail {

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 T; the call ends with a barrier, so it may be reused right after.
template <typename T>
__device__ inline T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = lane < nwarps ? scratch[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : -INFINITY;
  r = warp_max(r);
  __syncthreads();
  return r;
}

// The tiled attention kernels' grid: block -> (tile, head h, batch b) for nt tiles of B * NH heads. With
// last_tiles_first the last tiles come first: in the causal forward and dQ kernels they see the most key
// tiles (in dK/dV the first key tiles see the most query tiles), so the tail of the grid is short.
__device__ inline void attention_tile_coords(int nt, int NH, bool last_tiles_first, int& tile, int& h, int& b) {
  const int per = gridDim.x / nt;  // B * NH
  const int k = blockIdx.x / per, bh = blockIdx.x % per;
  tile = last_tiles_first ? nt - 1 - k : k;
  h = bh % NH;
  b = bh / NH;
}

// Lets `fn` take `bytes` of dynamic shared memory (above 48 KiB a kernel must opt in); false when the
// device has less per block.
inline bool allow_dynamic_smem(const void* fn, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  int dev = 0, max_optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return false;
  if (bytes > static_cast<size_t>(max_optin)) return false;
  return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
         cudaSuccess;
}

inline unsigned grid_for(size_t n, int threads, unsigned cap = 65535u * 16u) {
  size_t g = (n + threads - 1) / threads;
  if (g == 0) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

}  // namespace trident::cuda::detail
