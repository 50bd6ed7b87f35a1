// Standalone probe: a hand-off between SMs and a dependent load, timed beside HBM streamed as decode's weight tiles do.
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/hop_latency_probe.cu -o /tmp/hop
//
// Why: batch-1 decode is a chain of dependent hand-offs between SMs (q/kv -> attention -> combine -> o_proj, about a
// dozen L2 round trips a layer), and every attempt to stream weights while that chain runs lengthened the chain
// (docs/perf.md, ninth, sixteenth, eighteenth and twenty-ninth sessions). This measures the mechanism directly: how
// long one hand-off (a release add seen by another SM's acquire spin) and one dependent load take when HBM is idle
// and when the other SMs stream at 1-6 steps of 4 KB in flight a warp, and what rate each depth streams at.
// The grid is launched in clusters of two, to ask whether a hand-off inside a cluster (distributed shared memory, which
// need not pass through L2) escapes the stream's queues. Cluster 0 (blocks 0, 1) ping-pongs a counter in global memory;
// cluster 1 (blocks 2, 3) a counter in the partner's shared memory (red.release.cluster, ld.acquire.cluster spin);
// cluster 2 (blocks 4, 5) pushes 16 bytes into the partner's shared memory with st.async, completing the partner's
// mbarrier; block 6 chases pointers through a 64 KB array; block 7 ping-pongs a global counter with the last block
// (another cluster, so likely another GPC: does the distance matter?); the blocks between stream (or idle at depth 0),
// the last cluster does not.
// NOTE: the chase revisits a line every 512 loads (74 us idle, 0.3-0.7 ms loaded): idle, its loads hit L2; beside the
// stream, which evicts the array between visits, they are HBM misses under load.
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
constexpr int kClusterSize = 2;
constexpr int kFirstStreamingBlock = 8;
constexpr int kEndStreamingBlocks = 2;  // the last cluster holds the far pair's pong
constexpr int kChaseLoads = 500;
constexpr int kChaseWords = 64 * 1024 / 4;      // (16384) u32: the chase's array, 64 KB, one hop per 128-byte line
constexpr uint64_t kWarmupNs = 30'000;          // the streams reach their rate before the probes start
constexpr uint64_t kStreamNs = 4'000'000;       // and outlast them (checked on the host)

// The same shared-memory offset in the cluster's other block.
__device__ __forceinline__ uint32_t partner_address(const void* pointer) {
  uint32_t rank, remote;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(pointer)), "r"(rank ^ 1));
  return remote;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The four hand-offs timed side by side.
enum Hop { kGlobalCounter, kClusterCounter, kClusterPush, kGlobalFar, kHops };

// What the probe blocks and each streaming warp record (ns from globaltimer, bytes).
struct Records {
  uint64_t hop_begin[kHops], hop_end[kHops];  // kRoundTrips round trips each
  uint32_t push_sink;                          // the last value pushed, read so the data is used
  uint32_t smid[kHops][2];                     // the SMs of each pair's ping and pong
  uint64_t chase_begin, chase_end;  // block 6: kChaseLoads dependent loads
  uint32_t chase_sink;
  uint64_t* stream_begin;           // (streaming warps)
  uint64_t* stream_end;             // (streaming warps)
  uint64_t* stream_bytes;           // (streaming warps)
};

__device__ void ping(uint32_t* ping_counter, const uint32_t* pong_counter, Hop hop, Records* records) {
  spin_ns(kWarmupNs);
  records->hop_begin[hop] = now_ns();
  ping_pong(ping_counter, pong_counter, kRoundTrips, true);
  records->hop_end[hop] = now_ns();
}

// Each block of cluster 1 adds to the counter in its partner's shared memory and spins on its own.
__device__ void cluster_counter_hops(uint32_t* own_counter, bool is_ping, Records* records) {
  const uint32_t partner_counter = partner_address(own_counter);
  const uint32_t own = shared_address(own_counter);
  auto wait_for = [own](uint32_t count) {
    uint32_t value;
    do {
      asm volatile("ld.acquire.cluster.shared::cta.u32 %0, [%1];" : "=r"(value) : "r"(own) : "memory");
    } while (value < count);
  };
  auto signal = [partner_counter] {
    asm volatile("red.release.cluster.shared::cluster.add.u32 [%0], 1;" ::"r"(partner_counter) : "memory");
  };
  if (is_ping) {
    spin_ns(kWarmupNs);
    records->hop_begin[kClusterCounter] = now_ns();
  }
  for (uint32_t i = 1; i <= kRoundTrips; ++i) {
    if (is_ping) signal();
    wait_for(i);
    if (!is_ping) signal();
  }
  if (is_ping) records->hop_end[kClusterCounter] = now_ns();
}

// Each block of cluster 2 pushes 16 bytes into its partner's slot with st.async, which completes the partner's
// mbarrier (armed for 16 bytes a phase), and waits on its own: the form a combine's partials would take.
__device__ void cluster_push_hops(uint64_t* own_barrier, uint32_t* own_slot, bool is_ping, Records* records) {
  const uint32_t barrier = shared_address(own_barrier);
  const uint32_t partner_barrier = partner_address(own_barrier);
  const uint32_t partner_slot = partner_address(own_slot);
  auto arm = [barrier] {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 16;" ::"r"(barrier) : "memory");
  };
  auto wait_phase = [barrier](uint32_t parity) {
    uint32_t done;
    do {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}"
          : "=r"(done)
          : "r"(barrier), "r"(parity)
          : "memory");
    } while (!done);
  };
  auto push = [partner_slot, partner_barrier](uint32_t value) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.u32 [%0], {%1, %1, %1, %1}, [%2];" ::"r"(
                     partner_slot),
                 "r"(value), "r"(partner_barrier)
                 : "memory");
  };
  if (is_ping) {
    spin_ns(kWarmupNs);
    records->hop_begin[kClusterPush] = now_ns();
  }
  for (uint32_t i = 0; i < kRoundTrips; ++i) {
    if (is_ping) push(i);
    wait_phase(i & 1);
    arm();  // for the next phase, before this block's push can draw the partner's reply
    if (!is_ping) push(i);
  }
  if (is_ping) {
    records->hop_end[kClusterPush] = now_ns();
    records->push_sink = own_slot[0];
  }
}

__device__ void chase(const uint32_t* next, Records* records) {
  spin_ns(kWarmupNs);
  uint32_t at = 0;
  for (int i = 0; i < kChaseWords / 32; ++i) at = __ldcg(next + at);  // idle, the timed loads then hit L2
  records->chase_begin = now_ns();
  for (int i = 0; i < kChaseLoads; ++i) at = __ldcg(next + at);
  records->chase_end = now_ns();
  records->chase_sink = at;
}

// One warp streams its slice at kDepth steps in flight until kStreamNs have passed, and records it.
template <int kDepth>
__device__ void stream(const uint8_t* slice, uint8_t* ring, int warp_index, Records* records) {
  const uint64_t start = now_ns();
  const uint64_t bytes = stream_slice<kDepth, kStepBytes>(slice, kWarpSliceBytes, ring, kStreamNs);
  if (threadIdx.x % 32 == 0) {
    records->stream_begin[warp_index] = start;
    records->stream_end[warp_index] = now_ns();
    records->stream_bytes[warp_index] = bytes;
  }
}

template <int kDepth>
__global__ void __launch_bounds__(kThreads) probe(const uint8_t* weights, uint32_t* counters,
                                                  const uint32_t* chase_next, Records* records) {
  extern __shared__ __align__(128) uint8_t smem[];  // (kWarps, kMaxDepth, kStepBytes): each warp's ring
  __shared__ uint64_t barrier;                      // cluster 2's push hand-off
  __shared__ __align__(16) uint32_t slot[4];        // (4) where the partner's push lands
  __shared__ uint32_t counter;                      // cluster 1's counter hand-off
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    counter = 0;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&barrier)) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 16;" ::"r"(shared_address(&barrier)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();  // the partner's counter and barrier are set before any hand-off touches them
  const bool is_ping = blockIdx.x % 2 == 0;
  const int last = gridDim.x - 1;
  if (threadIdx.x == 0 && (blockIdx.x < kFirstStreamingBlock || blockIdx.x == last)) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    // Blocks 0-5 are three pairs in block order; block 7 and the last are the far pair; block 6 (the chase) is none.
    const int hop = blockIdx.x == 7 || blockIdx.x == last ? kGlobalFar : blockIdx.x == 6 ? kHops : blockIdx.x / 2;
    if (hop < kHops) records->smid[hop][blockIdx.x == last ? 1 : blockIdx.x == 7 ? 0 : blockIdx.x % 2] = smid;
  }
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) ping(counters, counters + 32, kGlobalCounter, records);
  } else if (blockIdx.x == 1) {
    if (threadIdx.x == 0) ping_pong(counters + 32, counters, kRoundTrips, false);
  } else if (blockIdx.x == 7) {
    if (threadIdx.x == 0) ping(counters + 64, counters + 96, kGlobalFar, records);
  } else if (blockIdx.x == last) {
    if (threadIdx.x == 0) ping_pong(counters + 96, counters + 64, kRoundTrips, false);
  } else if (blockIdx.x < 4) {
    if (threadIdx.x == 0) cluster_counter_hops(&counter, is_ping, records);
  } else if (blockIdx.x < 6) {
    if (threadIdx.x == 0) cluster_push_hops(&barrier, slot, is_ping, records);
  } else if (blockIdx.x == 6) {
    if (threadIdx.x == 0) chase(chase_next, records);
  } else if (blockIdx.x >= kFirstStreamingBlock && blockIdx.x < last + 1 - kEndStreamingBlocks) {
    if constexpr (kDepth > 0) {
      const int warp_index = (blockIdx.x - kFirstStreamingBlock) * kWarps + warp;
      stream<kDepth>(weights + warp_index * kWarpSliceBytes, smem + warp * kMaxDepth * kStepBytes, warp_index,
                     records);
    }
  }
  cluster_sync();  // no block leaves while its partner may still write into its shared memory
}

// The device buffers a run uses, and host copies of the streaming warps' records.
struct Context {
  int blocks;                  // whole clusters that fit at once (all 132 SMs where pairs of SMs allow it)
  const uint8_t* weights;      // (streaming warps, kWarpSliceBytes)
  uint32_t* counters;          // (128) near ping at 0, pong at 32, far ping at 64, pong at 96: separate lines
  const uint32_t* chase_next;  // (kChaseWords)
  Records* records;            // device copy of `arrays`, filled by the probe
  Records arrays;              // the streaming warps' device arrays
  std::vector<uint64_t> begin, end, bytes;  // (streaming warps) host copies
};

struct Measured {
  double hop_ns[kHops], chase_ns, stream_tbps;
  uint32_t smid[kHops][2];
  bool streams_outlasted_probes;
};

cudaLaunchConfig_t launch_config(int blocks) {
  static cudaLaunchAttribute cluster;
  return cluster_launch_config(blocks, kThreads, kSmemBytes, kClusterSize, cluster);
}

template <int kDepth>
Measured run(Context& c) {
  const int streaming_warps = (c.blocks - kFirstStreamingBlock - kEndStreamingBlocks) * kWarps;
  CHECK(cudaMemset(c.counters, 0, 128 * sizeof(uint32_t)));
  CHECK(cudaMemset(c.arrays.stream_bytes, 0, streaming_warps * sizeof(uint64_t)));
  CHECK(cudaFuncSetAttribute(probe<kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaLaunchConfig_t config = launch_config(c.blocks);
  CHECK(cudaLaunchKernelEx(&config, probe<kDepth>, c.weights, c.counters, c.chase_next, c.records));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  Records host;
  CHECK(cudaMemcpy(&host, c.records, sizeof(Records), cudaMemcpyDeviceToHost));
  Measured m{};
  for (int hop = 0; hop < kHops; ++hop) {
    m.hop_ns[hop] = double(host.hop_end[hop] - host.hop_begin[hop]) / kRoundTrips / 2;
    m.smid[hop][0] = host.smid[hop][0];
    m.smid[hop][1] = host.smid[hop][1];
  }
  if (host.push_sink != kRoundTrips - 1) {
    std::fprintf(stderr, "the cluster push delivered %u, not %d\n", host.push_sink, kRoundTrips - 1);
    std::exit(1);
  }
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
  m.streams_outlasted_probes =
      first_end > std::max({*std::max_element(host.hop_end, host.hop_end + kHops), host.chase_end});
  return m;
}

}  // namespace

int main() {
  Context c{};
  int sms = 0, clusters = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(probe<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaLaunchConfig_t config = launch_config(sms);
  CHECK(cudaOccupancyMaxActiveClusters(&clusters, probe<6>, &config));
  c.blocks = std::min(sms, clusters * kClusterSize);  // every block resident at once: the pairs spin on each other
  const int streaming_warps = (c.blocks - kFirstStreamingBlock - kEndStreamingBlocks) * kWarps;
  const int64_t weight_bytes = int64_t(streaming_warps) * kWarpSliceBytes;
  uint8_t* weights = nullptr;
  uint32_t* chase_next = nullptr;
  CHECK(cudaMalloc(&weights, weight_bytes));
  CHECK(cudaMemset(weights, 1, weight_bytes));
  c.weights = weights;
  CHECK(cudaMalloc(&c.counters, 128 * sizeof(uint32_t)));
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

  std::printf("%d SMs, %d in clusters of 2 at once: 4 hand-off pairs, a chase, %d SMs streaming (%d warps, 4 KB "
              "steps)\n",
              sms, c.blocks, streaming_warps / kWarps, streaming_warps);
  std::printf("%-28s %12s %12s %12s %12s %12s %12s\n", "streaming depth", "global (ns)", "dsmem ctr", "dsmem push",
              "global far", "chase (ns)", "stream TB/s");
  auto report = [](const char* name, const Measured& m) {
    std::printf("%-28s %12.0f %12.0f %12.0f %12.0f %12.0f %12.2f%s\n", name, m.hop_ns[kGlobalCounter],
                m.hop_ns[kClusterCounter], m.hop_ns[kClusterPush], m.hop_ns[kGlobalFar], m.chase_ns, m.stream_tbps,
                m.streams_outlasted_probes ? "" : "  (streams ended before the probes: not a loaded figure)");
  };
  const Measured placement = run<0>(c);
  std::printf("SMs of each pair (ping, pong): global %u %u, dsmem counter %u %u, dsmem push %u %u, global far %u %u\n",
              placement.smid[0][0], placement.smid[0][1], placement.smid[1][0], placement.smid[1][1],
              placement.smid[2][0], placement.smid[2][1], placement.smid[3][0], placement.smid[3][1]);
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
