// Host-side helpers around CUDA runtime calls: errors, the allocation arena, downloads.
#include "device_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "mk/bf16.h"
#include "mk/check.h"

namespace mk::gpu {

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  if (status == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(fmt::format("GPU out of memory during {} ({:.2f} GiB free of {:.2f} GiB)", what,
                            double(free_bytes) / (1 << 30), double(total_bytes) / (1 << 30)));
  }
  throw Error(fmt::format("CUDA error during {}: {} ({})", what, cudaGetErrorString(status), int(status)));
}

DeviceArena::~DeviceArena() {
  for (void* pointer : allocations_) cudaFree(pointer);
}

void* DeviceArena::allocate_bytes(size_t bytes, const char* what) {
  void* pointer = nullptr;
  check_cuda(cudaMalloc(&pointer, std::max<size_t>(bytes, 16)), what);
  allocations_.push_back(pointer);
  bytes_ += bytes;
  return pointer;
}

void check_device_pointer(const void* pointer, const char* what) {
  cudaPointerAttributes attributes{};
  check_cuda(cudaPointerGetAttributes(&attributes, pointer), what);
  int device = 0;
  check_cuda(cudaGetDevice(&device), what);
  MK_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
           "{}: {} is not device memory", what, pointer);
  MK_CHECK(attributes.device == device, "{}: the buffer is on CUDA device {}, the engine runs on device {}", what,
           attributes.device, device);
}

ref::Matrix download_bf16(const void* address, int64_t rows, int64_t cols) {
  std::vector<uint16_t> bits(size_t(rows * cols));
  check_cuda(cudaMemcpy(bits.data(), address, bits.size() * 2, cudaMemcpyDeviceToHost), "downloading a buffer");
  ref::Matrix out(rows, cols);
  for (size_t i = 0; i < bits.size(); ++i) out.data[i] = to_float(bf16{bits[i]});
  return out;
}

ref::Matrix download_buffer(const Buffer& buffer, const void* address) {
  const ElementType element = buffer_kind_info(buffer.kind).element;
  if (element == ElementType::kBf16) return download_bf16(address, buffer.rows, buffer.cols);
  ref::Matrix out(buffer.rows, buffer.cols);
  if (element == ElementType::kFloat32) {
    check_cuda(cudaMemcpy(out.data.data(), address, out.data.size() * 4, cudaMemcpyDeviceToHost),
               "downloading a buffer");
    return out;
  }
  std::vector<int32_t> values(out.data.size());
  check_cuda(cudaMemcpy(values.data(), address, values.size() * 4, cudaMemcpyDeviceToHost), "downloading a buffer");
  for (size_t i = 0; i < values.size(); ++i) out.data[i] = float(values[i]);
  return out;
}

}  // namespace mk::gpu
