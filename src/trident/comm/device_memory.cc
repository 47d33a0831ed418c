#include "trident/comm/device_memory.h"

#include <atomic>

namespace trident {
namespace {
std::atomic<const DeviceMemory*> g_device_memory{nullptr};
}  // namespace

const DeviceMemory* register_device_memory(const DeviceMemory* m) {
  return g_device_memory.exchange(m, std::memory_order_acq_rel);
}

const DeviceMemory* device_memory() { return g_device_memory.load(std::memory_order_acquire); }

}  // namespace trident
