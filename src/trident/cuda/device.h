// Device memory, streams and events for the CUDA layer (RAII wrappers over the CUDA runtime).
//
// Ownership: DeviceBuffer<T> owns one cudaMalloc allocation (through the CUDA op table) on the device that
// was current when it was made, Stream one cudaStream_t, Event one cudaEvent_t; all are move-only and free
// in the destructor (errors there are logged, never thrown). Blocking: upload/download and synchronize() block the calling
// host thread until the copy or stream is done; everything else is asynchronous on the given stream.
// Thread-safety: distinct objects may be used from distinct threads; one object is not synchronized.
// Timeouts: none (CUDA calls do not take deadlines; a hung kernel is the driver's watchdog's business).
// Built only where nvcc is found (TRIDENT_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "trident/cuda/check.h"
#include "trident/kernels/device.h"

namespace trident::cuda {

// Number of usable CUDA devices; 0 (never throws) when there is no driver or no GPU.
int device_count();
// Why device_count() is 0 ("no CUDA driver", "no CUDA-capable device", ...), for skip messages.
std::string no_device_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)" for device `d`.
std::string device_description(int d);

// The CUDA op table (kernels/device.h): cuda/ops.h's kernels and cudaMalloc'd memory on the legacy
// default stream. kernels::device_ops(Device::kCuda) returns it where a GPU is visible.
const kernels::DeviceOps& device_ops();
// True once the op table allocated device memory in this process: before that no buffer can be device
// memory of ours, so callers can tell host from device memory without starting the CUDA runtime.
bool allocated_device_memory();
// The device this process computes on: LOCAL_RANK modulo the visible devices (torchrun's convention: one
// rank per GPU of a node, several ranks sharing a GPU where there are fewer), 0 without LOCAL_RANK. Made
// current on the calling thread by select_device(), which the op table's probe calls.
int process_device();
void select_device();

// A kernels::DeviceArray in CUDA memory (cudaMalloc, zero-filled), with blocking host copies.
template <typename T>
class DeviceBuffer : public kernels::DeviceArray<T> {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : kernels::DeviceArray<T>(device_ops(), n) {}
  // Allocates and copies host data (blocking).
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }

  size_t bytes() const { return this->size() * sizeof(T); }
  void upload(const T* host, size_t n) {
    TRIDENT_CHECK(n <= this->size(), InvalidArgument, "DeviceBuffer::upload: {} elements into a buffer of {}", n,
                  this->size());
    device_ops().to_device(this->data(), host, n * sizeof(T));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void download(T* host, size_t n) const {
    TRIDENT_CHECK(n <= this->size(), InvalidArgument, "DeviceBuffer::download: {} elements from a buffer of {}", n,
                  this->size());
    device_ops().to_host(host, this->data(), n * sizeof(T));
  }
  std::vector<T> to_host() const {
    std::vector<T> v(this->size());
    download(v.data(), v.size());
    return v;
  }
  void zero() {
    if (this->size()) TRIDENT_CUDA_CHECK(cudaMemset(this->data(), 0, bytes()));
  }
};

class Stream {
 public:
  Stream();  // a non-blocking stream on the current device
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  cudaStream_t get() const { return s_; }
  void synchronize();

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s);
  bool query();  // completed (throws on an asynchronous error)
  void synchronize();
  // Milliseconds from `start` to this event (both recorded with timing = true).
  float elapsed_ms_since(const Event& start);

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace trident::cuda
