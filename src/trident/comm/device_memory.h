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
// thread (the copy-back of an async call runs on the group's worker thread). Ownership: the registry keeps
// the pointer it is given; the registrant keeps the object alive for the life of the process.
#pragma once

#include <cstddef>

namespace trident {

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
};

// Installs `m` (null: none) and returns what was installed before (tests install a stand-in and restore).
const DeviceMemory* register_device_memory(const DeviceMemory* m);
// The registered device memory, or null.
const DeviceMemory* device_memory();

}  // namespace trident
