// The GEMM epilogue: RoPE or SwiGLU in registers, the tile written (residual added) into the shared-memory output
// tile, and the storer's TMA store and publication, which overlap the consumers' next main loop.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
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
template <int kHeadDim>
__device__ __forceinline__ void epilogue_rope(const MegakernelParams& p, const Instruction& in,
                                              float (&acc)[kOutputValues], int warpgroup, int thread_in_wg) {
  constexpr int kPartner = kHeadDim / 16;  // column groups between x1 and x2
  constexpr int kHalf = kHeadDim / 2;
  const int32_t rotated_cols = p.dims.q_dim + p.dims.kv_dim;
  const int32_t row0 = in.row_begin + warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
#pragma unroll
  for (int j = 0; j < kOutputGroups; ++j) {
    if ((j % (2 * kPartner)) >= kPartner) continue;  // x2 columns are rotated with their x1
    const int32_t col = in.col_begin + 2 * (thread_in_wg % 4) + 8 * j;
    if (col >= rotated_cols) continue;
    const int32_t freq = col % kHeadDim;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t position = (row0 + 8 * half) % p.dims.seq_len;
      const float2 cos = *reinterpret_cast<const float2*>(p.rope_cos + int64_t(position) * kHalf + freq);
      const float2 sin = *reinterpret_cast<const float2*>(p.rope_sin + int64_t(position) * kHalf + freq);
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
  const float gate = acc[i];
  // NOTE: fast exp and division: ~1e-6 relative error against a bf16 output's 4e-3; the IEEE division's slow path
  // made this epilogue cost as much as a third of the tile's main loop.
  return __fdividef(gate, 1.0f + __expf(-gate)) * acc[i + kOutputValues];
}

// Writes this thread's output values value_of(i), i < kOutputValues (in accumulator order), into the output tile,
// adding the residual already there when `residual`, then tells the storer. Layout: box b of 64 columns at
// b * kOutputBoxBytes, row r at r * 128 bytes, 16-byte chunk c at c ^ (r % 8) (the 128-byte swizzle of the TMA
// boxes): a warp's 32 four-byte accesses hit 32 distinct banks.
// NOTE: values are computed as they are stored (value_of), so that SwiGLU's gate and up registers die as it goes.
template <typename ValueOf>
__device__ __forceinline__ bool stage_output(const MegakernelParams& p, const SharedState& s, OutputState& output,
                                             bool residual, ValueOf value_of, int warpgroup, int thread_in_wg,
                                             Site site) {
  bool ok = wait_barrier(p, s.output_free, output.free_parity(), site);
  if (residual) ok &= wait_barrier(p, s.residual, output.residual_parity(), site);
  // Row within the tile of half 0; half 1 is 8 rows (1024 bytes) further, with the same row % 8.
  const uint32_t row0 = warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
  const uint32_t row_bytes = row0 * 128 + 4 * (thread_in_wg % 4);
  const uint32_t chunk_xor = row0 % 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < kOutputGroups; ++j) {
      const uint32_t offset =
          (j / 8) * KernelConfig::kOutputBoxBytes + half * 1024 + row_bytes + (((j % 8) ^ chunk_xor) << 4);
      __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(s.output + offset);
      float2 value = make_float2(value_of(4 * j + 2 * half), value_of(4 * j + 2 * half + 1));
      if (residual) {
        const float2 add = __bfloat1622float2(*pair);
        value.x += add.x;
        value.y += add.y;
      }
      *pair = __floats2bfloat162_rn(value.x, value.y);
    }
  }
  ptx::fence_proxy_async_shared();  // the storer's TMA reads what these generic stores wrote
  __syncwarp();
  if (thread_in_wg % 32 == 0) ptx::mbarrier_arrive(s.staged);
  ++output.tiles;
  if (residual) ++output.residuals;
  return ok;
}

// ---- the consumer side of one GEMM instruction ----

// trace: this thread's trace slots when it records (consumer thread 0 with tracing on), else null.
__device__ __forceinline__ bool consume_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                             PipelineState& state, OutputState& output, Site site, int warpgroup,
                                             int thread_in_wg, uint64_t* trace) {
  if (in.opcode == Opcode::kGateUp) {
    float acc[2 * kOutputValues];
    bool ok = gemm_mainloop<256>(p, s, in, state, site, warpgroup, acc);
    if (trace) trace[kTraceMathDone] = clock64();
    ok &= stage_output(p, s, output, false, [&](int i) { return swiglu_value(acc, i); }, warpgroup, thread_in_wg,
                       site);
    return ok;
  }
  float acc[kOutputValues];
  bool ok = gemm_mainloop<128>(p, s, in, state, site, warpgroup, acc);
  if (trace) trace[kTraceMathDone] = clock64();
  if (in.opcode == Opcode::kQkv && p.dims.rope) {
    if (p.dims.head_dim == 128) {
      epilogue_rope<128>(p, in, acc, warpgroup, thread_in_wg);
    } else {
      epilogue_rope<64>(p, in, acc, warpgroup, thread_in_wg);
    }
  }
  const bool residual = gemm_operands(p, in).residual_map >= 0;
  ok &= stage_output(p, s, output, residual, [&](int i) { return acc[i]; }, warpgroup, thread_in_wg, site);
  return ok;
}

// ---- the storer: one thread of warpgroup 0 ----

// Stores one staged GEMM tile with TMA, frees the output tile as soon as the store has read it, and publishes the
// tile once it is in global memory.
__device__ __forceinline__ bool store_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                           OutputState& output, Site site, uint64_t* trace) {
  if (!wait_barrier(p, s.staged, output.staged_parity(), site)) return false;
  const GemmOperands g = gemm_operands(p, in);
  for (int box = 0; box < KernelConfig::kOutputBoxes; ++box) {
    const int32_t col = in.col_begin + box * KernelConfig::kBoxCols;
    if (col < in.col_end)
      ptx::tma_store_3d(&p.maps[g.out_map], s.output + box * KernelConfig::kOutputBoxBytes, col, in.row_begin,
                        g.out_plane);
  }
  ptx::bulk_commit_group();
  ptx::bulk_wait_group_read_all();
  ptx::mbarrier_arrive(s.output_free);
  ptx::bulk_wait_group_all();
  // NOTE: the tile was written by the async proxy; readers acquire the counter and then read with TMA (after their
  // own proxy fence) or with plain loads.
  ptx::fence_proxy_async_global();
  ptx::add_release(p.counters + in.signal_counter, 1);
  if (trace) trace[kTracePublished] = clock64();
  ++output.tiles;
  return true;
}

}  // namespace mk::gpu
