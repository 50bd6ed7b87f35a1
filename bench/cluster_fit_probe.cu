// Standalone probe: how many SMs a persistent grid with the megakernel's block (threads, shared memory) keeps when it
// is launched in thread-block clusters of 1, 2, 4, 8 and 16, and which SMs each cluster of a full launch lands on.
// Build: nvcc -O3 -std=c++20 -I include -gencode=arch=compute_90a,code=sm_90a bench/cluster_fit_probe.cu -o /tmp/fit
//
// Why: a hand-off through a cluster's distributed shared memory takes 0.15-0.33 us whatever HBM does, against 1-9 us
// through L2 beside the weight stream (hop_latency_probe.cu, docs/perf.md, thirty-first session). A decode chain with
// hops inside clusters needs the persistent grid launched in clusters, one block an SM; a GPC's SMs that do not fill a
// whole cluster then stay idle. This says how many, before any design counts on a cluster size.
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include "../src/cuda/device/config.cuh"

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

using mk::gpu::KernelConfig;
constexpr int kSmemBytes = KernelConfig::kSmemBytes;  // what launch_megakernel asks, its alignment slack included

// Each block records its SM; a cluster's blocks are consecutive along x.
__global__ void __launch_bounds__(KernelConfig::kThreads) record_sm(uint32_t* smid) {
  extern __shared__ uint8_t smem[];  // (kSmemBytes) only reserved, as the megakernel's stage ring
  if (threadIdx.x != 0) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  smid[blockIdx.x] = sm;
  smem[0] = 0;
}

cudaLaunchConfig_t config_for(int size, int blocks, cudaLaunchAttribute& attribute) {
  return cluster_launch_config(blocks, KernelConfig::kThreads, kSmemBytes, size, attribute);
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CHECK(cudaFuncSetAttribute(record_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  std::printf("%d SMs; a block of %d threads and %d bytes of shared memory, one an SM\n", sms, KernelConfig::kThreads,
              kSmemBytes);
  uint32_t* smid = nullptr;  // (sms) each block's SM
  CHECK(cudaMalloc(&smid, sms * sizeof(uint32_t)));
  for (int size : {1, 2, 4, 8, 16}) {
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = config_for(size, size, attribute);
    int clusters = 0;
    if (const cudaError_t error = cudaOccupancyMaxActiveClusters(&clusters, record_sm, &config); error != cudaSuccess) {
      std::printf("clusters of %2d: not launchable (%s)\n", size, cudaGetErrorString(error));
      cudaGetLastError();  // clear it, so the next size's CHECKs see only their own
      continue;
    }
    const int blocks = clusters * size;
    std::printf("clusters of %2d: %3d at once, %3d SMs in use, %3d idle\n", size, clusters, blocks, sms - blocks);
    if (blocks == 0) continue;
    config = config_for(size, blocks, attribute);
    CHECK(cudaLaunchKernelEx(&config, record_sm, smid));
    CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> sm_of(blocks);  // (blocks) each block's SM
    CHECK(cudaMemcpy(sm_of.data(), smid, blocks * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    if (size == 1) continue;
    std::printf("  SMs of each cluster:");
    for (int b = 0; b < blocks; ++b) std::printf("%s%u", b % size == 0 ? "  |" : " ", sm_of[b]);
    std::printf("\n");
  }
  return 0;
}
