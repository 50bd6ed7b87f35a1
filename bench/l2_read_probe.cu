// L2 -> SM read bandwidth of every SM re-reading the same L2-resident rows, alone and beside a weight stream from HBM,
// as the wgmma decode tiles read a batch's rows beside their weights.
// Standalone: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/l2_read_probe.cu -o /tmp/l2probe
//
// Why: at batch 32-64 a decode GEMM tile re-reads all the batch's rows (64 x K bf16) from L2 for each chunk of its
// weight rows; by the tiling's arithmetic two thirds of the bytes a 1B batch-64 step moves into an SM are those rows,
// ~3.2 TB/s over 132 SMs (docs/perf.md, thirty-eighth session). Whether that is near what L2 can deliver decides
// between splitting K (fewer row bytes in all) and faster copy issue. Each warp copies 4 KB steps through a ring with
// cp.async (16 bytes a lane) or as one bulk copy a step (TMA); a step is rows (the shared region, the same bytes on
// every SM) or weights (the CTA's own HBM region) in the ratio asked for. Rows from all SMs at the same offsets, or
// each SM starting at its own. (Thirty-ninth session: ~29 B/ns an SM through this probe's cp.async from either
// source, at 132, 66 and 33 CTAs alike, ~78 through bulk copies. NOTE: that is this pattern's limit, not an SM's: the
// decode's down tiles take in 55 B/ns through cp.async, and the decode GEMMs' copies by TMA were slower; fortieth
// session, runs 1-2.)
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kWarps = 8;
constexpr int kRing = 6;
constexpr int kStepBytes = 4096;

struct Streams {
  const char* rows;         // the shared L2-resident region
  int64_t rows_bytes;       // a multiple of kStepBytes
  const char* weights;      // the CTAs' HBM regions, weight_bytes_per_cta apart
  int64_t weight_bytes_per_cta;
  int steps;                // a warp's steps
  int rows_in_8;            // of every 8 steps, how many are rows
  bool staggered;           // each CTA starts its rows at its own offset
};

// The global address of this lane's 16-byte chunk c (0..7) of step `step` of warp `warp`.
__device__ __forceinline__ const char* chunk_address(const Streams& s, int warp, int step, int lane, int c) {
  const int64_t global_step = warp + int64_t(kWarps) * step;
  const int64_t offset = c * 512 + lane * 16;
  if (step % 8 < s.rows_in_8) {
    const int64_t start = s.staggered ? int64_t(blockIdx.x) * kStepBytes : 0;
    return s.rows + (start + global_step * kStepBytes) % s.rows_bytes + offset;
  }
  const char* region = s.weights + blockIdx.x * s.weight_bytes_per_cta;
  return region + (global_step * kStepBytes) % s.weight_bytes_per_cta + offset;
}

// kRing - 1 steps in flight a warp while one is read back; the xor of what it read goes to sink so that nothing is
// elided.
__global__ void __launch_bounds__(kWarps * 32, 1) stream(Streams s, uint32_t* sink) {
  extern __shared__ uint4 ring[];  // (kWarps, kRing, kStepBytes / 16)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* own = ring + warp * kRing * (kStepBytes / 16);
  const uint32_t acc = stream_ring<kRing>(own, s.steps, lane, [&](int step) {
    for (int c = 0; c < 8; ++c)
      cp_async_16(own + (step % kRing) * (kStepBytes / 16) + c * 32 + lane, chunk_address(s, warp, step, lane, c));
  });
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

// ---- the same steps as one bulk copy each (TMA's 1D cp.async.bulk, completing on an mbarrier a ring slot) ----

__device__ __forceinline__ void bulk_copy(void* shared, const void* global, uint32_t bytes, uint64_t* barrier) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(shared)),
               "l"(global), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}

__device__ __forceinline__ void wait_parity(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra wait;\n}" ::"r"(
          shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// As `stream`, each step sent by lane 0 as one 4 KB bulk copy: does TMA take in more than cp.async's ~29 B/ns an SM?
__global__ void __launch_bounds__(kWarps * 32, 1) stream_bulk(Streams s, uint32_t* sink) {
  extern __shared__ uint4 ring[];  // (kWarps, kRing, kStepBytes / 16)
  __shared__ uint64_t barriers[kWarps * kRing];  // (kWarps, kRing): a slot's step landed
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* own = ring + warp * kRing * (kStepBytes / 16);
  uint64_t* landed = barriers + warp * kRing;
  if (lane == 0) {
    for (int i = 0; i < kRing; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(landed + i)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  auto send = [&](int step) {
    if (lane == 0 && step < s.steps)
      bulk_copy(own + (step % kRing) * (kStepBytes / 16), chunk_address(s, warp, step, 0, 0), kStepBytes,
                landed + step % kRing);
  };
  const uint32_t acc = stream_ring_with<kRing>(own, s.steps, lane, send, [&](int step) {
    wait_parity(landed + step % kRing, uint32_t(step / kRing) & 1u);
  });
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

using Kernel = void (*)(Streams, uint32_t*);

// The shortest of 6 timed launches after a warm-up one, in ms.
float best_ms(Kernel kernel, const Streams& s, int ctas, uint32_t* sink) {
  const int smem = kWarps * kRing * kStepBytes;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e9f;
  for (int rep = 0; rep < 7; ++rep) {
    CHECK(cudaEventRecord(start));
    kernel<<<ctas, kWarps * 32, smem>>>(s, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms < best) best = ms;
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return best;
}

void measure(Kernel kernel, Streams s, int ctas, uint32_t* sink, int rows_in_8, bool staggered) {
  s.rows_in_8 = rows_in_8;
  s.staggered = staggered;
  const double ms = best_ms(kernel, s, ctas, sink);
  const double steps = double(ctas) * kWarps * s.steps;
  const double rows_bytes = steps * rows_in_8 / 8 * kStepBytes, weight_bytes = steps * (8 - rows_in_8) / 8 * kStepBytes;
  std::printf("rows %d/8 %-9s %4lld KB rows: %5.2f TB/s in all, %5.2f from L2, %5.2f from HBM, %5.1f B/ns an SM\n",
              rows_in_8, staggered ? "staggered" : "aligned", static_cast<long long>(s.rows_bytes >> 10),
              (rows_bytes + weight_bytes) / (ms * 1e-3) / 1e12, rows_bytes / (ms * 1e-3) / 1e12,
              weight_bytes / (ms * 1e-3) / 1e12, (rows_bytes + weight_bytes) / ctas / (ms * 1e6));
}

}  // namespace

// Usage: l2_read_probe [CTAS] (default: one a SM). Fewer CTAs than SMs tell an SM's own intake limit (the rate an SM
// holds as CTAs drop) from a limit of L2 or the crossbar (the rate in all holds).
int main(int argc, char** argv) {
  int ctas = 0;
  CHECK(cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, 0));
  if (argc > 1) ctas = std::min(ctas, std::max(1, std::atoi(argv[1])));
  const int64_t weight_bytes_per_cta = int64_t(4) << 20;  // 528 MB over 132 SMs: about the 1B LM head, not L2's
  Streams s{};
  s.weight_bytes_per_cta = weight_bytes_per_cta;
  s.steps = int(weight_bytes_per_cta / kStepBytes / kWarps);
  char* weights = nullptr;
  char* rows = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&weights, weight_bytes_per_cta * ctas));
  CHECK(cudaMalloc(&rows, int64_t(4) << 20));
  CHECK(cudaMalloc(&sink, ctas * sizeof(uint32_t)));
  CHECK(cudaMemset(weights, 0x5a, weight_bytes_per_cta * ctas));
  CHECK(cudaMemset(rows, 0x3c, int64_t(4) << 20));
  s.weights = weights;
  s.rows = rows;
  for (const Kernel kernel : {stream, stream_bulk}) {
    std::printf("%d CTAs of %d warps, 4 KB steps, %d a warp in flight, %s\n", ctas, kWarps, kRing - 1,
                kernel == stream ? "16-byte cp.async a lane" : "one bulk copy a step");
    // 256 KB: 64 rows of the 1B shape's K = 2048; 1 MB: 64 rows of 8192 (the 1B down) or 128 of 4096
    for (const int64_t rows_bytes : {int64_t(256) << 10, int64_t(1) << 20}) {
      s.rows_bytes = rows_bytes;
      measure(kernel, s, ctas, sink, 8, false);
      measure(kernel, s, ctas, sink, 8, true);
      measure(kernel, s, ctas, sink, 5, false);  // the 1B batch-64 mix: about two thirds rows
      measure(kernel, s, ctas, sink, 5, true);
    }
    measure(kernel, s, ctas, sink, 0, false);  // weights alone, for scale
  }
  return 0;
}
