// How a decode GEMM task's batch rows go through its weights (passes, K ranges) and the dispatch of each pass between
// the tensor-core path (decode_gemm_mma.cuh) and the CUDA-core one (decode_gemm.cuh); batches above kMaxMmaBatch go
// to wgmma instead (decode_gemm_wgmma.cuh).
#pragma once

#include "../config.cuh"
#include "../ptx.cuh"
#include "decode_gemm.cuh"
#include "decode_gemm_mma.cuh"
#include "decode_gemm_wgmma.cuh"

namespace mk::gpu {

// Task t's columns [begin, begin + length) of a and w: rows stay t.row_stride apart. A fused norm's weight stays
// whole: tasks with one never take K in ranges (decode_k_ranges).
__device__ __forceinline__ DecodeGemmTask decode_k_range(DecodeGemmTask t, int32_t begin, int32_t length) {
  t.a += begin;
  t.w += begin;
  t.k = length;
  return t;
}

// The fewest equal K ranges of whole 64-column blocks (the staged rows' swizzle) whose rows, `bytes` at full K, fit the
// staging space; 0 when none do. Equal ranges give every range the same slices, so a warp keeps its job (unit,
// K-slice) in all of them. NOTE: at most twice the fewest that fit: where k / 64 has no divisor near them
// (k = 64 x 131), equal ranges would be tiny, each a round trip, and passes of fewer rows at full K stream faster.
__device__ __forceinline__ int32_t equal_k_ranges(const DecodeGemmTask& t, int32_t bytes) {
  const int32_t fewest = (bytes + kStagedRowBytes - 1) / kStagedRowBytes;
  for (int32_t ranges = fewest; ranges <= 2 * fewest && ranges * 64 <= t.k; ++ranges)
    if (t.k % (ranges * 64) == 0) return ranges;
  return 0;
}

// NOTE: passes over batch rows stream the tile's weights once per pass, and at k = d_ff only 4 rows of the 1B shape
// fit the staging space: batch 8 took two passes of the down tiles (22 us against 7.3 at batch 1), batch 64 sixteen
// (178 us; docs/perf.md, fifth session, run 2). A pass of up to kMmaRows rows instead takes K in ranges, staged one
// after the other, each warp's accumulators carried from range to range, and the weights stream once a pass.
// K ranges a pass of `rows` rows takes: 1 when they fit the staging space at full K, else equal_k_ranges; 0 when none
// can: a fused norm needs whole rows, and a warp with several jobs (two groups a warp) could not carry its
// accumulators.
__device__ __forceinline__ int32_t decode_k_ranges(const DecodeGemmTask& t, int32_t rows) {
  const int32_t bytes = rows * 2 * t.k;
  if (bytes <= kStagedRowBytes) return 1;
  if (t.norm_weight != nullptr || mma_groups_per_warp(t) != 1) return 0;
  return equal_k_ranges(t, bytes);
}

// How task t's batch rows go through its weights: in passes of at most `rows` rows, each taking K in `ranges` ranges.
struct DecodePasses {
  int32_t rows;
  int32_t ranges;
};

// Rows a pass of the fewest passes of at most `most` rows takes, balanced: `total` rows in passes of equal rows but
// the last.
__device__ __forceinline__ int32_t balanced_pass_rows(int32_t total, int32_t most) {
  const int32_t passes = (total + most - 1) / most;
  return (total + passes - 1) / passes;
}

// Task t's rows in the fewest passes of at most kMmaRows when such passes can take K in ranges, else of at most as
// many as fit at full K (one range); balanced either way, so that no pass is left with a row or two (Llama-8B's qkv
// at batch 9: 5 + 4, not 8 + 1 on the CUDA cores). NOTE: every pass takes a full pass's ranges, the last, shorter
// pass too, not its own count: at k = 4160 (65 blocks of 64) a pass of 16 rows takes 5 ranges, but one of 15 rows
// would take none (2-4 ranges do not divide 65 blocks), and was staged at full K over the weight ring (review, ninth
// session). Ranges that fit a full pass fit a shorter one. NOTE: worked out once a tile (early_weight_prologue): it
// ran six times a tile, three of them after the wait, and its code drew the most no_instruction stall samples of a
// decode step (ncu, sixteenth session, run 3).
__device__ __forceinline__ DecodePasses decode_passes(const DecodeGemmTask& t) {
  const int32_t total = t.batch_end - t.batch_begin;
  const int32_t in_ranges = balanced_pass_rows(total, kMmaRows);
  const int32_t ranges = decode_k_ranges(t, in_ranges);
  if (ranges > 0) return {in_ranges, ranges};
  return {balanced_pass_rows(total, decode_rows_at_full_k(t)), 1};
}

// Whether the passes go through decode_gemm_mma_ranges: K in ranges.
__device__ __forceinline__ bool mma_in_ranges(const DecodePasses& passes) { return passes.ranges > 1; }

// A pass of staged rows [b0, b0 + rows) over `ranges` K ranges (decode_k_ranges), the stream's first steps already
// issued; one group a warp (decode_k_ranges allows no more). One stream runs through the ranges: while a range is
// computed, the next range's first steps go out into the buffers it frees, and only the rows are restaged between
// ranges. Ends with the consumers synchronized.
// NOTE: with a stream a range, each later range's prologue went out only once the previous range was done, and its
// rows' staging (a wait for every copy in flight) waited for all of it: a full round trip of 128 KB an SM a range.
__device__ __forceinline__ void decode_gemm_mma_ranges(const MegakernelParams& p, const Instruction& in,
                                                       const DecodeGemmTask& t, uint4* staged, uint4* ring,
                                                       float* scratch, int32_t b0, int32_t rows, int32_t ranges,
                                                       int consumer_thread) {
  const int32_t length = t.k / ranges;
  const DecodeGemmTask first = decode_k_range(t, 0, length);
  MmaStream<1> stream(first, ring, consumer_thread, ranges);
  const int32_t range_steps = stream.steps_per_slice;  // a job's steps a range
  float acc[1][4] = {};  // (one group, C fragment: rows g and g + 8 of the pass x 2 columns)
#pragma unroll 1
  for (int32_t r = 0; r < ranges; ++r) {
    // This warp's steps of (job, range), none past its last job.
    const int32_t window = r * range_steps;
    if (r > 0) ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // the rows are read
    stage_decode_rows(p, in, decode_k_range(t, r * length, length), b0, rows, staged, scratch, consumer_thread);
    mma_steps<1>(p, in, first, stream, staged, b0, rows, min(window, stream.steps),
                    min(window + range_steps, stream.steps), false, acc);
  }
  if (stream.slices > 1) {
    reduce_slices<1>(p, in, first, stream, scratch, b0, rows, acc);
  } else if (stream.warp < stream.units) {
    mma_epilogue<1>(p, in, first, stream.first_unit, b0, rows, acc, stream.lane);
  }
}

// The first kStepBuffers steps of the weight stream a pass of `rows` rows uses (with short K-slices they may span its
// K ranges), sent before the pass stages its rows, so that both land in one round trip. kRows: the kernel's passes.
template <DecodeRows kRows>
__device__ __forceinline__ void issue_pass_prologue(const MegakernelParams& p, const Instruction& in,
                                                    const DecodeGemmTask& t, int32_t rows, const DecodePasses& passes,
                                                    uint4* ring, int consumer_thread) {
  if constexpr (kRows == DecodeRows::kNarrow) {
    WeightStream(t, ring, consumer_thread).issue_prologue(p, in, t);
    return;
  }
  if (mma_in_ranges(passes)) {
    const DecodeGemmTask first = decode_k_range(t, 0, t.k / passes.ranges);
    MmaStream<1>(first, ring, consumer_thread, passes.ranges).issue_prologue(p, in, first);
  } else if (rows < kMinMmaRows) {
    WeightStream(t, ring, consumer_thread).issue_prologue(p, in, t);
  } else if (mma_groups_per_warp(t) == 1) {
    MmaStream<1>(t, ring, consumer_thread).issue_prologue(p, in, t);
  } else {
    MmaStream<2>(t, ring, consumer_thread).issue_prologue(p, in, t);
  }
}

// What a decode GEMM task did before its counter wait: its passes worked out (and the first pass's weight prologue
// sent).
struct DecodePrologue {
  DecodePasses passes;
};

// The first pass's prologue, sent before the task's counter wait (weights depend on nothing), so that a tile of
// ~64 KB of weights is mostly in shared memory when its inputs arrive. kRows: the kernel's passes.
template <DecodeRows kRows>
__device__ __forceinline__ DecodePrologue early_weight_prologue(const MegakernelParams& p, const SharedState& s,
                                                                const Instruction& in, int consumer_thread) {
  if constexpr (kRows == DecodeRows::kWgmma) {
    issue_wgmma_weight_prologue(p, s, in, consumer_thread);
    return {};
  } else {
    const DecodeGemmTask t = decode_gemm_task(p, in);
    const DecodePasses passes = decode_passes(t);
    uint4* ring = reinterpret_cast<uint4*>(s.stages + kStagedRowBytes);
    issue_pass_prologue<kRows>(p, in, t, min(passes.rows, t.batch_end - t.batch_begin), passes, ring,
                               consumer_thread);
    return {passes};
  }
}

// A pass of the staged rows [b0, b0 + rows) at full K: on the CUDA cores (1-2 rows) or the tensor cores.
template <DecodeRows kRows>
__device__ __forceinline__ void decode_gemm_pass(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeGemmTask& t, const uint4* staged, uint4* ring,
                                                 float* scratch, int32_t b0, int32_t rows, int consumer_thread) {
  if (rows == 1) {
    decode_gemm_rows<1>(p, in, t, staged, ring, b0, rows, consumer_thread);
  } else if (kRows == DecodeRows::kNarrow || rows == 2) {
    decode_gemm_rows<2>(p, in, t, staged, ring, b0, rows, consumer_thread);
  } else if constexpr (kRows != DecodeRows::kNarrow) {
    if (mma_groups_per_warp(t) == 1) {
      decode_gemm_mma<1>(p, in, t, staged, ring, scratch, b0, rows, consumer_thread);
    } else {
      decode_gemm_mma<2>(p, in, t, staged, ring, scratch, b0, rows, consumer_thread);
    }
  }
}

// A decode GEMM task: on wgmma in the kWgmma kernel, else its batch rows in passes (decode_passes), staged at the
// start of the (otherwise idle) stage ring, the weight steps streamed through its end. NOTE: decode schedules have no
// TMA ops, so no producer is using the ring.
template <DecodeRows kRows>
__device__ __forceinline__ void run_decode_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                                const DecodePrologue& prologue, int consumer_thread) {
  if constexpr (kRows == DecodeRows::kWgmma) {
    run_decode_gemm_wgmma(p, s, in, consumer_thread);
  } else {
    const DecodeGemmTask t = decode_gemm_task(p, in);
    uint4* staged = reinterpret_cast<uint4*>(s.stages);
    uint4* ring = reinterpret_cast<uint4*>(s.stages + kStagedRowBytes);
    float* scratch = reinterpret_cast<float*>(s.output);
    const DecodePasses& passes = prologue.passes;
    for (int32_t b0 = t.batch_begin; b0 < t.batch_end; b0 += passes.rows) {
      const int32_t rows = min(passes.rows, t.batch_end - b0);
      // Later passes stream the weights again (the previous pass ended synchronized).
      if (b0 != t.batch_begin) issue_pass_prologue<kRows>(p, in, t, rows, passes, ring, consumer_thread);
      if (kRows != DecodeRows::kNarrow && mma_in_ranges(passes)) {
        decode_gemm_mma_ranges(p, in, t, staged, ring, scratch, b0, rows, passes.ranges, consumer_thread);
      } else {
        stage_decode_rows(p, in, t, b0, rows, staged, scratch, consumer_thread);
        decode_gemm_pass<kRows>(p, in, t, staged, ring, scratch, b0, rows, consumer_thread);
      }
      ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // the next pass restages
    }
  }
}

}  // namespace mk::gpu
