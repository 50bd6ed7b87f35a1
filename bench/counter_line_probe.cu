// Standalone probe: does a hand-off's cost beside streaming HBM depend on which L2 line its counter lives in?
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/counter_line_probe.cu -o /tmp/line
//
// Why: hop_latency_probe.cu timed one global-memory hand-off between two SMs at 1.2 to 8.7 us while the other SMs
// streamed HBM at decode's depth, varying with the pair and the run, and 0.5-0.7 us idle (docs/perf.md, thirtieth and
// thirty-first sessions). If the spread comes from where the counter lives (an L2 slice in the SMs' own half of the
// L2, or across the link between the halves, which the stream loads), then decode could place each counter where its
// waiters read it fast, and the chain's hand-offs (a dozen a layer) would shorten under load. So for each of
// kLines lines this times, between the same two SMs: each SM's dependent L2 hit on the line (idle), and a counter
// ping-pong on the line idle and while the other SMs stream at 4 steps of 4 KB a warp.
#include <cuda_runtime.h>

#include "probe_common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStepBytes = 4096;
constexpr int kDepth = 4;                       // decode's weight ring: 4 steps of 4 KB in flight a warp
constexpr int64_t kWarpSliceBytes = 1 << 20;    // each streaming warp cycles through its own 1 MB
constexpr int kSmemBytes = kDepth * kStepBytes * kWarps;
constexpr int kLines = 48;
constexpr int kLineWords = 32;                  // 128 bytes
constexpr int kLineStrideWords = 33 * 32;       // lines 4224 bytes apart: their addresses differ in many bits
constexpr int kRoundTrips = 100;
constexpr int kHitLoads = 64;
constexpr uint64_t kWarmupNs = 30'000;
constexpr uint64_t kHitGapNs = 15'000;         // outlasts ping's kHitLoads hits (~64 x 200 ns), so pong's follow
constexpr uint64_t kStreamNs = 6'000'000;       // outlasts 100 round trips at 8.7 us a hop (checked on the host)

// What blocks 0 (ping) and 1 (pong) record for one line: ns from globaltimer.
struct Records {
  uint64_t hit_ns[2];              // kHitLoads dependent L2 hits on the line, from block 0's SM and block 1's
  uint64_t hop_begin, hop_end;     // kRoundTrips round trips
  uint64_t first_stream_end;       // the earliest streaming warp's end (0: none streamed)
  uint32_t smid[2];                // block 0's SM, block 1's
  uint32_t sink[2];                // each block's last hit value, so the loads are used
};

// kHitLoads dependent loads of the line's word 16, which holds 0: each address depends on the last value.
__device__ uint64_t time_hits(const uint32_t* line, uint32_t* sink) {
  uint32_t at = __ldcg(line + 16);  // now in L2
  const uint64_t begin = now_ns();
  for (int i = 0; i < kHitLoads; ++i) at = __ldcg(line + 16 + at);
  const uint64_t end = now_ns();
  *sink += at;
  return end - begin;
}

// Blocks 0 and 1 time the line; with `streaming`, the other blocks stream meanwhile.
__global__ void __launch_bounds__(kThreads) probe(const uint8_t* weights, uint32_t* line, bool streaming,
                                                  Records* records) {
  extern __shared__ __align__(128) uint8_t smem[];  // (kWarps, kDepth, kStepBytes): each warp's ring
  const int warp = threadIdx.x / 32;
  if (blockIdx.x < 2) {
    if (threadIdx.x != 0) return;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(records->smid[blockIdx.x]));
    // One SM at a time times its hits, before any hand-off.
    if (blockIdx.x == 1) spin_ns(kHitGapNs);
    records->hit_ns[blockIdx.x] = time_hits(line, &records->sink[blockIdx.x]);
    spin_ns(kWarmupNs - (blockIdx.x == 1 ? kHitGapNs : 0));
    // Word 0 is the ping's counter, word 1 the pong's: one line, so one L2 slice serves both directions.
    const bool is_ping = blockIdx.x == 0;
    if (is_ping) records->hop_begin = now_ns();
    ping_pong(line + (is_ping ? 0 : 1), line + (is_ping ? 1 : 0), kRoundTrips, is_ping);
    if (is_ping) records->hop_end = now_ns();
  } else if (streaming) {
    const int warp_index = (blockIdx.x - 2) * kWarps + warp;
    stream_slice<kDepth, kStepBytes>(weights + warp_index * kWarpSliceBytes, kWarpSliceBytes,
                                     smem + warp * kDepth * kStepBytes, kStreamNs);
    const uint64_t end = now_ns();
    if (threadIdx.x % 32 == 0) atomicMin(reinterpret_cast<unsigned long long*>(&records->first_stream_end), end);
  }
}

struct Measured {
  double hit_ns[2], hop_ns;
  uint32_t smid[2];
};

Measured run(int blocks, const uint8_t* weights, uint32_t* line, bool streaming, Records* records) {
  Records clean{};
  clean.first_stream_end = streaming ? ~0ull : 0;
  CHECK(cudaMemcpy(records, &clean, sizeof(Records), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(line, 0, kLineWords * sizeof(uint32_t)));
  probe<<<blocks, kThreads, kSmemBytes>>>(weights, line, streaming, records);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  Records host;
  CHECK(cudaMemcpy(&host, records, sizeof(Records), cudaMemcpyDeviceToHost));
  if (streaming && host.first_stream_end < host.hop_end) {
    std::fprintf(stderr, "a stream ended before the hand-offs: raise kStreamNs\n");
    std::exit(1);
  }
  return {{double(host.hit_ns[0]) / kHitLoads, double(host.hit_ns[1]) / kHitLoads},
          double(host.hop_end - host.hop_begin) / kRoundTrips / 2,
          {host.smid[0], host.smid[1]}};
}

}  // namespace

int main() {
  int sms = 0, per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe, kThreads, kSmemBytes));
  if (per_sm != 1) {
    std::fprintf(stderr, "%d blocks fit an SM, not 1: the pair's SMs would also stream\n", per_sm);
    return 1;
  }
  const int streaming_warps = (sms - 2) * kWarps;
  const int64_t weight_bytes = int64_t(streaming_warps) * kWarpSliceBytes;
  uint8_t* weights = nullptr;
  uint32_t* lines = nullptr;  // (kLines, kLineStrideWords) a line at the start of each stride
  Records* records = nullptr;
  CHECK(cudaMalloc(&weights, weight_bytes));
  CHECK(cudaMemset(weights, 1, weight_bytes));
  CHECK(cudaMalloc(&lines, kLines * kLineStrideWords * sizeof(uint32_t)));
  CHECK(cudaMalloc(&records, sizeof(Records)));

  std::printf("%d SMs: blocks 0 and 1 time each line, %d SMs stream at %d steps of 4 KB a warp when loaded\n", sms,
              sms - 2, kDepth);
  std::printf("%-6s %12s %12s %12s %12s %12s\n", "line", "hit ping ns", "hit pong ns", "hop idle", "hop loaded",
              "hop loaded");
  std::vector<double> loaded(kLines);  // (kLines) the first loaded repeat, for the summary
  uint32_t smid[2] = {0, 0};
  for (int l = 0; l < kLines; ++l) {
    uint32_t* line = lines + l * kLineStrideWords;
    const Measured idle = run(sms, weights, line, false, records);
    const Measured first = run(sms, weights, line, true, records);
    const Measured second = run(sms, weights, line, true, records);
    smid[0] = idle.smid[0];
    smid[1] = idle.smid[1];
    loaded[l] = first.hop_ns;
    std::printf("%-6d %12.0f %12.0f %12.0f %12.0f %12.0f\n", l, idle.hit_ns[0], idle.hit_ns[1], idle.hop_ns,
                first.hop_ns, second.hop_ns);
  }
  std::sort(loaded.begin(), loaded.end());
  std::printf("pair on SMs %u and %u; loaded hop over the lines: min %.0f, median %.0f, max %.0f ns\n", smid[0],
              smid[1], loaded.front(), loaded[kLines / 2], loaded.back());
  return 0;
}
