// Decode GEMMs on the tensor cores for passes of 3 or more batch rows (mma.sync m16n8k16: the pass's rows as M, 8
// weight rows as N; passes of more than 16 rows take two M tiles); decode_gemm_passes.cuh plans a task's passes.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../ptx.cuh"
#include "decode_gemm.cuh"

namespace mk::gpu {

// NOTE: at 8 rows the CUDA-core path converts every weight value once per row and reads every staged row per weight
// chunk: the step took 3.2x the batch-1 step (docs/perf.md, run 5). One mma here takes the pass's rows (up to 16,
// the rest repeats of its last row whose outputs are dropped) against a group of 4 output pairs = 8 weight rows,
// so each A fragment read from shared memory serves 4 pairs; the weights still stream through each warp's cp.async
// ring as on the CUDA cores.
constexpr int kMmaRows = 16;
// NOTE: at batch 32 passes of kMmaRows streamed each tile's weights twice (gate_up 52.6 us a tile against 20.4 at batch
// 8; twentieth session): batches above kMaxMmaBatch go to wgmma (decode_gemm_wgmma.cuh), a pass of up to 64 rows.
// NOTE: kMaxMmaBatch was kMmaRows (16) until the wgmma kernel's code was cut to a third: then 8B batch 16 ran 5.89 ms
// on wgmma against 9.06 on mma.sync, while batch 8 stayed faster here (1B 1.24 ms against 1.53 on wgmma, 8B 5.42
// against 5.78; docs/perf.md, thirty-ninth session, run 1).
constexpr int kMaxMmaBatch = 8;
// Which decode GEMM passes a decode kernel compiles (megakernel.cu picks the kernel by batch). kNarrow: passes of 1-2
// rows at full K, on the CUDA cores only; kMma: batches up to kMaxMmaBatch, on the tensor cores from kMinMmaRows;
// kWgmma: batches above kMaxMmaBatch, on wgmma (decode_gemm_wgmma.cuh).
enum class DecodeRows { kNarrow, kMma, kWgmma };
// Passes of 1-2 rows stay on the CUDA cores (bandwidth-bound there already), unless their rows do not fit the staging
// space at full K (k > 16384): only the tensor-core path takes K in ranges (decode_k_ranges).
constexpr int kMinMmaRows = 3;
constexpr int kGroupPairs = 4;   // output pairs of one mma's N = 8 weight rows
static_assert(kDecodeMaxRows == kMmaRows, "a pass is at most one mma's M");
constexpr int kSliceFragmentBytes = KernelConfig::kConsumerWarps * 2 * 4 * 32 * 4;
static_assert(kSliceFragmentBytes <= KernelConfig::kOutputBytes,
              "the K-slices' C fragments (reduce_slices: two groups x 4 values a lane) fit the output tile");

// NOTE: how a tile's groups and its K spread over the 8 consumer warps. Every warp must stream, or the SM's bytes in
// flight (3 steps of 4 KB a warp) fall short of its share of HBM. With G <= 8 groups (decode_o_proj and decode_down at
// 16 columns: G = 2; qkv at 32: G = 4), warp w takes group w % G over K-slice w / G (8 / G slices of whole steps, at
// most one per step of K; G of 5-7 leave 8 - G warps idle), and the slices' C fragments are added through shared memory
// before the epilogue. With G > 8 (gate_up at 64 pairs: 16 groups; the 1B shape's LM head at 480-488 pairs: 120-122
// groups), a warp takes two groups at once (kGroups = 2, N = 16 a step; units of two groups, warp w taking units w,
// w + 8, ... over the whole K) rather than one after the other: each A fragment then feeds two mmas, 12 shared-memory
// wavefronts per 512 weight bytes (A 4, B 4, their copies 4) instead of 16, and half the A ldmatrix.
__device__ __forceinline__ int mma_groups_per_warp(const DecodeGemmTask& t) {
  return (t.pairs + kGroupPairs - 1) / kGroupPairs > KernelConfig::kConsumerWarps ? 2 : 1;
}

// One warp's stream of weight steps (4 KB: kRows weight rows x kChunks 16-byte chunks) through its ring. A job is
// (unit of kGroups groups, K-slice), job j = unit + slice units; warp w takes jobs w, w + 8, ..., their steps one
// stream (more than one job only when there is one slice). In a step buffer (kRows, kChunks), row n's chunks are
// XORed with n % 8 (ldmatrix reads 8 rows at one chunk: no bank conflicts). Built on one K range's task (t.k the
// range's length) with `ranges` > 1 (decode_gemm_mma_ranges), a job's slice goes through every range in turn, range
// r's columns r t.k further along the rows: the stream runs on from one range into the next.
// NOTE: the unit and K-step of the step issue() sends next are counted along, as WeightStream's are: dividing the
// step by steps_per_slice (known only at run time) drew 6.8% of batch 8's stall samples (nineteenth session, run 2).
template <int kGroups>
struct MmaStream {
  static constexpr int kRows = 8 * kGroups;
  static constexpr int kChunks = kStepUint4s / kRows;
  static constexpr int kCopies = kStepUint4s / 32;  // cp.async per lane per step
  static_assert(kChunks % 8 == 0, "a step's chunks of a row are whole blocks of the staged rows' 8-chunk swizzle");
  int warp, lane;
  int32_t units, slices, steps_per_slice, steps;
  int32_t first_unit, first_slice_step;  // of this warp's first job
  uint4* own;                            // this warp's kStepBuffers steps
  int32_t ranges;                        // K ranges of t.k columns each, in turn for each job
  int32_t sent = 0;                      // steps issue() has sent (or a prologue sent from another stream)
  int32_t next_unit, next_slice_step;    // the unit, step within its K-slice and range of the step issue() sends next
  int32_t next_range = 0;

  __device__ __forceinline__ MmaStream(const DecodeGemmTask& t, uint4* ring, int consumer_thread,
                                       int32_t k_ranges = 1)
      : ranges(k_ranges) {
    constexpr int kWarps = KernelConfig::kConsumerWarps;
    warp = consumer_thread / 32;
    lane = consumer_thread % 32;
    const int32_t groups = (t.pairs + kGroupPairs - 1) / kGroupPairs;
    units = (groups + kGroups - 1) / kGroups;
    const int32_t steps_per_row = (t.k / 8 + kChunks - 1) / kChunks;
    slices = max(1, min(kWarps / units, steps_per_row));
    steps_per_slice = (steps_per_row + slices - 1) / slices;
    const int32_t jobs = units * slices;
    steps = (warp < jobs ? (jobs - warp + kWarps - 1) / kWarps : 0) * steps_per_slice * ranges;
    first_unit = warp % units;
    first_slice_step = warp / units * steps_per_slice;
    own = ring + warp * kStepBuffers * kStepUint4s;
    next_unit = first_unit;
    next_slice_step = 0;
  }
  // The first K chunk of the step `slice_step` steps into this warp's K-slice.
  __device__ __forceinline__ int32_t first_chunk(int32_t slice_step) const {
    return (first_slice_step + slice_step) * kChunks;
  }
  // Lane l copies row l % kRows: one weight row address a lane. Pairs past the tile's (its last group may have
  // fewer than 4) and chunks past the row are zeros, read from nowhere. `step`: the one after the last sent.
  __device__ __forceinline__ void issue(const MegakernelParams& p, const Instruction& in, const DecodeGemmTask& t,
                                        int32_t step) {
    if (step < steps) {
      const int n = lane % kRows;
      const int32_t pair = (next_unit * kGroups + n / 8) * kGroupPairs + n % 8 / 2;
      const bool real = pair < t.pairs;
      const int2 rows = decode_weight_rows(p, in, real ? pair : 0);
      const uint4* row = reinterpret_cast<const uint4*>(t.w + int64_t(n % 2 == 0 ? rows.x : rows.y) * t.row_stride);
      uint4* buffer = own + step % kStepBuffers * kStepUint4s + n * kChunks;
      const int32_t first = first_chunk(next_slice_step), chunks = t.k / 8, range_begin = next_range * chunks;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int c = lane / kRows + i * (32 / kRows);
        const bool valid = real && first + c < chunks;
        ptx::cp_async_16(buffer + (c ^ (n % 8)), row + (valid ? range_begin + first + c : 0), valid ? 16 : 0);
      }
    }
    ptx::cp_async_commit();  // empty groups too: one group per step keeps the wait count exact
    step_past();
  }
  // NOTE: the prologue fills every buffer (kStepBuffers - 1 stay in flight once one is computed on): it goes out
  // before the counter wait, and 128 KB of a tile's weights instead of 96 then arrive during it. Batch 8 on the 1B
  // shape -2.7% (ninth session, run 5); batch 1 (WeightStream) +2.7% while the consumers polled their own counters,
  // -0.6% since the counter poller polls for them (fourteenth session, run 3).
  __device__ __forceinline__ void issue_prologue(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeGemmTask& t) {
    for (int32_t step = 0; step < kStepBuffers; ++step) issue(p, in, t, step);
  }
  // The prologue went out, from this stream or another built on the same task with the same `ranges` (before the
  // counter wait): the stream goes on after it.
  __device__ __forceinline__ void prologue_sent() {
    while (sent < kStepBuffers) step_past();
  }

 private:
  __device__ __forceinline__ void step_past() {
    ++sent;
    if (++next_slice_step < steps_per_slice) return;
    next_slice_step = 0;
    if (++next_range < ranges) return;
    next_range = 0;
    next_unit += KernelConfig::kConsumerWarps;
  }
};

// This lane's ldmatrix rows. A (x4: rows 0-7, then rows 8-15, at k 0-7 of a k16 step, then both at k 8-15: the
// a0-a3 registers of the mma's A fragment): lane l points at staged row l % 8 + 8 (l / 8 % 2), chunk + l / 16; rows
// past the pass repeat its last one (their C rows are dropped). B (x4: one group's 8 rows at 4 consecutive chunks,
// the b0 b1 registers of two k16 steps): lane l points at row l % 8, chunk + l / 8.
struct MmaLane {
  uint32_t a_row;  // shared address of the staged row
  int a_swizzle;
  int a_half;
  int b_row, b_chunk;
};

__device__ __forceinline__ MmaLane mma_lane(const uint4* staged, int32_t chunks, int32_t rows, int lane) {
  MmaLane m;
  const int row = min(lane % 8 + lane / 8 % 2 * 8, rows - 1);
  m.a_row = ptx::smem_address(staged + row * chunks);
  m.a_swizzle = row & 7;
  m.a_half = lane / 16;
  m.b_row = lane % 8;
  m.b_chunk = lane / 8;
  return m;
}

// The mmas of 4-chunk slice q of a step: acc[g] += the staged rows' chunks [first + 4 q, +4) . group g's 8 weight
// rows.
template <int kGroups>
__device__ __forceinline__ void mma_slice(const MmaLane& m, uint32_t b_base, int32_t first, int q,
                                          float (&acc)[kGroups][4]) {
  constexpr int kChunks = MmaStream<kGroups>::kChunks;
  uint32_t a[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    ptx::ldmatrix_x4(a[h], m.a_row + uint32_t(first + ((4 * q + 2 * h + m.a_half) ^ m.a_swizzle)) * 16);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    uint32_t b[4];
    const int row = g * 8 + m.b_row;
    ptx::ldmatrix_x4(b, b_base + uint32_t(row * kChunks + ((4 * q + m.b_chunk) ^ m.b_row)) * 16);
    ptx::mma_m16n8k16_bf16(acc[g], a[0], b[0], b[1]);
    ptx::mma_m16n8k16_bf16(acc[g], a[1], b[2], b[3]);
  }
}

// The mmas of one step: acc[g] += the staged rows' chunks [first, first + kChunks) . group g's 8 weight rows.
// NOTE: a step inside the row takes its slices with no check between them, so that ptxas may load a slice's
// fragments while the previous slice's mmas run; checked before every slice, each slice's mmas waited for its own
// loads (ncu's SASS samples, nineteenth session, run 7). Only a row's (or range's) last step can be partial, and a
// last slice's padding steps past the row take the checked loop with no slice at all.
template <int kGroups>
__device__ __forceinline__ void mma_step(const MmaLane& m, const uint4* buffer, int32_t first, int32_t chunks,
                                         float (&acc)[kGroups][4]) {
  constexpr int kChunks = MmaStream<kGroups>::kChunks;
  const uint32_t b_base = ptx::smem_address(buffer);
  if (first + kChunks <= chunks) {
#pragma unroll
    for (int q = 0; q < kChunks / 4; ++q) mma_slice<kGroups>(m, b_base, first, q, acc);
    return;
  }
  // k % 64 == 0 (GemmOp::check): whole 8-chunk blocks, as the swizzle needs
#pragma unroll 1
  for (int q = 0; first + 4 * q < chunks; ++q) mma_slice<kGroups>(m, b_base, first, q, acc);
}

// The C fragments back to 0, for the tile's next output columns.
template <int kGroups>
__device__ __forceinline__ void zero_accumulators(float (&acc)[kGroups][4]) {
#pragma unroll
  for (int g = 0; g < kGroups; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
}

// The epilogues of one unit: lane (g = lane / 4, t = lane % 4) holds C[g][2t, 2t + 1] and C[g + 8][2t, 2t + 1] of
// each group, the two dot products of the group's pair t for the pass's batch rows g and g + 8. NOTE: a loop over the
// fragment's halves with one decode_epilogue call site, not one a half: inlined at each of them, the per-opcode
// epilogue was a fifth of the decode kernel's code (thirty-eighth session).
template <int kGroups>
__device__ __forceinline__ void mma_epilogue(const MegakernelParams& p, const Instruction& in, const DecodeGemmTask& t,
                                             int32_t unit, int32_t b0, int32_t rows, const float (&acc)[kGroups][4],
                                             int lane) {
#pragma unroll 1
  for (int half = 0; half < 2 * kGroups; ++half) {
    const int group = half / 2, row = lane / 4 + 8 * (half % 2);
    const int32_t pair = (unit * kGroups + group) * kGroupPairs + lane % 4;
    float x0 = 0.0f, x1 = 0.0f;  // acc[group][2 (half % 2)] and + 1, picked without indexing registers at run time
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (g != group) continue;
      x0 = half % 2 == 0 ? acc[g][0] : acc[g][2];
      x1 = half % 2 == 0 ? acc[g][1] : acc[g][3];
    }
    if (pair < t.pairs && row < rows) decode_epilogue(p, in, pair, b0 + row, x0, x1);
  }
}

// K split over slices (then one job a warp, job = warp): the warps of slices 1.. leave their C fragments in
// `scratch` (free once the pass is staged), and each unit's slice-0 warp adds them up and runs the epilogues.
template <int kGroups>
__device__ __forceinline__ void reduce_slices(const MegakernelParams& p, const Instruction& in,
                                              const DecodeGemmTask& t, const MmaStream<kGroups>& stream,
                                              float* scratch, int32_t b0, int32_t rows, float (&acc)[kGroups][4]) {
  constexpr int kValues = kGroups * 4;
  float* partials = scratch;  // (kConsumerWarps, kValues, 32): each warp's C fragments, lane-minor
  const int warp = stream.warp, lane = stream.lane;
  const bool busy = warp < stream.units * stream.slices;
  const int32_t slice = warp / stream.units;
  if (busy && slice > 0) {
#pragma unroll
    for (int v = 0; v < kValues; ++v) partials[(warp * kValues + v) * 32 + lane] = acc[v / 4][v % 4];
  }
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  if (!busy || slice > 0) return;
#pragma unroll 1
  for (int32_t s = 1; s < stream.slices; ++s) {
    const int other = warp + s * stream.units;
#pragma unroll
    for (int v = 0; v < kValues; ++v) acc[v / 4][v % 4] += partials[(other * kValues + v) * 32 + lane];
  }
  mma_epilogue<kGroups>(p, in, t, warp, b0, rows, acc, lane);
}

// Steps [first_step, end_step) of the stream over staged rows [b0, b0 + rows) of task t (all of its K, or one range
// of it, the stream's steps of that range): acc accumulates. With `finish`, each job's epilogue runs after its last
// step (one slice a unit; else reduce_slices after the loop), acc restarting for the warp's next job. A window starts
// at a job's slice step 0 of one range: the whole stream, or with K ranges (no `finish`) one (job, range)'s steps.
// A window that ends before the stream's last step leaves copies in flight, which the next range's staging waits
// for. The stream's first steps are already on their way (issue_pass_prologue).
template <int kGroups>
__device__ __forceinline__ void mma_steps(const MegakernelParams& p, const Instruction& in, const DecodeGemmTask& t,
                                          MmaStream<kGroups>& stream, const uint4* staged, int32_t b0, int32_t rows,
                                          int32_t first_step, int32_t end_step, bool finish,
                                          float (&acc)[kGroups][4]) {
  const int32_t chunks = t.k / 8;
  const MmaLane fragment_addresses = mma_lane(staged, chunks, rows, stream.lane);
  if (first_step == 0) stream.prologue_sent();
  int32_t unit = stream.first_unit, slice_step = 0;  // of the step computed, counted along as the stream's
  for (int32_t step = first_step; step < end_step; ++step) {
    __syncwarp();  // every lane's reads of the buffer refilled next (the previous step's) are done
    issue_next_step(stream, p, in, t, step);
    ptx::cp_async_wait<kStepBuffers - 1>();
    __syncwarp();  // and the other lanes' copies of this step have landed
    mma_step<kGroups>(fragment_addresses, stream.own + step % kStepBuffers * kStepUint4s,
                              stream.first_chunk(slice_step), chunks, acc);
    if (++slice_step != stream.steps_per_slice) continue;
    slice_step = 0;
    if (finish && stream.slices == 1) {
      mma_epilogue<kGroups>(p, in, t, unit, b0, rows, acc, stream.lane);
      zero_accumulators(acc);
    }
    unit += KernelConfig::kConsumerWarps;
  }
  if (end_step == stream.steps) ptx::cp_async_wait<0>();  // the trailing empty groups
}

// Every output pair of the task for staged rows [b0, b0 + rows), 3 <= rows <= kMmaRows, the stream's first steps
// already on their way.
template <int kGroups>
__device__ __forceinline__ void decode_gemm_mma(const MegakernelParams& p, const Instruction& in,
                                                const DecodeGemmTask& t, const uint4* staged, uint4* ring,
                                                float* scratch, int32_t b0, int32_t rows,
                                                int consumer_thread) {
  MmaStream<kGroups> stream(t, ring, consumer_thread);
  float acc[kGroups][4] = {};  // (groups, C fragment: rows g and g + 8 of the pass x 2 columns)
  mma_steps<kGroups>(p, in, t, stream, staged, b0, rows, 0, stream.steps, true, acc);
  if (stream.slices > 1) reduce_slices<kGroups>(p, in, t, stream, scratch, b0, rows, acc);
}

}  // namespace mk::gpu
