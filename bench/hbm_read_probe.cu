// HBM read bandwidth of one CTA an SM streaming weights through shared memory with cp.async, as decode GEMM tiles do.
// Standalone: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/hbm_read_probe.cu -o /tmp/probe
//
// Why: decode's streaming ops (gate_up, down, the LM head) read at ~3.7 TB/s against the 4.2 TB/s the bandwidth
// floor assumes (docs/perf.md, fifteenth session). This asks whether the access pattern or the bytes in flight set
// that rate: each warp reads 4 KB steps either as R rows' runs of 4 KB / R (R weight rows of 4 KB, warp w taking
// units of R rows w, w + 8, ...: R = 2 is the CUDA-core decode pattern, R = 8 and 16 the tensor-core one's, one or
// two groups of 8 rows a step) or as one contiguous 4 KB run of the CTA's region, with 4 or 6 steps per warp in its
// ring. R = 32 (128 B runs) is near decode attention's pattern at head_dim 64: one kv head's 128 B of each key's K
// and of its V.
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kWarps = 8;
constexpr int kStepBytes = 4096;
constexpr int kRowBytes = 4096;  // a weight row of k = 2048 bf16

// The global address of this lane's 16-byte chunk c (0..7) of step `step` of warp `warp` in a region of `bytes`.
// kRuns rows a step (0: contiguous): step s of warp w reads unit u = w + 8 (s / kRuns) of kRuns rows, each row's run
// (s % kRuns) of 4 KB / kRuns bytes; its 256 chunks (c 32 + lane) go row by row. Contiguous: step s of warp w is the
// 4 KB block w + 8 s.
template <int kRuns>
__device__ __forceinline__ const char* chunk_address(const char* region, int warp, int step, int lane, int c) {
  if constexpr (kRuns > 0) {
    constexpr int kRunChunks = kRowBytes / kRuns / 16;
    const int64_t unit = warp + kWarps * int64_t(step / kRuns);
    const int i = c * 32 + lane;
    const int64_t row = unit * kRuns + i / kRunChunks;
    return region + row * kRowBytes + (step % kRuns) * (kRowBytes / kRuns) + (i % kRunChunks) * 16;
  } else {
    return region + (warp + kWarps * int64_t(step)) * kStepBytes + c * 512 + lane * 16;
  }
}

// Each CTA streams its region (bytes_per_cta) through each warp's ring of kRing steps, kRing - 1 in flight while one
// is read back; the xor of what it read goes to sink so that nothing is elided.
template <int kRing, int kRuns>
__global__ void __launch_bounds__(kWarps * 32, 1) stream(const char* weights, int64_t bytes_per_cta, uint32_t* sink) {
  extern __shared__ uint4 ring[];  // (kWarps, kRing, kStepBytes / 16)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const char* region = weights + blockIdx.x * bytes_per_cta;
  const int steps = int(bytes_per_cta / kStepBytes / kWarps);
  uint4* own = ring + warp * kRing * (kStepBytes / 16);
  const uint32_t acc = stream_ring<kRing>(own, steps, lane, [&](int step) {
    for (int c = 0; c < 8; ++c)
      cp_async_16(own + (step % kRing) * (kStepBytes / 16) + c * 32 + lane,
                  chunk_address<kRuns>(region, warp, step, lane, c));
  });
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// The shortest of `reps` timed calls of launch() after a warm-up one, in ms.
template <typename Launch>
float best_ms(int reps, Launch launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();
  float best = 1e9f;
  for (int rep = 0; rep < reps; ++rep) {
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = ms < best ? ms : best;
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return best;
}

template <int kRing, int kRuns>
void measure(const char* name, const char* weights, int64_t bytes, int ctas, uint32_t* sink) {
  const int smem = kWarps * kRing * kStepBytes;
  CHECK(cudaFuncSetAttribute(stream<kRing, kRuns>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // whole units of kRuns steps a warp (16 at least), so that every row pattern ends inside the region
  constexpr int64_t kUnitBytes = int64_t(kRuns > 16 ? kRuns : 16) * kWarps * kStepBytes;
  const int64_t per_cta = bytes / ctas / kUnitBytes * kUnitBytes;
  const float ms = best_ms(6, [&] {
    stream<kRing, kRuns><<<ctas, kWarps * 32, smem>>>(weights, per_cta, sink);
    CHECK(cudaGetLastError());
  });
  const double read = double(per_cta) * ctas;
  std::printf("%-34s ring %d: %7.1f MB in %8.1f us = %5.2f TB/s (best of 6)\n", name, kRing, read / 1e6, ms * 1e3,
              read / (ms * 1e-3) / 1e12);
}

}  // namespace

int main() {
  int ctas = 0;
  CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, 0));
  const int64_t bytes = int64_t(525) << 20;  // about the LM head of Llama-3.2-1B (128256 x 2048 bf16)
  char* weights = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&weights, bytes));
  CHECK(cudaMalloc(&sink, ctas * sizeof(uint32_t)));
  CHECK(cudaMemset(weights, 0x5a, bytes));
  std::printf("%d CTAs of %d warps, 4 KB steps a warp\n", ctas, kWarps);
  measure<4, 2>("two rows' 2 KB runs (CUDA cores)", weights, bytes, ctas, sink);
  measure<4, 8>("8 rows' 512 B runs (mma, 1 group)", weights, bytes, ctas, sink);
  measure<4, 16>("16 rows' 256 B runs (mma, 2 groups)", weights, bytes, ctas, sink);
  measure<4, 32>("32 rows' 128 B runs (decode attention)", weights, bytes, ctas, sink);
  measure<4, 0>("contiguous 4 KB runs", weights, bytes, ctas, sink);
  measure<6, 2>("two rows' 2 KB runs (CUDA cores)", weights, bytes, ctas, sink);
  measure<6, 16>("16 rows' 256 B runs (mma, 2 groups)", weights, bytes, ctas, sink);
  const float copy_ms = best_ms(6, [&] {  // for scale
    CHECK(cudaMemcpy(weights, weights + (bytes >> 1), bytes >> 1, cudaMemcpyDeviceToDevice));
  });
  std::printf("cudaMemcpy device to device: %.2f TB/s read + written\n", double(bytes) / (copy_ms * 1e-3) / 1e12);
  return 0;
}
