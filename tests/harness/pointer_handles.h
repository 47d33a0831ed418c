// Stand-in devices for the device path's tests (comm/device_memory.h): where every rank sees a buffer at the
// same address (ranks as threads, or forked processes sharing a mapping made before the fork), a CUDA IPC
// handle can be the pointer itself. These fill the handle hooks that way; the test supplies the rest.
#pragma once

#include <cstring>

#include "trident/comm/device_memory.h"

namespace trident::testing {

// Fills export_handle, open_handle, close_handle and synchronize (a no-op: the stand-in's work is done when
// its hooks return). `refuse`, when set, is asked on every export: true makes this rank unable to share.
inline void use_pointer_handles(DeviceMemory& m, bool (*refuse)() = nullptr) {
  static bool (*refuse_fn)() = nullptr;
  refuse_fn = refuse;
  m.export_handle = [](const void* p, DeviceHandle* h) {
    if (refuse_fn != nullptr && refuse_fn()) return false;
    std::memcpy(h->bytes, &p, sizeof p);
    h->offset = 0;
    return true;
  };
  m.open_handle = [](const DeviceHandle& h) {
    void* p = nullptr;
    std::memcpy(&p, h.bytes, sizeof p);
    return p;
  };
  m.close_handle = [](void*) {};
  m.synchronize = [] {};
}

}  // namespace trident::testing
