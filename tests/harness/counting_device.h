// Test helper: a stand-in accelerator for code that keeps device and host memory apart (optimizer offload,
// the trainer's memory check): the CPU's op table under the name "cuda", whose allocations and host <-> device
// copies are counted. Its memory is host memory, so every kernel computes what the CPU computes; what the
// counters show is what a real device would have held and moved. install() registers it for the rest of the
// process (kernels::register_device): call it in a forked rank or child (testing::run_processes), never in a
// test binary's own process, whose other tests expect the real CUDA table (or none).
// Thread-safety: the counters are atomic and the allocation map is locked.
#pragma once

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "trident/kernels/device.h"

namespace trident::testing::counting_device {

struct Counters {
  std::mutex mu;
  std::unordered_map<void*, size_t> sizes;
  std::atomic<size_t> live{0}, to_host{0}, to_device{0}, allocations{0};
};

inline Counters& counters() {
  static Counters c;
  return c;
}

// The name CUDA would report (kernels::DeviceOps::describe; the planner's catalog matches it).
inline std::string& described() {
  static std::string d = "stand-in device (host memory, allocations and copies counted)";
  return d;
}

namespace detail {
inline const kernels::DeviceOps& cpu() { return kernels::device_ops(kernels::Device::kCpu); }
inline void* alloc(size_t bytes) {
  void* p = cpu().alloc(bytes);
  auto& c = counters();
  std::lock_guard<std::mutex> l(c.mu);
  c.sizes[p] = bytes;
  c.live += bytes;
  c.allocations += 1;
  return p;
}
inline void free(void* p) {
  if (p == nullptr) return;
  auto& c = counters();
  {
    std::lock_guard<std::mutex> l(c.mu);
    c.live -= c.sizes.at(p);
    c.sizes.erase(p);
  }
  cpu().free(p);
}
inline void to_device(void* dst, const void* src, size_t bytes) {
  counters().to_device += bytes;
  if (bytes) std::memcpy(dst, src, bytes);
}
inline void to_host(void* dst, const void* src, size_t bytes) {
  counters().to_host += bytes;
  if (bytes) std::memcpy(dst, src, bytes);
}
inline std::string probe() { return {}; }
inline std::string describe() { return described(); }
}  // namespace detail

// Registers the stand-in as the "cuda" device of this process, describing itself as `name`.
inline void install(const std::string& name = described()) {
  described() = name;
  static kernels::DeviceOps t = [] {
    kernels::DeviceOps o = kernels::device_ops(kernels::Device::kCpu);
    o.device = kernels::Device::kCuda;
    o.alloc = detail::alloc;
    o.free = detail::free;
    o.to_device = detail::to_device;
    o.to_host = detail::to_host;
    o.describe = detail::describe;
    return o;
  }();
  kernels::register_device(kernels::Device::kCuda, &t, detail::probe);
}

}  // namespace trident::testing::counting_device
