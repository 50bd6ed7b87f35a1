// Host-side helpers around CUDA runtime calls: errors as mk::Error, an arena that frees every allocation, events.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mk/buffers.h"
#include "mk/reference.h"

namespace mk::gpu {

// Throws mk::Error naming `what` (with free memory for out-of-memory) unless status is cudaSuccess.
void check_cuda(cudaError_t status, const char* what);

// Every device allocation of one engine, freed together.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  void* allocate_bytes(size_t bytes, const char* what);
  template <typename T>
  T* allocate(size_t count, const char* what) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T), what));
  }
  template <typename T>
  T* upload(const std::vector<T>& host, const char* what) {
    T* device = allocate<T>(host.size(), what);
    check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
    return device;
  }
  size_t bytes() const { return bytes_; }

 private:
  std::vector<void*> allocations_;
  size_t bytes_ = 0;
};

// A CUDA event destroyed on every path out of its scope.
class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "creating an event"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory for copies that ride a stream without a synchronous round trip each.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes`, reallocated (contents lost) when smaller.
  void* reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return data_;
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
    check_cuda(cudaMallocHost(&data_, bytes), what);
    bytes_ = bytes;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Throws mk::Error naming `what` unless `pointer` is device (or managed) memory of the current device: a caller's
// buffer handed to the engine, which would otherwise fail as an illegal address inside a copy or the kernel.
void check_device_pointer(const void* pointer, const char* what);

// (rows, cols) bf16 on the device -> fp32 on the host.
ref::Matrix download_bf16(const void* address, int64_t rows, int64_t cols);
// A pass's buffer at `address` -> fp32 on the host, whatever its element type (int32 ids become exact floats).
ref::Matrix download_buffer(const Buffer& buffer, const void* address);

}  // namespace mk::gpu
