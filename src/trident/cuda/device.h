// Device memory, streams and events for the CUDA layer (RAII wrappers over the CUDA runtime).
//
// Ownership: DeviceBuffer<T> owns one cudaMalloc allocation on the device that was current when it was
// made, Stream one cudaStream_t, Event one cudaEvent_t; all are move-only and free in the destructor
// (errors there are logged, never thrown). Blocking: upload/download and synchronize() block the calling
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

namespace trident::cuda {

// Number of usable CUDA devices; 0 (never throws) when there is no driver or no GPU.
int device_count();
// Why device_count() is 0 ("no CUDA driver", "no CUDA-capable device", ...), for skip messages.
std::string no_device_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)" for device `d`.
std::string device_description(int d);

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) TRIDENT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  // Allocates and copies host data (blocking).
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const T* host, size_t n) {
    TRIDENT_CHECK(n <= n_, InvalidArgument, "DeviceBuffer::upload: {} elements into a buffer of {}", n, n_);
    if (n) TRIDENT_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void download(T* host, size_t n) const {
    TRIDENT_CHECK(n <= n_, InvalidArgument, "DeviceBuffer::download: {} elements from a buffer of {}", n, n_);
    if (n) TRIDENT_CUDA_CHECK(cudaMemcpy(host, p_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    download(v.data(), n_);
    return v;
  }
  void zero() {
    if (n_) TRIDENT_CUDA_CHECK(cudaMemset(p_, 0, bytes()));
  }
  void reset() {
    if (p_) cudaFree(p_);  // no throw from destructors; a failing free means the context is already gone
    p_ = nullptr;
    n_ = 0;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
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
