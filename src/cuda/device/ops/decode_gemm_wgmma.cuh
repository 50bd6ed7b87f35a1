// Decode GEMMs on wgmma for batches above kMaxMmaBatch: up to 64 batch rows as one M tile, streamed beside the weights.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../ptx.cuh"
#include "../wgmma_narrow.cuh"
#include "decode_gemm.cuh"
#include "rowwise.cuh"

namespace mk::gpu {

// A pass's batch rows are the M of one m64 tile, the tile's weight rows its N (split between the two consumer
// warpgroups), and both stream through the stage ring in K steps with cp.async, the rows beside the weights.
// NOTE: the mma.sync wide passes this replaced restaged a tile's rows over its whole K in 64 KB ranges, each a
// synchronous round trip to L2 that also drained the weight copies in flight, read A fragments per warp for every 8
// weight rows, and streamed the weights once per 32 rows: at batch 64 and context 128 the step took 4.07 ms at 1B and
// 17.7 ms at 8B, behind torch.compile's 3.35 and 9.59 (docs/perf.md, thirty-fifth session, run 2); on wgmma 2.59 and
// 9.18 ms (thirty-sixth session, run 3). NOTE: each SM asking L2 for its weight rows 128 KB ahead of the ring
// (cp.async.bulk.prefetch.L2, a burst at the tile's start and a stage at a time) made the step 20-43% slower at 1B and
// 8B, batch 32-64: the prefetches queue ahead of the ring's own copies (thirty-seventh session, run 1).
constexpr int kWgmmaRows = 64;        // batch rows of one pass: one wgmma M tile
constexpr int kWgmmaMaxN = 256;       // weight rows of one chunk of a tile: two warpgroups of n128
constexpr int kWgmmaMaxStages = 16;  // ring stages of the narrowest chunks (the rest fill the stage area)
constexpr int kWgmmaRingBytes = KernelConfig::kNumStages * KernelConfig::kStageBytes;
static_assert(kWgmmaRows * kWgmmaMaxN * 4 <= kWgmmaRingBytes, "a chunk's sums fit the ring");
// The scratch (the output tile, idle in decode): each pass row's 1 / rms.
static_assert(kWgmmaRows * 4 <= KernelConfig::kDecodeInvRmsBytes, "the rows' 1 / rms fit the scratch");

// The ring for chunks of kN weight rows: stages of kKStep columns of K, each kM batch rows then the chunk's kN
// weight rows, every 64 columns a block of 128-byte swizzled rows (what the wgmma descriptors read), and as many
// stages as fit the stage area. Each consumer thread copies one fixed 16-byte column of kACopies rows and kBCopies
// weight rows a stage, so its copies' swizzled offsets are the same in every stage.
template <int kWeightRows, int kBatchRows>
struct WgmmaRing {
  static constexpr int kN = kWeightRows;
  static constexpr int kM = kBatchRows;  // batch rows a stage holds: 64, or 32 for passes of at most 32
  static constexpr int kKStep = kN >= 128 ? 64 : 128;
  static constexpr int kBlocks = kKStep / 64;
  static constexpr int kABlockBytes = kM * 128;
  static constexpr int kBBlockBytes = kN * 128;
  static constexpr int kStageBytes = kBlocks * (kABlockBytes + kBBlockBytes);
  static constexpr int kStages = kWgmmaRingBytes / kStageBytes < kWgmmaMaxStages ? kWgmmaRingBytes / kStageBytes
                                                                                 : kWgmmaMaxStages;
  static constexpr int kColumns = kKStep / 8;  // 16-byte chunks of a row a stage
  static constexpr int kRowsAtOnce = KernelConfig::kConsumerThreads / kColumns;
  static constexpr int kACopies = kM / kRowsAtOnce;
  static constexpr int kBCopies = kN / kRowsAtOnce;
  static constexpr int kX = kN / 2;  // wgmma N of each warpgroup
  static_assert(kStages >= 3 && kBCopies >= 1 && kN % kRowsAtOnce == 0, "a ring of at least 3 stages");
  static_assert(kX % 8 == 0 && kABlockBytes % 1024 == 0 && (kX * 128) % 1024 == 0,
                "each warpgroup's weight rows are whole 8-row swizzle atoms");
  // The per-thread sums of squares (at most 4 registers a thread) and the shuffle over a row's copying lanes assume a
  // row's chunks of a stage are at most 16 lanes of one warp.
  static_assert(kColumns <= 16 && 32 % kColumns == 0 && kM % kRowsAtOnce == 0 && kACopies <= 4,
                "a K step of at most 128 columns");
};

// Weight rows a chunk takes for task t (2 t.pairs rows in all): the narrowest ring that holds them, up to kWgmmaMaxN.
__device__ __forceinline__ int32_t wgmma_chunk_rows(const DecodeGemmTask& t) {
  const int32_t rows = 2 * t.pairs;
  int32_t n = 16;
  while (n < rows && n < kWgmmaMaxN) n *= 2;
  return n;
}

// One consumer thread's part of the stream of K-step stages of a pass over one chunk of the tile's weight rows: the
// rows' and the weight rows' copies. NOTE: a stream a chunk, not one through the chunks: with the stream's state live
// through each chunk's epilogue, the kernel spilled (ptxas).
template <typename Ring>
struct WgmmaStream {
  // NOTE: rows and weight rows as indices, not pointers: with 64-bit pointers the kernel spilled (ptxas).
  const __nv_bfloat16* a_first;        // this thread's first batch row; its copies are kRowsAtOnce rows apart
  int32_t a_copies;                    // its copies within the pass (the rest are zeros)
  int32_t b_row[Ring::kBCopies];       // its weight rows of the chunk (-1: past the tile, zeros)
  uint8_t* ring;
  uint32_t a_offset, b_offset;  // of its first copy in a stage
  int32_t column;               // its first element of a stage's K step
  int32_t total;                // stages: K steps
  int32_t issued = 0;           // stages sent
  int32_t first_row;

  __device__ __forceinline__ WgmmaStream(const MegakernelParams& p, const Instruction& in, const DecodeGemmTask& t,
                                         uint8_t* ring_base, int32_t chunk, int32_t b0, int32_t rows, int thread)
      : ring(ring_base) {
    const int32_t chunk_column = thread % Ring::kColumns;
    first_row = thread / Ring::kColumns;
    const uint32_t swizzled = uint32_t(((chunk_column % 8) ^ (first_row % 8)) * 16);
    a_offset = uint32_t(chunk_column / 8) * Ring::kABlockBytes + uint32_t(first_row) * 128 + swizzled;
    b_offset = uint32_t(Ring::kBlocks * Ring::kABlockBytes) + uint32_t(chunk_column / 8) * Ring::kBBlockBytes +
               uint32_t(first_row) * 128 + swizzled;
    column = chunk_column * 8;
    total = (t.k + Ring::kKStep - 1) / Ring::kKStep;
    a_first = t.a + int64_t(b0 + first_row) * t.row_stride;
    a_copies = rows > first_row ? (rows - first_row + Ring::kRowsAtOnce - 1) / Ring::kRowsAtOnce : 0;
    // B row n of a chunk is pair n / 2's first or second weight row.
#pragma unroll
    for (int i = 0; i < Ring::kBCopies; ++i) {
      const int32_t n = first_row + i * Ring::kRowsAtOnce;
      const int32_t pair = chunk * (Ring::kN / 2) + n / 2;
      const int2 pair_rows = decode_weight_rows(p, in, pair < t.pairs ? pair : 0);
      b_row[i] = pair < t.pairs ? (n % 2 == 0 ? pair_rows.x : pair_rows.y) : -1;
    }
  }

  // This thread's first element of K in stage `index`. NOTE: in the same order on every SM: each SM starting at a
  // K step of its own (blockIdx.x % the steps), so that the SMs reading the same rows from L2 at once would ask for
  // different lines, made 1B batch 64 1.7% faster but 8B batch 32-64 2.9% slower (thirty-sixth session, run 2).
  __device__ __forceinline__ int32_t k_at(int32_t index) const { return index * Ring::kKStep + column; }

  __device__ __forceinline__ uint8_t* stage(int32_t index) const {
    return ring + (index % Ring::kStages) * Ring::kStageBytes;
  }

  // The rows' and/or the weights' copies of the next stage (none past the last), uncommitted.
  __device__ __forceinline__ void copy_stage(const DecodeGemmTask& t, bool rows_part, bool weights_part) const {
    if (issued >= total) return;
    uint8_t* base = stage(issued);
    const int32_t k = k_at(issued);
    const bool in_k = k < t.k;
    if (rows_part) {
#pragma unroll
      for (int i = 0; i < Ring::kACopies; ++i) {
        const bool valid = in_k && i < a_copies;
        const __nv_bfloat16* source = a_first + int64_t(i * Ring::kRowsAtOnce) * t.row_stride + k;
        ptx::cp_async_16(base + a_offset + i * Ring::kRowsAtOnce * 128, valid ? source : t.a, valid ? 16 : 0);
      }
    }
    if (weights_part) {
#pragma unroll
      for (int i = 0; i < Ring::kBCopies; ++i) {
        const bool valid = in_k && b_row[i] >= 0;
        const __nv_bfloat16* source = t.w + int64_t(b_row[i]) * t.row_stride + k;
        ptx::cp_async_16(base + b_offset + i * Ring::kRowsAtOnce * 128, valid ? source : t.w, valid ? 16 : 0);
      }
    }
  }

  // The next stage whole, one commit group (an empty one past the last stage: the wait counts stay exact).
  __device__ __forceinline__ void issue_stage(const DecodeGemmTask& t) {
    copy_stage(t, true, true);
    ptx::cp_async_commit();
    ++issued;
  }

  // The weights of the first kStages - 1 stages, one group: sent before the task's counter wait (weights depend on
  // nothing). Leaves `issued` at 0: the rows' copies start at stage 0 (issue_row_prologue). NOTE: this loop and the
  // rows' are not unrolled: unrolled, with the epilogue's, each ring's code took ~100 KB of the kernel's 1 MB.
  __device__ __forceinline__ void issue_weight_prologue(const DecodeGemmTask& t) {
#pragma unroll 1
    for (int s = 0; s < Ring::kStages - 1; ++s, ++issued) copy_stage(t, false, true);
    ptx::cp_async_commit();
    issued = 0;
  }

  // The rows of the first kStages - 1 stages, a group each, once issue_weight_prologue sent their weights. At the
  // first stage's wait (at most kStages - 2 groups pending) the weights' group, older, has landed too.
  __device__ __forceinline__ void issue_row_prologue(const DecodeGemmTask& t) {
#pragma unroll 1
    for (int s = 0; s < Ring::kStages - 1; ++s, ++issued) {
      copy_stage(t, true, false);
      ptx::cp_async_commit();
    }
  }
};

// The fused norm on this thread's rows of a landed stage: each value's square summed, and each row's 1 / rms scales
// the accumulators at the end (FlashNorm, arXiv 2407.09577: the per-row scale commutes with the GEMM). The norm's
// weight is already in the GEMM's weights (folded at upload, model_on_device.cc), so the rows are read, not
// rewritten; only the copying thread reads a copy before the stage's barrier, so no other wait is needed. NOTE: with
// the rows scaled in place by the weight, a chunk of it loaded a stage ahead, a 1B batch-64 step took 7% longer than
// with these sums alone (fortieth session, run 3): the stage loop is serial, and all work in it costs its time. The
// sums stay in registers, one a row this thread copies. NOTE: beside the norm weight's chunk, before the fold, they
// spilled (ptxas), and went through the scratch, a shared load and store in the loop for each.
template <typename Ring>
__device__ __forceinline__ void sum_stage_rows(const WgmmaStream<Ring>& stream, const uint8_t* base,
                                               float (&partial)[Ring::kACopies]) {
#pragma unroll
  for (int i = 0; i < Ring::kACopies; ++i) {
    const uint4 value = *reinterpret_cast<const uint4*>(base + stream.a_offset + i * Ring::kRowsAtOnce * 128);
    partial[i] += sum_of_squares_of_chunk(value);
  }
}

// Each row's 1 / rms into scratch[row] (kWgmmaRows floats) from the threads' sums of the chunk (sum_stage_rows): a
// row's kColumns copying threads are adjacent lanes. Ends with the consumers synchronized.
template <typename Ring>
__device__ __forceinline__ void finish_row_norms(const MegakernelParams& p, const DecodeGemmTask& t,
                                                 const WgmmaStream<Ring>& stream,
                                                 const float (&partial)[Ring::kACopies], float* scratch, int thread) {
#pragma unroll
  for (int i = 0; i < Ring::kACopies; ++i) {
    float sum = partial[i];
#pragma unroll
    for (int offset = Ring::kColumns / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (thread % Ring::kColumns == 0)
      scratch[stream.first_row + i * Ring::kRowsAtOnce] = 1.0f / sqrtf(sum / float(t.k) + p.dims.rms_norm_eps);
  }
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
}

// acc (64 rows x kX, this warpgroup's half of the chunk's weight rows) += the stage's rows (and, with kM 32, whatever
// follows them) . those weight rows: sent, one wgmma group, not waited for (wgmma_stage_done).
template <typename Ring>
__device__ __forceinline__ void wgmma_stage(const uint8_t* base, int warpgroup,
                                            float (&acc)[Ring::kX / 2]) {
  ptx::fence_registers(acc);
  ptx::wgmma_fence();
#pragma unroll
  for (int block = 0; block < Ring::kBlocks; ++block) {
    const uint64_t desc_a = ptx::wgmma_descriptor_k_major_sw128(base + block * Ring::kABlockBytes);
    const uint8_t* weights = base + Ring::kBlocks * Ring::kABlockBytes + block * Ring::kBBlockBytes;
    const uint64_t desc_b = ptx::wgmma_descriptor_k_major_sw128(weights + warpgroup * Ring::kX * 128);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) ptx::wgmma_ss<Ring::kX>(acc, desc_a + 2 * kk, desc_b + 2 * kk);
  }
  ptx::wgmma_commit_group();
}

// The stage's MMAs (wgmma_stage) done: acc holds their sums, and their stage's slot is read.
template <typename Ring>
__device__ __forceinline__ void wgmma_stage_done(float (&acc)[Ring::kX / 2]) {
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(acc);
}

// The chunk's sums into `tile` (64 rows x kN / 2 pairs, float2 each, in the idle ring): this thread holds, for each 8
// columns j of its warpgroup's kX, rows 16 warp + lane / 4 and + 8 at columns 2 (lane % 4) and + 1, the two weight
// rows of one pair (the m16n8 C fragment's layout, as mma_epilogue's).
template <typename Ring>
__device__ __forceinline__ void store_wgmma_sums(const float (&acc)[Ring::kX / 2], float2* tile, int thread) {
  constexpr int kX = Ring::kX, kPairs = Ring::kN / 2;
  const int warpgroup = thread / 128, lane = thread % 32;
  const int row = thread % 128 / 32 * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < kX / 8; ++j) {
    const int pair = warpgroup * (kX / 2) + 4 * j + lane % 4;
    tile[row * kPairs + pair] = float2{acc[4 * j], acc[4 * j + 1]};
    tile[(row + 8) * kPairs + pair] = float2{acc[4 * j + 2], acc[4 * j + 3]};
  }
}

// The epilogues of a chunk's sums (store_wgmma_sums' tile of `tile_pairs` pairs a row): the consumers take its live
// (row, pair) entries in turn, a row's pairs on adjacent threads. `row_scale`: each row's 1 / rms, or null. NOTE: one
// decode_epilogue call site, not one per accumulator fragment: with the fragments' loop unrolled, each ring's
// epilogue inlined the per-opcode epilogue 2 kX / 8 times, and the kernel's 65840 SASS instructions (1 MB) missed
// the instruction cache on 22.5% of an 8B batch-32 step's stall samples (thirty-seventh session, run 3); through the
// tile, batch 32-64 steps ran 13-16% faster (thirty-eighth session, run 1).
__device__ __forceinline__ void wgmma_epilogue(const MegakernelParams& p, const Instruction& in,
                                               const DecodeGemmTask& t, const float2* tile, int32_t tile_pairs,
                                               int32_t first_pair, int32_t b0, int32_t rows, const float* row_scale,
                                               int thread) {
  const int32_t pairs = min(tile_pairs, t.pairs - first_pair);
#pragma unroll 1
  for (int32_t i = thread; i < rows * pairs; i += KernelConfig::kConsumerThreads) {
    const int32_t row = i / pairs, pair = i - row * pairs;
    const float scale = row_scale != nullptr ? row_scale[row] : 1.0f;
    const float2 sums = tile[row * tile_pairs + pair];
    decode_epilogue(p, in, first_pair + pair, b0 + row, sums.x * scale, sums.y * scale);
  }
}

// One chunk of a pass: batch rows [b0, b0 + rows), rows <= kWgmmaRows, against the chunk's weight rows, whose first
// stages' weights were sent before the counter wait when `weights_sent`. Each stage: this thread's copies landed (and
// its rows' squares summed, with a fused norm), a barrier (every copy landed, the previous stage read), the stage
// kStages - 1 ahead sent into the one just read, then the wgmmas. Ends with the consumers synchronized and the
// chunk's sums in the ring (store_wgmma_sums), each row's 1 / rms in the scratch with a fused norm: for
// wgmma_epilogue.
template <typename Ring>
__device__ __forceinline__ void decode_gemm_wgmma_chunk(const MegakernelParams& p, const Instruction& in,
                                                        const DecodeGemmTask& t, uint8_t* ring, float* scratch,
                                                        int32_t chunk, int32_t b0, int32_t rows, bool weights_sent,
                                                        int thread) {
  WgmmaStream<Ring> stream(p, in, t, ring, chunk, b0, rows, thread);
  if (!weights_sent) stream.issue_weight_prologue(t);
  stream.issue_row_prologue(t);
  const bool norm = t.norm_weight != nullptr;
  float partial[Ring::kACopies] = {};  // this thread's sums of squares, one a row it copies
  float acc[Ring::kX / 2];  // (64 rows, kX columns) as wgmma's fragment
#pragma unroll
  for (int i = 0; i < Ring::kX / 2; ++i) acc[i] = 0.0f;
  const int32_t k_steps = stream.total;
  for (int32_t k_step = 0; k_step < k_steps; ++k_step) {
    ptx::cp_async_wait<Ring::kStages - 2>();
    uint8_t* base = stream.stage(k_step);
    if (norm) sum_stage_rows<Ring>(stream, base, partial);
    ptx::fence_proxy_async_shared();  // the copies, for wgmma's reads
    // NOTE: the previous stage's MMAs waited for here, after this stage's copies, not right after they were sent: the
    // wait cost 8.7% of an 8B batch-32 step's stall samples (thirty-seventh session, run 3). Before the barrier,
    // since the stage sent after it goes into their slot.
    wgmma_stage_done<Ring>(acc);
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    stream.issued = k_step + Ring::kStages - 1;
    stream.issue_stage(t);
    wgmma_stage<Ring>(base, thread / 128, acc);
  }
  wgmma_stage_done<Ring>(acc);
  ptx::cp_async_wait<0>();  // the trailing empty groups
  if (norm) finish_row_norms<Ring>(p, t, stream, partial, scratch, thread);
  // The sums go into the ring once both warpgroups' MMAs have read it.
  if (!norm) ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  store_wgmma_sums<Ring>(acc, reinterpret_cast<float2*>(ring), thread);
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
}

// Calls run(Ring{}) with the ring for task t's chunks and passes of up to `rows` batch rows. NOTE: passes of at most
// 32 rows stage only 32: the wgmma still reads an m64 tile, whose rows past 32 are whatever follows in the stage and
// land in accumulator rows the epilogue drops, and the ring's other half goes to weight stages in flight.
template <int kN, typename Run>
__device__ __forceinline__ void with_pass_rows(int32_t rows, Run run) {
  if (rows <= 32) {
    run(WgmmaRing<kN, 32>{});
  } else {
    run(WgmmaRing<kN, kWgmmaRows>{});
  }
}

template <typename Run>
__device__ __forceinline__ void with_wgmma_ring(const DecodeGemmTask& t, int32_t rows, Run run) {
  switch (wgmma_chunk_rows(t)) {
    case 16: with_pass_rows<16>(rows, run); break;
    case 32: with_pass_rows<32>(rows, run); break;
    case 64: with_pass_rows<64>(rows, run); break;
    case 128: with_pass_rows<128>(rows, run); break;
    default: with_pass_rows<256>(rows, run); break;
  }
}

// Before the task's counter wait: the first weight stages of its first chunk.
__device__ __forceinline__ void issue_wgmma_weight_prologue(const MegakernelParams& p, const SharedState& s,
                                                            const Instruction& in, int thread) {
  const DecodeGemmTask t = decode_gemm_task(p, in);
  const int32_t rows = min(kWgmmaRows, t.batch_end - t.batch_begin);
  with_wgmma_ring(t, rows, [&](auto ring) {
    using Ring = decltype(ring);
    WgmmaStream<Ring>(p, in, t, s.stages, 0, t.batch_begin, rows, thread).issue_weight_prologue(t);
  });
}

// A decode GEMM task on wgmma: its batch rows in passes of up to kWgmmaRows, each through the tile's weight rows in
// chunks of up to kWgmmaMaxN; the first chunk's first weights already sent (issue_wgmma_weight_prologue). NOTE: one
// ring for all the task's passes, chosen by its first pass's rows: with a ring chosen per pass, the kernel spilled.
// NOTE: the epilogue outside the ring's code: inside, each of the ten rings inlined it (the kernel 357 -> 304 KB).
__device__ __forceinline__ void run_decode_gemm_wgmma(const MegakernelParams& p, const SharedState& s,
                                                      const Instruction& in, int thread) {
  const DecodeGemmTask t = decode_gemm_task(p, in);
  float* scratch = reinterpret_cast<float*>(s.output);
  const float2* sums = reinterpret_cast<const float2*>(s.stages);  // (64 rows, tile_pairs) of each chunk
  const int32_t ring_rows = min(kWgmmaRows, t.batch_end - t.batch_begin);
  const int32_t tile_pairs = wgmma_chunk_rows(t) / 2;  // the ring's kN / 2
  const int32_t chunks = (t.pairs + tile_pairs - 1) / tile_pairs;
  for (int32_t b0 = t.batch_begin; b0 < t.batch_end; b0 += kWgmmaRows) {
    const int32_t rows = min(kWgmmaRows, t.batch_end - b0);
    for (int32_t chunk = 0; chunk < chunks; ++chunk) {
      with_wgmma_ring(t, ring_rows, [&](auto ring) {
        decode_gemm_wgmma_chunk<decltype(ring)>(p, in, t, s.stages, scratch, chunk, b0, rows,
                                                b0 == t.batch_begin && chunk == 0, thread);
      });
      wgmma_epilogue(p, in, t, sums, tile_pairs, chunk * tile_pairs, b0, rows,
                     t.norm_weight != nullptr ? scratch : nullptr, thread);
      ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    }
  }
}

}  // namespace mk::gpu
