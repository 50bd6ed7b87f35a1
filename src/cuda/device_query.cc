// Which GPU this process sees, and whether the megakernel can run on it.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "device/config.cuh"
#include "mk/gpu.h"

namespace mk {

using gpu::KernelConfig;

GpuInfo query_gpu() {
  GpuInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    info.reason = status != cudaSuccess
                      ? fmt::format("no CUDA GPU or driver on this machine (cudaGetDeviceCount: {})", cudaGetErrorString(status))
                      : std::string("no CUDA device");
    return info;
  }
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, 0) != cudaSuccess) {
    info.reason = "cannot read the properties of CUDA device 0";
    return info;
  }
  info.name = props.name;
  info.sm_count = props.multiProcessorCount;
  info.compute_major = props.major;
  info.compute_minor = props.minor;
  info.memory_bytes = props.totalGlobalMem;
  if (props.major != 9 || props.minor != 0) {
    info.reason = fmt::format("the megakernel needs a Hopper GPU (compute capability 9.0); device 0 is {} ({}.{})",
                              props.name, props.major, props.minor);
    return info;
  }
  if (size_t(props.sharedMemPerBlockOptin) < size_t(KernelConfig::kSmemBytes)) {
    info.reason = fmt::format("device 0 offers {} bytes of shared memory per block, the megakernel needs {}",
                              props.sharedMemPerBlockOptin, KernelConfig::kSmemBytes);
    return info;
  }
  info.usable = true;
  return info;
}

}  // namespace mk
