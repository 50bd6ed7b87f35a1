// Standalone probe: a hand-off between SMs and a dependent load, timed beside HBM streamed as decode's weight tiles do.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/hop_latency_probe.cu -o /tmp/hop
//
// Why: batch-1 decode is a chain of dependent hand-offs between SMs (q/kv -> attention -> combine -> o_proj, about a
// dozen L2 round trips a layer), and every attempt to stream weights while that chain runs lengthened the chain
// (docs/perf.md, ninth, sixteenth, eighteenth and twenty-ninth sessions). This measures the mechanism directly: how
// long one hand-off (a release add seen by another SM's acquire spin) and one dependent load take when HBM is idle
// and when the other SMs stream at 1-6 steps of 4 KB in flight a warp, and what rate each depth streams at. Block 0
// and block 1 ping-pong a counter, block 2 chases pointers through a 64 KB array, blocks 3.. stream (or idle at
// depth 0). NOTE: the chase revisits a line every 512 loads (74 us idle, 0.3-0.7 ms loaded): idle, its loads hit
// L2; beside the stream, which evicts the array between visits, they are HBM misses under load.
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStepBytes = 4096;                // one warp's weight step, as the CUDA-core decode GEMM streams it
constexpr int64_t kWarpSliceBytes = 1 << 20;    // each streaming warp cycles through its own 1 MB: 1 GB over the chip
constexpr int kMaxDepth = 6;  // steps in flight a warp at most: 6 x 4 KB x 8 warps = 192 KB, one block an SM
constexpr int kSmemBytes = kMaxDepth * kStepBytes * kWarps;
constexpr int kRoundTrips = 200;
constexpr int kChaseLoads = 500;
constexpr int kChaseWords = 64 * 1024 / 4;      // (16384) u32: the chase's array, 64 KB, one hop per 128-byte line
constexpr uint64_t kWarmupNs = 30'000;          // the streams reach their rate before the probes start
constexpr uint64_t kStreamNs = 4'000'000;       // and outlast them (checked on the host)

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void add_release(uint32_t* address, uint32_t value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// What the probe blocks and each streaming warp record (ns from globaltimer, bytes).
struct Records {
  uint64_t hop_begin, hop_end;      // block 0: kRoundTrips round trips
  uint64_t chase_begin, chase_end;  // block 2: kChaseLoads dependent loads
  uint32_t chase_sink;
  uint64_t* stream_begin;           // (streaming warps)
  uint64_t* stream_end;             // (streaming warps)
  uint64_t* stream_bytes;           // (streaming warps)
};

__device__ void ping(uint32_t* ping_counter, const uint32_t* pong_counter, Records* records) {
  const uint64_t start = now_ns();
  while (now_ns() - start < kWarmupNs) {
  }
  records->hop_begin = now_ns();
  for (uint32_t i = 1; i <= kRoundTrips; ++i) {
    add_release(ping_counter, 1);
    while (load_acquire(pong_counter) < i) {
    }
  }
  records->hop_end = now_ns();
}

__device__ void pong(const uint32_t* ping_counter, uint32_t* pong_counter) {
  for (uint32_t i = 1; i <= kRoundTrips; ++i) {
    while (load_acquire(ping_counter) < i) {
    }
    add_release(pong_counter, 1);
  }
}

__device__ void chase(const uint32_t* next, Records* records) {
  const uint64_t start = now_ns();
  while (now_ns() - start < kWarmupNs) {
  }
  uint32_t at = 0;
  for (int i = 0; i < kChaseWords / 32; ++i) at = __ldcg(next + at);  // idle, the timed loads then hit L2
  records->chase_begin = now_ns();
  for (int i = 0; i < kChaseLoads; ++i) at = __ldcg(next + at);
  records->chase_end = now_ns();
  records->chase_sink = at;
}

// One warp streams its slice (kWarpSliceBytes, cycled) through its ring (kDepth x 4 KB of shared memory) until
// kStreamNs have passed, as a decode weight tile's warp does, without the math between steps.
template <int kDepth>
__device__ void stream(const uint8_t* slice, uint8_t* ring, int warp_index, Records* records) {
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
    offset = (offset + kStepBytes) % kWarpSliceBytes;
    if ((step & 15) == 15) {
      // Lane 0 decides for the warp: lanes reading the clock apart could stop a group of steps apart.
      if (__shfl_sync(0xffffffffu, now_ns() - start > kStreamNs, 0)) break;
    }
  }
  cp_async_wait<0>();
  if (lane == 0) {
    records->stream_begin[warp_index] = start;
    records->stream_end[warp_index] = now_ns();
    records->stream_bytes[warp_index] = bytes;
  }
}

template <int kDepth>
__global__ void __launch_bounds__(kThreads) probe(const uint8_t* weights, uint32_t* counters,
                                                  const uint32_t* chase_next, Records* records) {
  extern __shared__ __align__(128) uint8_t smem[];  // (kWarps, kMaxDepth, kStepBytes): each warp's ring
  const int warp = threadIdx.x / 32;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) ping(counters, counters + 32, records);
  } else if (blockIdx.x == 1) {
    if (threadIdx.x == 0) pong(counters, counters + 32);
  } else if (blockIdx.x == 2) {
    if (threadIdx.x == 0) chase(chase_next, records);
  } else if constexpr (kDepth > 0) {
    const int warp_index = (blockIdx.x - 3) * kWarps + warp;
    stream<kDepth>(weights + warp_index * kWarpSliceBytes, smem + warp * kMaxDepth * kStepBytes,
                   warp_index, records);
  }
}

// The device buffers a run uses, and host copies of the streaming warps' records.
struct Context {
  int sms;
  const uint8_t* weights;      // (streaming warps, kWarpSliceBytes)
  uint32_t* counters;          // (64) ping at 0, pong at 32: separate lines
  const uint32_t* chase_next;  // (kChaseWords)
  Records* records;            // device copy of `arrays`, filled by the probe
  Records arrays;              // the streaming warps' device arrays
  std::vector<uint64_t> begin, end, bytes;  // (streaming warps) host copies
};

struct Measured {
  double hop_ns, chase_ns, stream_tbps;
  bool streams_outlasted_probes;
};

template <int kDepth>
Measured run(Context& c) {
  const int streaming_warps = (c.sms - 3) * kWarps;
  CHECK(cudaMemset(c.counters, 0, 64 * sizeof(uint32_t)));
  CHECK(cudaMemset(c.arrays.stream_bytes, 0, streaming_warps * sizeof(uint64_t)));
  CHECK(cudaFuncSetAttribute(probe<kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  probe<kDepth><<<c.sms, kThreads, kSmemBytes>>>(c.weights, c.counters, c.chase_next, c.records);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  Records host;
  CHECK(cudaMemcpy(&host, c.records, sizeof(Records), cudaMemcpyDeviceToHost));
  Measured m{};
  m.hop_ns = double(host.hop_end - host.hop_begin) / kRoundTrips / 2;
  m.chase_ns = double(host.chase_end - host.chase_begin) / kChaseLoads;
  m.streams_outlasted_probes = true;
  if (kDepth == 0) return m;
  const size_t bytes = streaming_warps * sizeof(uint64_t);
  CHECK(cudaMemcpy(c.begin.data(), c.arrays.stream_begin, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(c.end.data(), c.arrays.stream_end, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(c.bytes.data(), c.arrays.stream_bytes, bytes, cudaMemcpyDeviceToHost));
  const uint64_t begin = *std::min_element(c.begin.begin(), c.begin.end());
  const uint64_t end = *std::max_element(c.end.begin(), c.end.end());
  const uint64_t first_end = *std::min_element(c.end.begin(), c.end.end());
  uint64_t streamed = 0;
  for (uint64_t b : c.bytes) streamed += b;
  m.stream_tbps = double(streamed) / double(end - begin) / 1e3;
  m.streams_outlasted_probes = first_end > std::max(host.hop_end, host.chase_end);
  return m;
}

}  // namespace

int main() {
  Context c{};
  CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, 0));
  const int streaming_warps = (c.sms - 3) * kWarps;
  const int64_t weight_bytes = int64_t(streaming_warps) * kWarpSliceBytes;
  uint8_t* weights = nullptr;
  uint32_t* chase_next = nullptr;
  CHECK(cudaMalloc(&weights, weight_bytes));
  CHECK(cudaMemset(weights, 1, weight_bytes));
  c.weights = weights;
  CHECK(cudaMalloc(&c.counters, 64 * sizeof(uint32_t)));
  CHECK(cudaMalloc(&c.records, sizeof(Records)));
  CHECK(cudaMalloc(&c.arrays.stream_begin, streaming_warps * sizeof(uint64_t)));
  CHECK(cudaMalloc(&c.arrays.stream_end, streaming_warps * sizeof(uint64_t)));
  CHECK(cudaMalloc(&c.arrays.stream_bytes, streaming_warps * sizeof(uint64_t)));
  CHECK(cudaMemcpy(c.records, &c.arrays, sizeof(Records), cudaMemcpyHostToDevice));
  // A random cycle over the array's 512 lines, so that no prefetcher can run ahead of the chase.
  std::vector<uint32_t> next(kChaseWords, 0);        // (kChaseWords) the word index to load next, at each line's start
  std::vector<uint32_t> order(kChaseWords / 32);     // (lines) the cycle's order of the lines' first words
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i * 32;
  uint32_t state = 12345;
  for (size_t i = order.size() - 1; i > 0; --i) {
    state = state * 1664525u + 1013904223u;
    std::swap(order[i], order[state % (i + 1)]);
  }
  for (size_t i = 0; i < order.size(); ++i) next[order[i]] = order[(i + 1) % order.size()];
  CHECK(cudaMalloc(&chase_next, kChaseWords * sizeof(uint32_t)));
  CHECK(cudaMemcpy(chase_next, next.data(), kChaseWords * sizeof(uint32_t), cudaMemcpyHostToDevice));
  c.chase_next = chase_next;
  c.begin.resize(streaming_warps);
  c.end.resize(streaming_warps);
  c.bytes.resize(streaming_warps);

  std::printf("%d SMs: block 0 <-> block 1 hand-offs, block 2 chase, %d SMs streaming (%d warps, 4 KB steps)\n",
              c.sms, c.sms - 3, streaming_warps);
  std::printf("%-28s %10s %12s %12s\n", "streaming depth", "hop (ns)", "chase (ns)", "stream TB/s");
  auto report = [](const char* name, const Measured& m) {
    std::printf("%-28s %10.0f %12.0f %12.2f%s\n", name, m.hop_ns, m.chase_ns, m.stream_tbps,
                m.streams_outlasted_probes ? "" : "  (streams ended before the probes: not a loaded figure)");
  };
  for (int repeat = 0; repeat < 2; ++repeat) {
    report("idle (no streaming)", run<0>(c));
    report("1 step (4 KB) a warp", run<1>(c));
    report("2 steps (8 KB) a warp", run<2>(c));
    report("3 steps (12 KB) a warp", run<3>(c));
    report("4 steps (16 KB, decode's)", run<4>(c));
    report("6 steps (24 KB) a warp", run<6>(c));
  }
  return 0;
}
