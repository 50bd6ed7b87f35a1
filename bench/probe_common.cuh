// What the standalone CUDA probes in bench/ share: a fail-fast check of runtime calls, a 16-byte cp.async, the global
// timer, decode's counter hand-off (release add, acquire load) and a launch in thread-block clusters.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// The probes are measurements run by hand: any runtime error ends them with its message.
#define CHECK(call)                                                                \
  do {                                                                             \
    cudaError_t error_ = (call);                                                   \
    if (error_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(error_));  \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return uint32_t(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, L1 bypassed, as decode's weight streams copy them.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(shared)), "l"(global) : "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// A warp's `steps` 4 KB steps through its ring `own` of kRing (kRing - 1 in flight while one is read back), with
// any copy kind: send(step) sends step `step` (or nothing past the last) into own + (step % kRing) * 256 uint4s, and
// landed(step) waits until it is there. Returns the xor of what the lane read, for the caller to keep so that nothing
// is elided.
template <int kRing, typename Send, typename Landed>
__device__ __forceinline__ uint32_t stream_ring_with(const uint4* own, int steps, int lane, Send send, Landed landed) {
  for (int step = 0; step < kRing - 1; ++step) send(step);
  uint32_t acc = 0;
  for (int step = 0; step < steps; ++step) {
    send(step + kRing - 1);
    landed(step);
    const uint4* buffer = own + (step % kRing) * 256;
    for (int c = 0; c < 8; ++c) {
      const uint4 v = buffer[c * 32 + lane];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();
  }
  return acc;
}

// stream_ring_with through 16-byte cp.async: issue(step) sends this lane's copies of a step, uncommitted; a group a
// step.
template <int kRing, typename Issue>
__device__ __forceinline__ uint32_t stream_ring(const uint4* own, int steps, int lane, Issue issue) {
  auto send = [&](int step) {
    if (step < steps) issue(step);
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  return stream_ring_with<kRing>(own, steps, lane, send, [](int) { cp_async_wait<kRing - 1>(); });
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The counter hand-off as decode publishes (release add) and waits (acquire load).
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void add_release(uint32_t* address, uint32_t value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Spins until `ns` have passed on the global timer.
__device__ inline void spin_ns(uint64_t ns) {
  const uint64_t start = now_ns();
  while (now_ns() - start < ns) {
  }
}

// One side of a counter ping-pong through global memory, `round_trips` round trips: the ping adds to its own counter,
// then waits for the other to reach the round; the pong waits for the ping's, then adds to its own.
__device__ inline void ping_pong(uint32_t* own, const uint32_t* other, uint32_t round_trips, bool is_ping) {
  for (uint32_t i = 1; i <= round_trips; ++i) {
    if (is_ping) add_release(own, 1);
    while (load_acquire(other) < i) {
    }
    if (!is_ping) add_release(own, 1);
  }
}

// A launch of `blocks` blocks in clusters of `size` (along x); `attribute` must outlive the launch call.
inline cudaLaunchConfig_t cluster_launch_config(int blocks, int threads, int smem_bytes, int size,
                                                cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// One warp streams its slice (slice_bytes, cycled) through its ring of kDepth steps of kStepBytes in shared memory
// until duration_ns have passed, as a decode weight tile's warp does, without the math between steps. Returns the
// bytes it streamed; every lane ends at the same step.
template <int kDepth, int kStepBytes>
__device__ uint64_t stream_slice(const uint8_t* slice, int64_t slice_bytes, uint8_t* ring, uint64_t duration_ns) {
  const int lane = threadIdx.x % 32;
  const uint64_t start = now_ns();
  uint64_t bytes = 0;
  int64_t offset = 0;
  for (int step = 0;; ++step) {
    uint8_t* buffer = ring + (step % kDepth) * kStepBytes;
#pragma unroll
    for (int chunk = 0; chunk < kStepBytes / 16 / 32; ++chunk) {
      const int at = (chunk * 32 + lane) * 16;
      cp_async_16(buffer + at, slice + offset + at);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    cp_async_wait<kDepth - 1>();
    bytes += kStepBytes;
    offset = (offset + kStepBytes) % slice_bytes;
    // Lane 0 decides for the warp: lanes reading the clock apart could stop a group of steps apart.
    if ((step & 15) == 15 && __shfl_sync(0xffffffffu, now_ns() - start > duration_ns, 0)) break;
  }
  cp_async_wait<0>();
  return bytes;
}
