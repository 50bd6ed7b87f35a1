// The GEMM epilogue: RoPE or SwiGLU in registers, then the tile written (residual added) into the output tile, whose
// TMA store and publication by the storer overlap the consumers' next main loop.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../output_tile.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"
#include "gemm_sm90.cuh"

namespace mk::gpu {

// wgmma accumulator layout (m64nN): thread t of the warpgroup holds rows 16 (t / 32) + (t % 32) / 4 + {0, 8} and
// columns 8 j + 2 (t % 4) + {0, 1}, j = 0 .. N/8 - 1, in acc[4 j + 2 half + {0, 1}] for half = 0 (row) and 1 (row + 8).
constexpr int kOutputGroups = KernelConfig::kBlockN / 8;  // j of a 128-column output tile
constexpr int kOutputValues = KernelConfig::kBlockN / 2;  // accumulator registers per thread of an output tile

// RoPE on the q and k heads of a qkv tile, in registers: element d < head_dim/2 of a head pairs with d + head_dim/2,
// which the same thread holds kHeadDim/16 column groups later.
template <int kHeadDim, int kValues>
__device__ __forceinline__ void epilogue_rope(const MegakernelParams& p, const Instruction& in, float (&acc)[kValues],
                                              int warpgroup, int thread_in_wg) {
  constexpr int kGroups = kValues / 4;  // j of the tile's columns
  constexpr int kPartner = kHeadDim / 16;  // column groups between x1 and x2
  constexpr int kHalf = kHeadDim / 2;
  const int32_t rotated_cols = p.dims.q_dim + p.dims.kv_dim;
  const int32_t row0 = in.row_begin + warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    if ((j % (2 * kPartner)) >= kPartner) continue;  // x2 columns are rotated with their x1
    const int32_t col = in.col_begin + 2 * (thread_in_wg % 4) + 8 * j;
    if (col >= rotated_cols) continue;
    const int32_t freq = col % kHeadDim;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t position = (row0 + 8 * half) % p.dims.seq_len;
      const float2 cos = *reinterpret_cast<const float2*>(p.weights.rope_cos + int64_t(position) * kHalf + freq);
      const float2 sin = *reinterpret_cast<const float2*>(p.weights.rope_sin + int64_t(position) * kHalf + freq);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float cs = e == 0 ? cos.x : cos.y;
        const float sn = e == 0 ? sin.x : sin.y;
        float& x1 = acc[4 * j + 2 * half + e];
        float& x2 = acc[4 * (j + kPartner) + 2 * half + e];
        const float rotated1 = x1 * cs + (-x2) * sn;
        const float rotated2 = x2 * cs + x1 * sn;
        x1 = rotated1;
        x2 = rotated2;
      }
    }
  }
}

// silu(gate) * up of output value i: gate in column groups j < 16 of the 256-wide accumulator, up in j + 16.
__device__ __forceinline__ float swiglu_value(const float (&acc)[2 * kOutputValues], int i) {
  // NOTE: an approximate SFU operation (ptx::silu_fast: absolute error, see there); the IEEE division's slow path
  // made this epilogue cost as much as a third of the tile's main loop.
  return ptx::silu_fast(acc[i]) * acc[i + kOutputValues];
}

// Waits until the output tile is free and, for o_proj and down, holds the residual the producer loaded there.
// trace: stamped once it does, when not null.
__device__ __forceinline__ bool wait_output_tile(const MegakernelParams& p, const SharedState& s,
                                                 const OutputState& output, bool residual, Site site, uint64_t* trace) {
  bool ok = wait_barrier(p, s.output_free, output.free_parity(), site);
  if (residual) ok &= wait_barrier(p, s.loaded, output.loaded_parity(), site);
  if (trace) trace[kTraceTileFree] = clock64();
  return ok;
}

// Writes the tile's values value_of(i) into the output tile, onto the residual the producer loaded there for o_proj
// and down, and hands it to the storer. trace: stamped once the tile is free, when not null.
template <typename ValueOf>
__device__ __forceinline__ bool stage_output(const MegakernelParams& p, const SharedState& s, OutputState& output,
                                             bool residual, ValueOf value_of, int warpgroup, int thread_in_wg,
                                             Site site, uint64_t* trace) {
  const bool ok = wait_output_tile(p, s, output, residual, site, trace);
  write_output_tile<kOutputGroups>(s.output, residual, value_of, warpgroup, thread_in_wg);
  stage_output_tile(s, output, residual, thread_in_wg);
  return ok;
}

// A wide tile keeps the stage of its last k-step for its second 128 output columns. Once both warpgroups' last MMAs
// have read that stage, consumer thread 0 loads the second residual half into it (o_proj, down).
__device__ __forceinline__ void take_held_stage(const MegakernelParams& p, const SharedState& s,
                                                const Instruction& in, const GemmOperands& g, uint32_t held,
                                                int warpgroup, int thread_in_wg) {
  ptx::fence_proxy_async_shared();  // the MMAs' reads (async proxy) before this thread's writes into the stage
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  if (g.residual_map < 0 || warpgroup != 0 || thread_in_wg != 0) return;
  ptx::fence_proxy_async_global();  // the residual was published by other SMs' stores; TMA reads it
  issue_tile_load(s.stage(held), s.held_loaded, &p.maps[g.residual_map], KernelConfig::kOutputBoxes,
                  in.col_begin + KernelConfig::kBlockN, in.row_begin, g.residual_plane);
}

// ---- the consumer side of one GEMM instruction ----

// A plain GEMM tile of kValues accumulators per thread (64 x 2 kValues per warpgroup): RoPE for qkv, then its output:
// the first 128 columns through the output tile, a wide tile's second 128 through the stage of its last k-step, both
// handed to the storer at once (one use of the output tile).
template <int kValues>
__device__ __forceinline__ bool consume_plain_gemm(const MegakernelParams& p, const SharedState& s,
                                                   const Instruction& in, PipelineState& state, OutputState& output,
                                                   Site site, int warpgroup, int thread_in_wg, uint64_t* trace) {
  constexpr bool kWide = kValues > kOutputValues;
  float acc[kValues];
  uint32_t held = 0;
  bool ok = gemm_mainloop<2 * kValues>(p, s, in, state, site, warpgroup, acc, trace, kWide ? &held : nullptr);
  if (trace) trace[kTraceMathDone] = clock64();
  const GemmOperands g = gemm_operands(p, in);
  const bool residual = g.residual_map >= 0;
  if constexpr (kWide) take_held_stage(p, s, in, g, held, warpgroup, thread_in_wg);
  if (in.opcode == Opcode::kQkv && p.dims.rope) {
    if (p.dims.head_dim == 128) {
      epilogue_rope<128>(p, in, acc, warpgroup, thread_in_wg);
    } else {
      epilogue_rope<64>(p, in, acc, warpgroup, thread_in_wg);
    }
  }
  ok &= wait_output_tile(p, s, output, residual, site, trace);
  write_output_tile<kOutputGroups>(s.output, residual, [&](int i) { return acc[i]; }, warpgroup, thread_in_wg);
  if constexpr (kWide) {
    if (residual) ok &= wait_barrier(p, s.held_loaded, output.held_loaded_parity(), site);
    write_output_tile<kOutputGroups>(s.stage(held), residual, [&](int i) { return acc[kOutputValues + i]; },
                                     warpgroup, thread_in_wg);
    if (warpgroup == 0 && thread_in_wg == 0) *s.held_stage = held;  // published by the staged arrive
    if (residual) ++output.held_loads;
  }
  stage_output_tile(s, output, residual, thread_in_wg);
  return ok;
}

// trace: this thread's trace slots when it records (consumer thread 0 with tracing on), else null.
__device__ __forceinline__ bool consume_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                             PipelineState& state, OutputState& output, Site site, int warpgroup,
                                             int thread_in_wg, uint64_t* trace) {
  if (in.opcode == Opcode::kGateUp) {
    float acc[2 * kOutputValues];
    bool ok = gemm_mainloop<256>(p, s, in, state, site, warpgroup, acc, trace);
    if (trace) trace[kTraceMathDone] = clock64();
    ok &= stage_output(p, s, output, false, [&](int i) { return swiglu_value(acc, i); }, warpgroup, thread_in_wg,
                       site, trace);
    return ok;
  }
  if (is_wide_gemm(in))
    return consume_plain_gemm<2 * kOutputValues>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
  return consume_plain_gemm<kOutputValues>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
}

// ---- the storer: one thread of warpgroup 0 ----

// A wide tile's second half is stored from the held stage with its first (store_output_tile), and published once.
__device__ __forceinline__ bool store_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                           OutputState& output, Site site) {
  const GemmOperands g = gemm_operands(p, in);
  if (!store_output_tile(p, s, output, &p.maps[g.out_map], KernelConfig::kOutputBoxes, in.col_begin, in.col_end,
                         in.row_begin, g.out_plane, site, is_wide_gemm(in)))
    return false;
  publish_stored(p, in.signal_counter);
  return true;
}

}  // namespace mk::gpu
