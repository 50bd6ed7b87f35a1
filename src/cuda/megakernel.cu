// The megakernel: one persistent CTA per SM runs that SM's instruction list. In warpgroup 0 one thread produces
// (streams tiles into the shared-memory ring with TMA once their counters are met, running ahead across instructions),
// one warp polls those counters ahead of it (in decode passes: every instruction's, ahead of the consumers), and one
// thread stores (TMA stores of finished GEMM and attention tiles, then their publication); warpgroups 1 and 2 consume
// (wgmma, row-wise and decode math with plain loads, epilogues, publication of row-wise and decode tiles). Decode
// passes run the same body compiled for them alone (megakernel_decode), batches of 1-2 rows a compilation without
// the tensor-core decode GEMMs (megakernel_decode_narrow), and batches above kMaxMmaBatch one with the decode GEMMs
// on wgmma (megakernel_decode_wgmma).
#include <algorithm>

#include "device/config.cuh"
#include "device/ops/attention_wgmma.cuh"
#include "device/ops/decode_attention.cuh"
#include "device/ops/decode_combine.cuh"
#include "device/ops/decode_gemm.cuh"
#include "device/ops/decode_gemm_mma.cuh"
#include "device/ops/decode_gemm_passes.cuh"
#include "device/ops/gemm_epilogue.cuh"
#include "device/ops/gemm_sm90.cuh"
#include "device/ops/rowwise.cuh"
#include "device/ops/sample.cuh"
#include "device/ptx.cuh"
#include "device/sync.cuh"
#include "megakernel.h"

namespace mk::gpu {

namespace {

// Where everything lives in the CTA's shared memory: the stage ring, the output tile, the barriers, the flags.
// NOTE: the consumers rebuild it for every instruction rather than hold its 64-bit pointers in registers through
// their loop, where ptxas spilled loop state (the staged decode combine tipped it). The alignment is opaque, or the
// compiler hoists the rebuild out of the loop again.
__device__ __forceinline__ SharedState shared_state() {
  extern __shared__ uint8_t shared_raw[];
  const uint32_t base = ptx::smem_address(shared_raw);
  uint8_t* aligned = shared_raw + ptx::opaque(int32_t((1024 - base % 1024) % 1024));
  SharedState s;
  s.stages = aligned;
  s.output = aligned + KernelConfig::kNumStages * KernelConfig::kStageBytes;
  s.full = reinterpret_cast<uint64_t*>(s.output + KernelConfig::kOutputBytes);
  s.empty = s.full + KernelConfig::kNumStages;
  s.staged = s.empty + KernelConfig::kNumStages;
  s.output_free = s.staged + 1;
  s.loaded = s.output_free + 1;
  s.ready = s.loaded + 1;
  s.ready_free = s.ready + KernelConfig::kNumStages;
  s.held_loaded = s.ready_free + KernelConfig::kNumStages;
  s.flag = reinterpret_cast<volatile uint32_t*>(s.held_loaded + 1);
  s.freed = s.flag + 1;
  s.held_stage = s.freed + 1;
  s.last_of_group = s.held_stage + 1;
  return s;
}

__device__ uint64_t* trace_slots(const MegakernelParams& p, uint32_t instruction) {
  return p.trace_records != nullptr ? p.trace_records + uint64_t(instruction) * kTraceSlots : nullptr;
}

// Walks the SM's instructions in order that `keep(in)` takes: run(in, index, site) for each, until it returns false.
template <typename Keep, typename Run>
__device__ __forceinline__ void for_each_instruction(const MegakernelParams& p, uint32_t sm, Keep keep, Run run) {
  const uint32_t begin = p.sm_begin[sm];
  const uint32_t end = p.sm_begin[sm + 1];
  for (uint32_t i = begin; i < end; ++i) {
    const Instruction in = p.instructions[i];
    if (!keep(in)) continue;
    if (!run(in, i, Site{sm, i - begin, in.task})) return;
  }
}

// Linked decode combines: their last attention task runs them (run_combine_if_last); the SM that lists them skips
// them, its consumers and its counter poller alike.
__device__ __forceinline__ bool skipped_in_decode(const Instruction& in) {
  return (in.flags & kCombineRunByLastAttention) != 0;
}

// The instructions that go through the stage ring and the output tile.
__device__ __forceinline__ bool is_tile_instruction(Opcode opcode) {
  return is_gemm(opcode) || opcode == Opcode::kAttention;
}

// The SM's tile instructions, in order. The producer, the counter poller (outside decode passes) and the storer walk
// the same instructions (one report, one load and one store each), so they share it.
template <typename Run>
__device__ __forceinline__ void for_each_tile_instruction(const MegakernelParams& p, uint32_t sm, Run run) {
  for_each_instruction(p, sm, [](const Instruction& in) { return is_tile_instruction(in.opcode); }, run);
}

__device__ void run_producer(const MegakernelParams& p, const SharedState& s, uint32_t sm) {
  PipelineState state;
  PipelineState ready;  // the counter poller's next report (take_ready)
  OutputState output;
  for_each_tile_instruction(p, sm, [&](const Instruction& in, uint32_t i, Site site) {
    uint64_t* trace = trace_slots(p, i);
    if (trace) trace[kTraceProducerStart] = clock64();
    if (is_gemm(in.opcode)) {
      if (!produce_gemm(p, s, in, state, ready, output, site, trace)) return false;
    } else {
      if (!wait_ready(p, s, ready)) return false;
      if (trace) trace[kTraceProducerWaitsDone] = clock64();
      ptx::fence_proxy_async_global();  // the awaited tiles were written by generic or TMA stores; TMA reads them next
      if (!produce_attention(p, s, in, state, output, site)) return false;
    }
    if (trace) trace[kTraceProducerLoadsIssued] = clock64();
    return true;
  });
}

// One instruction of the counter poller's walk: waits until its counters are met, then reports it in the ready ring's
// next slot once the reader took that slot's last report. False when a wait gave up.
__device__ __forceinline__ bool poll_and_report(const MegakernelParams& p, const SharedState& s,
                                                const Instruction& in, Site site, uint32_t lane,
                                                PipelineState& ready) {
  if (!warp_wait_all_counters(p, in, site, lane)) return false;
  bool slot_free = true;
  if (lane == 0) slot_free = wait_barrier(p, &s.ready_free[ready.stage], ready.phase ^ 1, site);
  if (!__shfl_sync(0xffffffffu, slot_free, 0)) return false;
  // NOTE: every lane arrives (the barrier counts 32), so that each lane's acquires precede its own release in
  // program order, with no warp barrier in the chain to the reader.
  ptx::mbarrier_arrive(&s.ready[ready.stage]);
  ready.advance();
  return true;
}

// Checks the counters of the SM's GEMM and attention instructions in order, ahead of the producer, all 32 lanes at
// once, and reports each instruction whose counters are all met (acquired) to the producer through the ready ring;
// in decode passes every instruction's, to the consumers. NOTE: an attention tile at S=4096 waits on up to 32
// counters (one per qkv row block of its sequence). The producer checked them one acquire load after another, ~9 us
// a tile and mostly after the previous tile's last loads, so the consumers waited for it (trace, seventh session).
template <bool kDecode>
__device__ void run_counter_poller(const MegakernelParams& p, const SharedState& s, uint32_t sm, uint32_t lane) {
  PipelineState ready;  // the next slot of the ready ring
  // Decode passes have no tile instructions; the poller serves the consumers instead (consumers_wait), every
  // instruction they run. NOTE: the consumer thread that polled its counters itself is in a warp whose weight copies
  // are in flight, and its acquire loads took longer the more were: one more 4 KB step a warp before the wait made
  // batch 1's hops 1.1 -> 2.2 us (docs/perf.md, ninth session, run 5). This warp has no copies of its own.
  for_each_instruction(
      p, sm, [&](const Instruction& in) { return kDecode ? !skipped_in_decode(in) : is_tile_instruction(in.opcode); },
      [&](const Instruction& in, uint32_t, Site site) { return poll_and_report(p, s, in, site, lane, ready); });
}

__device__ void run_storer(const MegakernelParams& p, const SharedState& s, uint32_t sm) {
  OutputState output;
  for_each_tile_instruction(p, sm, [&](const Instruction& in, uint32_t i, Site site) {
    const bool attention = in.opcode == Opcode::kAttention;
    if (!(attention ? store_attention(p, s, in, output, site) : store_gemm(p, s, in, output, site))) return false;
    uint64_t* trace = trace_slots(p, i);
    if (trace) trace[kTracePublished] = clock64();
    return true;
  });
}

// One instruction of a forward or prefill pass in the consumer warpgroups; false when a wait gave up (aborting).
// NOTE: forced inline, as run_consumers: an outlined call makes ptxas serialize every wgmma of the kernel (C7510).
__device__ __forceinline__ bool run_forward_instruction(const MegakernelParams& p, const SharedState& s,
                                                        const Instruction& in, PipelineState& state,
                                                        OutputState& output, Site site, int warpgroup,
                                                        int thread_in_wg, int thread, uint64_t* trace) {
  bool ok = true;
  switch (in.opcode) {
    case Opcode::kEmbed:
      run_embed(p, in, thread);
      break;
    case Opcode::kAttnNorm:
    case Opcode::kMlpNorm:
    case Opcode::kFinalNorm:
      run_rmsnorm(p, in, thread);
      break;
    case Opcode::kAttention:
      ok = consume_attention(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
      break;
    case Opcode::kQkv:
    case Opcode::kOProj:
    case Opcode::kGateUp:
    case Opcode::kDown:
    case Opcode::kLmHead:
      ok = consume_gemm(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
      break;
    case Opcode::kKvAppend:
      run_kv_append(p, in, thread);
      break;
    default:
      if (thread == 0) report_error(p, kErrorBadInstruction, site, ~0u, uint32_t(in.opcode), 0);
      ok = false;
      break;
  }
  return ok;
}

// One instruction of a decode pass in the consumer warpgroups; false for an opcode decode passes do not have (combines
// are skipped, each run by its last attention task: run_combine_if_last).
// `prologue`: what a decode GEMM did before its wait (early_weight_prologue). kRows: as run_megakernel's.
template <DecodeRows kRows>
__device__ __forceinline__ bool run_decode_instruction(const MegakernelParams& p, const SharedState& s,
                                                       const Instruction& in, Site site, int thread,
                                                       const DecodePrologue& prologue) {
  switch (in.opcode) {
    case Opcode::kEmbed:
      run_embed(p, in, thread);
      return true;
    case Opcode::kDecodeQ:
    case Opcode::kDecodeKv:
    case Opcode::kDecodeOProj:
    case Opcode::kDecodeGateUp:
    case Opcode::kDecodeDown:
    case Opcode::kDecodeLmHead:
      run_decode_gemm<kRows>(p, s, in, prologue, thread);
      return true;
    case Opcode::kDecodeAttention:
      run_decode_attention<kRows != DecodeRows::kNarrow>(p, s, in, thread);
      return true;
    case Opcode::kSample:
      run_sample(p, s, in, thread);
      return true;
    default:
      if (thread == 0) report_error(p, kErrorBadInstruction, site, ~0u, uint32_t(in.opcode), 0);
      return false;
  }
}

// NOTE: forced inline: outlined, the call into it makes ptxas serialize every wgmma of the kernel (C7510).
template <bool kDecode, DecodeRows kRows>
__device__ __forceinline__ void run_consumers(const MegakernelParams& p, uint32_t sm, int consumer_thread) {
  const int warpgroup = consumer_thread / 128;
  const int thread_in_wg = consumer_thread % 128;
  PipelineState state;
  OutputState output;
  const uint32_t begin = p.sm_begin[sm];
  const uint32_t end = p.sm_begin[sm + 1];
  // NOTE: on an abort, GEMM and attention waits fail in some threads while others' stages had landed. A thread
  // leaving alone would hang the rest at the next all-consumer named barrier (the watchdog's exit instead of the
  // stall report), and one skipping a wgmma would break its warpgroup's. So failed threads go on (every later wait
  // fails at once; the tiles are garbage) to the next row-wise instruction, whose first barrier tells all to leave.
  bool healthy = true;
  PipelineState reported;  // decode: the counter poller's next report (consumers_wait)
  bool waited_for_previous_grid = false;
  for (uint32_t i = begin; i < end; ++i) {
    const Instruction in = p.instructions[i];
    if (kDecode && skipped_in_decode(in)) continue;
    const SharedState s = shared_state();
    // NOTE: opaque: what the row-wise and decode ops derive from the thread index (lanes, shared addresses) is
    // computed per instruction instead of hoisted out of this loop, where it stayed live across the GEMM tiles'
    // accumulators (ptxas spilled once the tensor-core decode path was added).
    const int thread = ptx::opaque(consumer_thread);
    const Site site{sm, i - begin, in.task};
    const bool rowwise = kDecode || !is_tile_instruction(in.opcode);
    uint64_t* trace = thread == 0 ? trace_slots(p, i) : nullptr;
    if (trace) trace[kTraceStart] = clock64();
    // NOTE: what consumers read through the stage ring and the output tile is ordered by their barriers (the
    // producer waited for the counter poller's report before loading); only row-wise ops read other SMs' results
    // with plain loads.
    // Decode: what depends on nothing in this launch (weights) starts before the counter wait.
    DecodePrologue prologue{};
    if constexpr (kDecode) {
      if (is_decode_gemm(in.opcode)) prologue = early_weight_prologue<kRows>(p, s, in, thread);
      // NOTE: in a decode group's later launches this grid may start while the previous kernel still runs
      // (programmatic dependent launch), so no consumer reads what the group's kernels write before this wait:
      // tokens (the embedding), positions and older cache rows (prestage reads both; the newest of those rows is the
      // previous step's), activations, counters, the abort flag. The weights above are none of that.
      if (!waited_for_previous_grid) ptx::griddepcontrol_wait();
      waited_for_previous_grid = true;
      if (in.opcode == Opcode::kDecodeAttention) prestage_decode_attention(p, s, in, thread);
    }
    if (rowwise && !consumers_wait<kDecode>(p, s, in, site, thread, healthy, reported)) {
      ptx::cp_async_wait<0>();  // the early copies land before the CTA leaves
      return;
    }
    if (trace) trace[kTraceWaitsDone] = clock64();
    bool ok;
    if constexpr (kDecode) {
      ok = run_decode_instruction<kRows>(p, s, in, site, thread, prologue);
    } else {
      ok = run_forward_instruction(p, s, in, state, output, site, warpgroup, thread_in_wg, thread, trace);
    }
    if (!ok && rowwise) return;
    healthy &= ok;
    if (rowwise) {
      // NOTE: stamped here rather than read back: a load of the trace slot would cost a trip to L2 per instruction.
      if (trace) trace[kTraceMathDone] = clock64();
      // The storer publishes GEMM and attention tiles. A linked attention task's counter has no waiter (its combine is
      // skipped where it is listed), and its ticket in run_combine_if_last releases the tile after this barrier.
      const bool released_by_ticket = kDecode && (in.flags & kAttentionRunsCombine) != 0;
      publish(p, in.signal_counter, thread, !released_by_ticket);
    }
    if (trace) trace[kTraceEnd] = clock64();
    if constexpr (kDecode) {
      if (in.flags & kAttentionRunsCombine)
        run_combine_if_last(p, s, in, sm, thread, thread == 0 ? trace_slots(p, in.combine_instruction) : nullptr);
    }
  }
  if (p.trace_sms != nullptr && consumer_thread == 0) {
    p.trace_sms[4 * sm + 2] = ptx::global_timer_ns();
    p.trace_sms[4 * sm + 3] = clock64();
  }
}

// The body of the three kernels. kDecode: decode passes, which have no GEMM or attention tiles (check_kernel_limits),
// so neither a producer nor a storer; compiled apart so that a decode step's code is about half the kernel's and fits
// the instruction cache better (docs/perf.md, sixteenth session: one-line changes moved decode steps ~1%, and ~1500
// added instructions made decode attention miss in code they did not touch). kRows (decode only): which decode GEMM
// passes are compiled; kNarrow: every pass is of 1-2 rows at full K (decode_narrow), so the tensor-core GEMM path is
// left out too; kWgmma (batch > kMaxMmaBatch): the decode GEMMs on wgmma, apart so that the smaller batches' kernel
// keeps its code.
template <bool kDecode, DecodeRows kRows>
__device__ __forceinline__ void run_megakernel(const MegakernelParams& p) {
  static_assert(kDecode || kRows == DecodeRows::kMma, "only decode passes have narrow and wgmma compilations");
  const SharedState s = shared_state();

  if (threadIdx.x == 0) {
    // The group's next kernel (decode_advance) may launch now: it waits for this grid's end before it reads anything.
    if constexpr (kDecode) ptx::griddepcontrol_launch_dependents();
    for (int i = 0; i < KernelConfig::kNumStages; ++i) {
      ptx::mbarrier_init(&s.full[i], 1);
      ptx::mbarrier_init(&s.empty[i], KernelConfig::kConsumerWarps);
      ptx::mbarrier_init(&s.ready[i], 32);
      ptx::mbarrier_init(&s.ready_free[i], 1);
    }
    ptx::mbarrier_init(s.staged, KernelConfig::kConsumerWarps);
    ptx::mbarrier_init(s.output_free, 1);
    ptx::mbarrier_init(s.loaded, 1);
    ptx::mbarrier_init(s.held_loaded, 1);
    *s.freed = 0;
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  const uint32_t sm = blockIdx.x;
  if (p.trace_sms != nullptr && threadIdx.x == 0) {
    p.trace_sms[4 * sm + 0] = ptx::global_timer_ns();
    p.trace_sms[4 * sm + 1] = clock64();
  }
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<KernelConfig::kProducerRegisters>();
    if constexpr (kDecode) {
      // Counters, the abort flag and what the poller reports may be the group's previous kernel's writes. Every CTA
      // waits here, so that no grid of the group ends before its prerequisite (consumers without instructions don't).
      ptx::griddepcontrol_wait();
    }
    if (threadIdx.x / 32 == KernelConfig::kCounterPollerWarp) {
      run_counter_poller<kDecode>(p, s, sm, threadIdx.x % 32);
    } else if constexpr (!kDecode) {
      if (threadIdx.x == KernelConfig::kProducerThread) run_producer(p, s, sm);
      if (threadIdx.x == KernelConfig::kStorerThread) run_storer(p, s, sm);
    }
  } else {
    ptx::setmaxnreg_inc<KernelConfig::kConsumerRegisters>();
    run_consumers<kDecode, kRows>(p, sm, int(threadIdx.x) - 128);
  }
}

}  // namespace

__global__ void __launch_bounds__(KernelConfig::kThreads, 1) megakernel(const __grid_constant__ MegakernelParams p) {
  run_megakernel<false, DecodeRows::kMma>(p);
}

__global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    megakernel_decode(const __grid_constant__ MegakernelParams p) {
  run_megakernel<true, DecodeRows::kMma>(p);
}

__global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    megakernel_decode_narrow(const __grid_constant__ MegakernelParams p) {
  run_megakernel<true, DecodeRows::kNarrow>(p);
}

__global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    megakernel_decode_wgmma(const __grid_constant__ MegakernelParams p) {
  run_megakernel<true, DecodeRows::kWgmma>(p);
}

namespace {

using Kernel = void (*)(MegakernelParams);
constexpr Kernel kKernels[] = {megakernel, megakernel_decode, megakernel_decode_narrow, megakernel_decode_wgmma};

// Whether every decode GEMM pass of a decode pass with these dims is of 1-2 rows at full K: a tile's rows are at
// most the batch, and two rows of the widest input fit the staging space (decode_passes then takes one K range).
// NOTE: this mirrors decode_passes (decode_gemm_passes.cuh), which the narrow kernel does not check: a change to either
// must keep them agreeing, or a narrow pass would drop rows or stage K over the weight ring.
bool decode_narrow(const ModelDims& d) {
  const int64_t widest = std::max({d.d_model, d.q_dim, d.d_ff});
  return d.batch <= 2 && 2 * 2 * widest <= KernelConfig::kDecodeStagedRowBytes;
}

}  // namespace

cudaError_t prepare_megakernel() {
  for (Kernel kernel : kKernels) {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, KernelConfig::kSmemBytes);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t megakernel_ctas_per_sm(int* ctas) {
  *ctas = INT32_MAX;
  for (Kernel kernel : kKernels) {
    int fit = 0;
    const cudaError_t status =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, KernelConfig::kThreads, KernelConfig::kSmemBytes);
    if (status != cudaSuccess) return status;
    *ctas = std::min(*ctas, fit);
  }
  return cudaSuccess;
}

namespace {

// A launch on `stream`; `programmatic`: it may start before the stream's previous kernel ends (programmatic dependent
// launch), its threads waiting for that kernel in griddepcontrol_wait before they read what it wrote.
cudaLaunchConfig_t launch_config(int blocks, int threads, size_t smem_bytes, cudaStream_t stream, bool programmatic,
                                 cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return config;
}

}  // namespace

cudaError_t launch_megakernel(const MegakernelParams& params, int grid_size, cudaStream_t stream, bool programmatic) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      launch_config(grid_size, KernelConfig::kThreads, KernelConfig::kSmemBytes, stream, programmatic, attribute);
  if (!params.dims.decode) return cudaLaunchKernelEx(&config, megakernel, params);
  if (decode_narrow(params.dims)) return cudaLaunchKernelEx(&config, megakernel_decode_narrow, params);
  if (params.dims.batch > kMaxMmaBatch) return cudaLaunchKernelEx(&config, megakernel_decode_wgmma, params);
  return cudaLaunchKernelEx(&config, megakernel_decode, params);
}

// NOTE: after an abort the launch that aborted left `sampled` unwritten (in a decoder's first launch, whatever the
// allocation held), so the tokens and positions stay as they were: the group's later launches then leave at their
// first wait, and the embedding gather, which waits on nothing, still reads a valid token.
// NOTE: launched as a programmatic dependent of megakernel(k), and megakernel(k + 1) of it: every thread waits here
// before it reads `sampled` or the abort flag or writes tokens and positions, so this grid completes only after
// megakernel(k) did, and megakernel(k + 1)'s waits, which wait for this grid, wait for megakernel(k) as well.
__global__ void decode_advance(const int32_t* sampled, int32_t* tokens, int32_t* positions, int32_t* kept, int batch,
                               bool advance, const DeviceError* error) {
  ptx::griddepcontrol_launch_dependents();
  ptx::griddepcontrol_wait();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch || *reinterpret_cast<volatile const uint32_t*>(&error->abort) != 0) return;
  const int32_t id = sampled[b];
  kept[b] = id;
  if (!advance) return;
  tokens[b] = id;
  positions[b] += 1;
}

cudaError_t launch_decode_advance(const MegakernelParams& params, int batch, int32_t* kept, bool advance,
                                  cudaStream_t stream) {
  constexpr int kThreads = 32;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      launch_config((batch + kThreads - 1) / kThreads, kThreads, 0, stream, true, attribute);
  return cudaLaunchKernelEx(&config, decode_advance, params.sampled, const_cast<int32_t*>(params.tokens),
                            const_cast<int32_t*>(params.positions), kept, batch, advance, params.error);
}

}  // namespace mk::gpu
