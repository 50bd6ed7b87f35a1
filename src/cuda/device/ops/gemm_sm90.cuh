// GEMM tiles (qkv, o_proj, gate_up, down, lm_head): TMA loads of 128 x 64 A and B slices into the stage ring by the
// producer, wgmma by two consumer warpgroups (64 rows each), and fused epilogues (RoPE, SwiGLU, residual add).
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

struct GemmOperands {
  int a_map;
  int b_map;
  int32_t k;       // reduction length
  int32_t b_rows;  // weight rows per tile: 128, or 256 for gate_up (gate and up rows of the same 128 columns)
  int32_t layer;   // outermost tensor-map coordinate of both operands
  int32_t b_row;   // first weight row of the tile
};

__device__ __forceinline__ GemmOperands gemm_operands(const MegakernelParams& p, const Instruction& in) {
  const ModelDims& d = p.dims;
  const int32_t layer = in.layer;
  switch (in.opcode) {
    case Opcode::kQkv: return {kMapAttnNorm, kMapWqkv, d.d_model, 256, layer, in.col_begin};
    case Opcode::kOProj: return {kMapAttn, kMapWo, d.q_dim, 128, layer, in.col_begin};
    case Opcode::kGateUp: return {kMapMlpNorm, kMapWgateUp, d.d_model, 256, layer, 2 * in.col_begin};
    case Opcode::kDown: return {kMapAct, kMapWdown, d.d_ff, 128, layer, in.col_begin};
    default: return {kMapFinalNorm, kMapLmHead, d.d_model, 256, 0, in.col_begin};
  }
}

__device__ __forceinline__ int32_t gemm_stages(const MegakernelParams& p, const Instruction& in) {
  return gemm_operands(p, in).k / KernelConfig::kBlockK;
}

// ---- producer ----

__device__ __forceinline__ bool produce_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                             PipelineState& state, Site site) {
  const GemmOperands g = gemm_operands(p, in);
  const uint32_t bytes = KernelConfig::kATileBytes + uint32_t(g.b_rows) * KernelConfig::kBlockK * 2;
  for (int32_t k = 0; k < g.k; k += KernelConfig::kBlockK) {
    if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
    uint8_t* stage = s.stage(state.stage);
    ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], bytes);
    ptx::tma_load_3d(stage, &p.maps[g.a_map], &s.full[state.stage], k, in.row_begin, g.layer);
    ptx::tma_load_3d(stage + KernelConfig::kATileBytes, &p.maps[g.b_map], &s.full[state.stage], k, g.b_row, g.layer);
    state.advance();
  }
  return true;
}

// ---- consumer main loop ----

// acc (64 x kBRows per warpgroup) <- A rows [64 wg, 64 wg + 64) of the tile times the kBRows weight rows.
template <int kBRows>
__device__ __forceinline__ bool gemm_mainloop(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                              PipelineState& state, Site site, int warpgroup,
                                              float (&acc)[kBRows / 2]) {
  const int32_t num_k_blocks = gemm_stages(p, in);
#pragma unroll
  for (int i = 0; i < kBRows / 2; ++i) acc[i] = 0.0f;
  uint32_t previous_stage = 0;
  bool ok = true;
  for (int32_t kb = 0; kb < num_k_blocks; ++kb) {
    // NOTE: no early exit on abort: wgmma must stay warpgroup-convergent for ptxas to pipeline it; an aborting
    // kernel computes garbage to the end of the instruction and leaves at the next instruction boundary.
    ok &= wait_barrier(p, &s.full[state.stage], state.phase, site);
    const uint8_t* stage = s.stage(state.stage);
    const uint64_t desc_a = ptx::wgmma_descriptor_k_major_sw128(stage + warpgroup * 64 * 128);
    const uint64_t desc_b = ptx::wgmma_descriptor_k_major_sw128(stage + KernelConfig::kATileBytes);
    ptx::fence_registers(acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KernelConfig::kBlockK / 16; ++kk) {
      // 16 bf16 along K are 32 bytes: 2 in the descriptor's 16-byte address units
      if constexpr (kBRows == 128) {
        ptx::wgmma_m64n128k16(acc, desc_a + 2 * kk, desc_b + 2 * kk, 1);
      } else {
        ptx::wgmma_m64n256k16(acc, desc_a + 2 * kk, desc_b + 2 * kk, 1);
      }
    }
    ptx::wgmma_commit_group();
    // Keep one group in flight: the previous stage's MMAs are done once at most one group is pending.
    ptx::wgmma_wait_group<1>();
    ptx::fence_registers(acc);
    if (kb > 0) release_stage(s, previous_stage);
    previous_stage = state.stage;
    state.advance();
  }
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(acc);
  if (num_k_blocks > 0) release_stage(s, previous_stage);
  return ok;
}

// ---- epilogues ----
// wgmma accumulator layout (m64nN): thread t of the warpgroup holds rows 16 (t / 32) + (t % 32) / 4 + {0, 8} and
// columns 8 j + 2 (t % 4) + {0, 1}, j = 0 .. N/8 - 1, in acc[4 j + 2 half + {0, 1}] for half = 0 (row) and 1 (row + 8).

struct EpilogueCoords {
  int32_t row[2];  // token rows of half 0 and 1
  int32_t col;     // tile column of j = 0 (add 8 j)
};

__device__ __forceinline__ EpilogueCoords epilogue_coords(const Instruction& in, int warpgroup, int thread_in_wg) {
  const int32_t row = in.row_begin + warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
  return {{row, row + 8}, 2 * (thread_in_wg % 4)};
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* row_pointer, int32_t col, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162*>(row_pointer + col) = __floats2bfloat162_rn(v0, v1);
}

__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* row_pointer, int32_t col) {
  // NOTE: .cg: the data was written by another SM; do not trust a stale L1 line.
  const __nv_bfloat162 pair = __ldcg(reinterpret_cast<const __nv_bfloat162*>(row_pointer + col));
  return __bfloat1622float2(pair);
}

// out[rows, cols] <- acc (+ residual[rows, cols]); out and residual have `ld` columns.
// NOTE: all residual loads are issued before the first store: interleaved, the compiler could not move a load past
// a store that might alias it, and each pair would cost a round trip to L2.
template <int kCols>
__device__ __forceinline__ void epilogue_store(const Instruction& in, const float (&acc)[kCols / 2], EpilogueCoords c,
                                               __nv_bfloat16* __restrict__ out,
                                               const __nv_bfloat16* __restrict__ residual, int32_t ld) {
  constexpr int kGroups = kCols / 8;
  if (residual == nullptr) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t row = c.row[half];
      if (row >= in.row_end) continue;
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        const int32_t col = in.col_begin + c.col + 8 * j;
        if (col < in.col_end) store_pair(out + int64_t(row) * ld, col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
    return;
  }
  float2 add[2][kGroups];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int32_t col = in.col_begin + c.col + 8 * j;
      const bool inside = c.row[half] < in.row_end && col < in.col_end;
      add[half][j] = inside ? load_pair(residual + int64_t(c.row[half]) * ld, col) : make_float2(0.0f, 0.0f);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int32_t row = c.row[half];
    if (row >= in.row_end) continue;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int32_t col = in.col_begin + c.col + 8 * j;
      if (col >= in.col_end) continue;
      store_pair(out + int64_t(row) * ld, col, add[half][j].x + acc[4 * j + 2 * half],
                 add[half][j].y + acc[4 * j + 2 * half + 1]);
    }
  }
}

// RoPE on the q and k heads of a qkv tile, in registers: element d < head_dim/2 of a head pairs with d + head_dim/2,
// which the same thread holds kHeadDim/16 column groups later.
template <int kHeadDim, int kCols>
__device__ __forceinline__ void epilogue_rope(const MegakernelParams& p, const Instruction& in,
                                              float (&acc)[kCols / 2], EpilogueCoords c) {
  constexpr int kPartner = kHeadDim / 16;  // column groups between x1 and x2
  constexpr int kHalf = kHeadDim / 2;
  const int32_t rotated_cols = p.dims.q_dim + p.dims.kv_dim;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    if ((j % (2 * kPartner)) >= kPartner) continue;  // x2 columns are rotated with their x1
    const int32_t col = in.col_begin + c.col + 8 * j;
    if (col >= rotated_cols) continue;
    const int32_t freq = col % kHeadDim;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t position = c.row[half] % p.dims.seq_len;
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

// act[rows, cols] <- silu(gate) * up, gate in columns j < 16 of the 256-wide accumulator and up in j + 16.
__device__ __forceinline__ void epilogue_swiglu(const Instruction& in, const float (&acc)[128], EpilogueCoords c,
                                                __nv_bfloat16* out, int32_t ld) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int32_t row = c.row[half];
    if (row >= in.row_end) continue;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int32_t col = in.col_begin + c.col + 8 * j;
      if (col >= in.col_end) continue;
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float gate = acc[4 * j + 2 * half + e];
        const float up = acc[4 * (j + 16) + 2 * half + e];
        v[e] = gate / (1.0f + expf(-gate)) * up;
      }
      store_pair(out + int64_t(row) * ld, col, v[0], v[1]);
    }
  }
}

// ---- the consumer side of one GEMM instruction ----

// trace: this thread's trace slots when it records (consumer thread 0 with tracing on), else null.
__device__ __forceinline__ bool consume_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                             PipelineState& state, Site site, int warpgroup, int thread_in_wg,
                                             uint64_t* trace) {
  const ModelDims& d = p.dims;
  const int64_t T = d.tokens;
  const EpilogueCoords c = epilogue_coords(in, warpgroup, thread_in_wg);
  const int32_t layer = in.layer;
  if (in.opcode == Opcode::kGateUp) {
    float acc[128];
    const bool ok = gemm_mainloop<256>(p, s, in, state, site, warpgroup, acc);
    if (trace) trace[kTraceMathDone] = clock64();
    epilogue_swiglu(in, acc, c, p.act + layer * T * d.d_ff, d.d_ff);
    return ok;
  }
  if (in.opcode == Opcode::kQkv || in.opcode == Opcode::kLmHead) {
    float acc[128];
    const bool ok = gemm_mainloop<256>(p, s, in, state, site, warpgroup, acc);
    if (trace) trace[kTraceMathDone] = clock64();
    if (in.opcode == Opcode::kLmHead) {
      epilogue_store<256>(in, acc, c, p.logits, nullptr, d.vocab_size);
      return ok;
    }
    if (d.rope) {
      if (d.head_dim == 128) {
        epilogue_rope<128, 256>(p, in, acc, c);
      } else {
        epilogue_rope<64, 256>(p, in, acc, c);
      }
    }
    epilogue_store<256>(in, acc, c, p.qkv + layer * T * d.qkv_dim, nullptr, d.qkv_dim);
    return ok;
  }
  float acc[64];
  bool ok = gemm_mainloop<128>(p, s, in, state, site, warpgroup, acc);
  if (trace) trace[kTraceMathDone] = clock64();
  // The residual is read with plain loads, so the consumers acquire its counters themselves (already reached in
  // practice: the producer waited for them before loading A).
  ok &= consumers_wait(p, s, in, site, warpgroup * 128 + thread_in_wg);
  if (in.opcode == Opcode::kOProj) {
    epilogue_store<128>(in, acc, c, p.hidden_mid + layer * T * d.d_model, p.hidden + layer * T * d.d_model, d.d_model);
  } else {  // kDown
    epilogue_store<128>(in, acc, c, p.hidden + (layer + 1) * T * d.d_model, p.hidden_mid + layer * T * d.d_model,
                        d.d_model);
  }
  return ok;
}

}  // namespace mk::gpu
