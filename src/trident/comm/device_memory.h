// Device memory in collectives: how a process group recognises a buffer in an accelerator's memory that its
// transports cannot read (CUDA memory under the native and mpi backends, whose shared-memory and TCP
// transports read host memory), and how it moves such a buffer through host memory around the call.
//
// The accelerator layer registers itself once (cuda/register_device.cc does, at static initialization), so
// the communication layer never depends on CUDA. ProcessGroup (process_group.cc) consults it for every call
// on a backend that does not read device memory itself (ProcessGroup::reads_device_memory(); nccl does): a
// device buffer is copied to host memory before the call (after all work queued on the device, so the data
// is what the device computed) and the results are copied back before the call's Work completes. Callers
// therefore hand device buffers to any group, as they hand host buffers.
//
// Thread-safety: register and lookup may race (an atomic pointer); the hooks must be callable from any
// thread (the copy-back of an async call runs on the group's worker thread, a device-path call on the
// group's device lane). Ownership: the registry keeps the pointer it is given; the registrant keeps the
// object alive for the life of the process.
#pragma once

#include <cstddef>

#include "trident/comm/types.h"

namespace trident {

// An allocation of device memory shared with other processes of this host (CUDA IPC): what one rank
// publishes so that its peers can map the memory holding a buffer.
struct DeviceHandle {
  unsigned char bytes[64] = {};  // the driver's handle of the allocation
  size_t offset = 0;             // of the buffer in it
};

struct DeviceMemory {
  const char* name = "device";  // for errors and logs ("cuda")
  // True when p lies in this device's memory. Must be cheap and must not initialise the device (it is asked
  // about every buffer of every call, also in processes that never touch the device).
  bool (*contains)(const void* p) = nullptr;
  // Blocking copies. to_host waits for the work already queued on the device that may write src.
  void (*to_host)(void* dst, const void* src, size_t bytes) = nullptr;
  void (*to_device)(void* dst, const void* src, size_t bytes) = nullptr;
  // Device memory for tools that move device buffers themselves (`trident bench comm --device`): zeroed
  // bytes on this process's device (throws when there is none), and its release.
  void* (*alloc)(size_t bytes) = nullptr;
  void (*free)(void* p) = nullptr;

  // ---- several processes of one host reading each other's device memory (CUDA IPC) ----
  // The native backend's device path (process_group.cc): collectives on device buffers whose ranks share a
  // host read and reduce their peers' buffers in device kernels instead of moving them through host memory.
  // Any of these null: the path is off and buffers are staged through host memory.
  // Fills `h` for the allocation holding p; false when that memory cannot be shared (a stream-ordered pool's).
  bool (*export_handle)(const void* p, DeviceHandle* h) = nullptr;
  // Maps a peer's allocation into this process: its base address here (the buffer is base + h.offset);
  // released with close_handle(base) (the device may keep the mapping for later calls).
  void* (*open_handle)(const DeviceHandle& h) = nullptr;
  void (*close_handle)(void* base) = nullptr;
  // Waits until the work queued on this process's device is done (so that peers may read what it wrote, or
  // so that this process may read what they wrote).
  void (*synchronize)() = nullptr;
  // dst[i] = srcs[0][i] op srcs[1][i] op ... (nsrc sources, count elements; avg divides the sum by nsrc),
  // queued on the device. False (and nothing done) when the device has no kernel for this dtype, op and
  // number of sources: a call with count 0 asks just that.
  bool (*reduce)(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) = nullptr;
  // Device-to-device copy of bytes (either side may be a peer's mapped memory), queued on the device.
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;
  // Calls smaller than this (bytes of their largest buffer) stage instead: below it the handshake and the
  // device synchronisations cost more than the copies through host memory.
  size_t direct_min_bytes = 0;
};

// Installs `m` (null: none) and returns what was installed before (tests install a stand-in and restore).
const DeviceMemory* register_device_memory(const DeviceMemory* m);
// The registered device memory, or null.
const DeviceMemory* device_memory();

}  // namespace trident
