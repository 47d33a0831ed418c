// Registers the CUDA op table (cuda::device_ops()) with the kernels layer, and CUDA memory with the
// communication layer (comm/device_memory.h: a process group stages a CUDA buffer through host memory where
// its backend reads host memory only), at static initialization, so neither layer depends on CUDA. Its own
// library (trident_cuda_ops), linked whole into trident_nn (CMakeLists.txt) so the linker never drops it.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "trident/comm/device_memory.h"
#include "trident/core/error.h"
#include "trident/cuda/check.h"
#include "trident/cuda/device.h"
#include "trident/cuda/launch.h"
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

// ---- CUDA IPC: peers of one host map each other's allocations ----
// cuMemGetAddressRange (the allocation holding a pointer), fetched from the driver through the runtime so
// that nothing links libcuda itself (absent on machines without a driver, where trident still runs).
using GetAddressRange = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);
GetAddressRange address_range() {
  static const GetAddressRange fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return GetAddressRange{nullptr};
    }
    return reinterpret_cast<GetAddressRange>(f);
  }();
  return fn;
}

bool export_handle(const void* p, DeviceHandle* h) {
  static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(h->bytes), "DeviceHandle too small for a CUDA IPC handle");
  const GetAddressRange range = address_range();
  if (range == nullptr) return false;
  TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  unsigned long long base = 0;
  size_t size = 0;
  if (range(&base, &size, reinterpret_cast<unsigned long long>(p)) != 0) return false;
  cudaIpcMemHandle_t mh{};
  if (cudaIpcGetMemHandle(&mh, reinterpret_cast<void*>(base)) != cudaSuccess) {  // e.g. stream-ordered pool memory
    cudaGetLastError();
    return false;
  }
  std::memcpy(h->bytes, &mh, sizeof mh);
  h->offset = reinterpret_cast<uintptr_t>(p) - base;
  return true;
}
// Opened peer allocations, kept open between calls (opening costs the driver far more than a small
// collective): a bounded cache by handle, where an entry in use is never closed. A handle names one
// allocation for its lifetime, so an entry whose memory its owner freed is never asked for again and ages out.
struct IpcCache {
  struct Entry {
    void* base = nullptr;
    int users = 0;
    uint64_t last_use = 0;
  };
  static constexpr size_t kKeep = 32;
  std::mutex mu;
  std::map<std::string, Entry> open;
  uint64_t clock = 0;
};
IpcCache& ipc_cache() {
  static IpcCache* c = new IpcCache;  // never destroyed: mappings close with the process
  return *c;
}

void* open_handle(const DeviceHandle& h) {
  cudaIpcMemHandle_t mh{};
  std::memcpy(&mh, h.bytes, sizeof mh);
  const std::string key(reinterpret_cast<const char*>(h.bytes), sizeof mh);
  IpcCache& c = ipc_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.open.find(key);
  if (it == c.open.end()) {
    if (c.open.size() >= IpcCache::kKeep) {  // close the least recently used entry no call is using
      auto victim = c.open.end();
      for (auto e = c.open.begin(); e != c.open.end(); ++e)
        if (e->second.users == 0 && (victim == c.open.end() || e->second.last_use < victim->second.last_use)) victim = e;
      if (victim != c.open.end()) {
        if (cudaIpcCloseMemHandle(victim->second.base) != cudaSuccess) cudaGetLastError();
        c.open.erase(victim);
      }
    }
    TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
    void* base = nullptr;
    cudaError_t rc = cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess);
    if (rc == cudaErrorAlreadyMapped) {
      // A cached mapping of memory its owner freed overlaps the new allocation (the owner reused the
      // address): drop every idle entry and map again.
      cudaGetLastError();
      for (auto e = c.open.begin(); e != c.open.end();) {
        if (e->second.users == 0) {
          if (cudaIpcCloseMemHandle(e->second.base) != cudaSuccess) cudaGetLastError();
          e = c.open.erase(e);
        } else {
          ++e;
        }
      }
      rc = cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess);
    }
    TRIDENT_CUDA_CHECK(rc);
    it = c.open.emplace(key, IpcCache::Entry{base, 0, 0}).first;
  }
  ++it->second.users;
  it->second.last_use = ++c.clock;
  return it->second.base;
}
void close_handle(void* base) {
  IpcCache& c = ipc_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [key, e] : c.open)
    if (e.base == base && e.users > 0) {
      --e.users;
      return;
    }
}
void synchronize() {
  TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  TRIDENT_CUDA_CHECK(cudaDeviceSynchronize());
}
static_assert(launch::kReduceFloat32 == static_cast<int>(DType::kFloat32) &&
                  launch::kReduceFloat64 == static_cast<int>(DType::kFloat64) &&
                  launch::kReduceInt32 == static_cast<int>(DType::kInt32) &&
                  launch::kReduceInt64 == static_cast<int>(DType::kInt64),
              "the reduce kernel's dtype codes are DType's values");
bool reduce(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) {
  int code = 0;
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: code = 0; break;
    case ReduceOp::kMax: code = 1; break;
    case ReduceOp::kMin: code = 2; break;
    case ReduceOp::kProd: code = 3; break;
  }
  if (count > 0) TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  const bool ok = launch::reduce_sources(dst, srcs, nsrc, count, static_cast<int>(dtype), code,
                                         op == ReduceOp::kAvg ? 1 : 0, nullptr);
  if (ok && count > 0) TRIDENT_CUDA_CHECK_LAUNCH("reduce_sources");
  return ok;
}
void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  TRIDENT_CUDA_CHECK(cudaSetDevice(process_device()));
  TRIDENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, nullptr));
}

const DeviceMemory kCudaMemory = [] {
  DeviceMemory m;
  m.name = "cuda";
  m.contains = contains;
  m.to_host = to_host;
  m.to_device = to_device;
  m.alloc = alloc;
  m.free = release;
  m.export_handle = export_handle;
  m.open_handle = open_handle;
  m.close_handle = close_handle;
  m.synchronize = synchronize;
  m.reduce = reduce;
  m.copy = copy;
  // Two ranks on an H100: ~0.44 ms a call on the device path against ~0.3 ms staged at 512 KiB; 0.5 against
  // 14 ms at 8 MiB (docs/PERFORMANCE.md, GPU).
  m.direct_min_bytes = 1 << 20;
  return m;
}();

const bool kRegistered = [] {
  kernels::register_device(kernels::Device::kCuda, &device_ops(), probe);
  register_device_memory(&kCudaMemory);
  return true;
}();

}  // namespace
}  // namespace trident::cuda
