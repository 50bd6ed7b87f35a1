// Probe: what one launch from an idle GPU costs beside the SMs' own span, for a grid shaped like the megakernel's
// (132 CTAs of 384 threads, 225 KB of shared memory, 2688 bytes of parameters) and for lighter ones.
// NOTE: a traced one-layer seed launch measured 147.5 us between its events but 130.6 us from its SMs' first start
// to their last end; this probe put ~6.7 us of that on the launch itself and the rest on the trace's own set-up
// (docs/perf.md, thirty-third session, run 3).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_common.cuh"

namespace {

constexpr int kMegakernelParamBytes = 2688;  // sizeof(MegakernelParams): 17 tensor maps and the rest
constexpr int kMegakernelSmemBytes = 230576;
constexpr int kMegakernelThreads = 384;
constexpr int kLaunches = 200;

struct alignas(64) BigParams {
  unsigned char bytes[kMegakernelParamBytes];
};

struct Span {
  unsigned long long first_start;
  unsigned long long last_end;
};

// Each CTA's thread 0 stamps the global timer as it starts and as it ends (after `spin` ns), so that the launch's
// event time can be set beside the span its CTAs were resident.
template <typename Params>
__global__ void stamped(Params params, Span* span, uint64_t spin) {
  if (threadIdx.x != 0) return;
  atomicMin(&span->first_start, static_cast<unsigned long long>(now_ns()));
  spin_ns(spin + (params.bytes[0] & 1));  // reads the parameters, as the megakernel does
  atomicMax(&span->last_end, static_cast<unsigned long long>(now_ns()));
}

struct SmallParams {
  unsigned char bytes[16];
};

struct Figures {
  double event_us;  // median between the events
  double span_us;   // median of the CTAs' first start to last end
  double host_us;   // median time of the launch call on the host
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// kLaunches launches, each from an idle GPU (a synchronization between them), as `mk run` and bench.py time theirs.
template <typename Params>
Figures time_launches(int blocks, int threads, int smem_bytes, uint64_t spin, bool graph) {
  CHECK(cudaFuncSetAttribute(stamped<Params>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  Params params{};
  Span* span = nullptr;
  CHECK(cudaMalloc(&span, sizeof(Span)));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t captured;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    stamped<Params><<<blocks, threads, smem_bytes, stream>>>(params, span, spin);
    CHECK(cudaStreamEndCapture(stream, &captured));
    CHECK(cudaGraphInstantiate(&exec, captured, 0));
    CHECK(cudaGraphDestroy(captured));
  }
  std::vector<double> event_us, span_us, host_us;
  for (int i = 0; i < kLaunches + 5; ++i) {
    const Span reset{~0ull, 0ull};
    CHECK(cudaMemcpy(span, &reset, sizeof(Span), cudaMemcpyHostToDevice));
    CHECK(cudaEventRecord(start, stream));
    const auto before = std::chrono::steady_clock::now();
    if (graph) {
      CHECK(cudaGraphLaunch(exec, stream));
    } else {
      stamped<Params><<<blocks, threads, smem_bytes, stream>>>(params, span, spin);
    }
    const auto after = std::chrono::steady_clock::now();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaGetLastError());
    if (i < 5) continue;  // the first launches load the module and warm the driver's paths
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    Span seen;
    CHECK(cudaMemcpy(&seen, span, sizeof(Span), cudaMemcpyDeviceToHost));
    event_us.push_back(ms * 1e3);
    span_us.push_back((seen.last_end - seen.first_start) * 1e-3);
    host_us.push_back(std::chrono::duration<double, std::micro>(after - before).count());
  }
  if (exec != nullptr) CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(span));
  return {median(event_us), median(span_us), median(host_us)};
}

void report(const char* what, const Figures& f) {
  std::printf("%-58s events %7.2f us  span %7.2f us  outside the span %6.2f us  launch call %5.2f us\n", what,
              f.event_us, f.span_us, f.event_us - f.span_us, f.host_us);
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (uint64_t spin : {uint64_t(0), uint64_t(100000)}) {
    std::printf("CTAs spin %llu us after they start:\n", static_cast<unsigned long long>(spin / 1000));
    report("  megakernel-shaped (2688 B params, 225 KB smem, 384 thr)",
           time_launches<BigParams>(sms, kMegakernelThreads, kMegakernelSmemBytes, spin, false));
    report("  the same, 16 B params",
           time_launches<SmallParams>(sms, kMegakernelThreads, kMegakernelSmemBytes, spin, false));
    report("  the same, no shared memory", time_launches<SmallParams>(sms, kMegakernelThreads, 0, spin, false));
    report("  one CTA of 32 threads, 16 B params", time_launches<SmallParams>(1, 32, 0, spin, false));
    report("  megakernel-shaped, replayed from a CUDA graph",
           time_launches<BigParams>(sms, kMegakernelThreads, kMegakernelSmemBytes, spin, true));
  }
  return 0;
}
