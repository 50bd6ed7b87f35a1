// What the standalone CUDA probes in bench/ share: a fail-fast check of runtime calls and a 16-byte cp.async.
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

// 16 bytes global -> shared, L1 bypassed, as decode's weight streams copy them.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(uint32_t(__cvta_generic_to_shared(shared))),
               "l"(global)
               : "memory");
}
