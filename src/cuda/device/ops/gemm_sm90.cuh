// GEMM tiles (qkv, o_proj, gate_up, down, lm_head), 128 rows x 128 output columns, or 256 for a wide plain GEMM
// tile (include/mk/tiles.h): TMA loads of 128 x 64 A and 128- or 256-row B slices into the stage ring by the producer
// (weights first, A as soon as the activations' counters are met), wgmma by two consumer warpgroups (64 rows each),
// then the epilogue of gemm_epilogue.cuh.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../output_tile.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

__device__ __forceinline__ bool is_gemm(Opcode opcode) {
  return opcode == Opcode::kQkv || opcode == Opcode::kOProj || opcode == Opcode::kGateUp || opcode == Opcode::kDown ||
         opcode == Opcode::kLmHead;
}

// A plain GEMM tile of 256 output columns: 256 contiguous weight rows like gate_up's, and its output leaves through
// the 128-column output tile in two halves (two uses of it).
__device__ __forceinline__ bool is_wide_gemm(const Instruction& in) {
  return in.opcode != Opcode::kGateUp && in.col_end - in.col_begin > KernelConfig::kBlockN;
}

// Where a GEMM tile's operands and output live: tensor maps and their outermost (plane) coordinates.
struct GemmOperands {
  int a_map;
  int b_map;
  int out_map;
  int residual_map;  // -1: no residual
  int32_t k;         // reduction length
  int32_t b_rows;    // weight rows per tile: 128, or 256 for gate_up (gate and up rows of the same 128 columns) and
                     // for a wide tile
  int32_t b_boxes;   // TMA boxes per B slice: the weight maps' boxes are 128 rows (gate_up's 256)
  int32_t layer;     // plane of A and B
  int32_t b_row;     // first weight row of the tile
  int32_t out_plane;
  int32_t residual_plane;
};

__device__ __forceinline__ GemmOperands gemm_operands(const MegakernelParams& p, const Instruction& in) {
  const ModelDims& d = p.dims;
  const int32_t l = in.layer;
  const int32_t col = in.col_begin;
  const int32_t boxes = is_wide_gemm(in) ? 2 : 1;
  const int32_t rows = 128 * boxes;
  switch (in.opcode) {
    case Opcode::kQkv: return {kMapAttnNorm, kMapWqkv, kMapQkv, -1, d.d_model, rows, boxes, l, col, l, 0};
    case Opcode::kOProj: return {kMapAttn, kMapWo, kMapHiddenMid, kMapHidden, d.q_dim, rows, boxes, l, col, l, l};
    case Opcode::kGateUp: return {kMapMlpNorm, kMapWgateUp, kMapAct, -1, d.d_model, 256, 1, l, 2 * col, l, 0};
    case Opcode::kDown: return {kMapAct, kMapWdown, kMapHidden, kMapHiddenMid, d.d_ff, rows, boxes, l, col, l + 1, l};
    default: return {kMapFinalNorm, kMapLmHead, kMapLogits, -1, d.d_model, rows, boxes, 0, col, 0, 0};
  }
}

// ---- producer ----

// Requests the B slice of k-step k into `stage`, box by box (a wide tile's two 128-row boxes land stacked, the layout
// of one 256-row box). NOTE: no loop over the boxes: with one, the producer's walk spilled at 56 registers.
__device__ __forceinline__ void load_b_slice(const MegakernelParams& p, const GemmOperands& g, uint8_t* stage,
                                             uint64_t* full, int32_t k) {
  ptx::tma_load_3d(stage + KernelConfig::kATileBytes, &p.maps[g.b_map], full, k, g.b_row, g.layer);
  if (g.b_boxes > 1)
    ptx::tma_load_3d(stage + KernelConfig::kATileBytes + 128 * 128, &p.maps[g.b_map], full, k, g.b_row + 128, g.layer);
}

// Requests the A slices of the claimed stages [first, upto): the counters are met.
__device__ __forceinline__ void load_a_slices(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                              const GemmOperands& g, PipelineState& first, int32_t& issued,
                                              int32_t upto) {
  for (; issued < upto; ++issued) {
    ptx::tma_load_3d(s.stage(first.stage), &p.maps[g.a_map], &s.full[first.stage], issued * KernelConfig::kBlockK,
                     in.row_begin, g.layer);
    first.advance();
  }
}

// The producer side of a GEMM tile.
// NOTE: weights depend on nothing, so the tile's first stages are claimed and their weight slices requested before
// the activation counters are met. The counter poller's report is looked for after each claim, and each claimed
// stage's A slice goes out as soon as it came: A's latency then hides under the previous tile's last stages instead
// of following them (when A waited for all prefetched stages, the consumers waited ~2 us for it at the start of every
// tile).
__device__ __forceinline__ bool produce_gemm(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                             PipelineState& state, PipelineState& ready, OutputState& output, Site site,
                                             uint64_t* trace) {
  const GemmOperands g = gemm_operands(p, in);
  const uint32_t bytes = KernelConfig::kATileBytes + uint32_t(g.b_rows) * KernelConfig::kBlockK * 2;
  const int32_t k_blocks = g.k / KernelConfig::kBlockK;
  const int32_t prefetched = min(k_blocks, KernelConfig::kNumStages);
  PipelineState first = state;  // the first claimed stage whose A slice is not requested yet
  int32_t a_issued = 0;
  bool met = false;
  auto counters_now_met = [&] {
    met = true;
    if (trace) trace[kTraceProducerWaitsDone] = clock64();
    ptx::fence_proxy_async_global();  // the awaited tiles were written by generic or TMA stores; TMA reads them next
  };
  for (int32_t kb = 0; kb < prefetched; ++kb) {
    if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
    ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], bytes);
    load_b_slice(p, g, s.stage(state.stage), &s.full[state.stage], kb * KernelConfig::kBlockK);
    state.advance();
    if (!met && take_ready(s, ready)) counters_now_met();
    if (met) load_a_slices(p, s, in, g, first, a_issued, kb + 1);
  }
  if (!met) {
    if (!wait_ready(p, s, ready)) return false;
    counters_now_met();
    load_a_slices(p, s, in, g, first, a_issued, prefetched);
  }
  for (int32_t kb = prefetched; kb < k_blocks; ++kb) {
    if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
    uint8_t* stage = s.stage(state.stage);
    const int32_t k = kb * KernelConfig::kBlockK;
    ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], bytes);
    ptx::tma_load_3d(stage, &p.maps[g.a_map], &s.full[state.stage], k, in.row_begin, g.layer);
    load_b_slice(p, g, stage, &s.full[state.stage], k);
    state.advance();
  }
  if (g.residual_map >= 0) {
    // The residual lands in the output tile, where the consumers add the product to it in place. A wide tile's
    // second half is loaded by the consumers into the stage they hold (consume_plain_gemm).
    if (!load_output_tile(p, s, output, &p.maps[g.residual_map], KernelConfig::kOutputBoxes, in.col_begin,
                          in.row_begin, g.residual_plane, site))
      return false;
    ++output.loads;
  }
  ++output.uses;
  return true;
}

// ---- consumer main loop ----

// acc (64 x kBRows per warpgroup) <- A rows [64 wg, 64 wg + 64) of the tile times the kBRows weight rows.
// trace: this thread's trace slots when it records (consumer thread 0 with tracing on), else null.
// held: when not null, the last k-step's stage is kept, not released (a wide tile stages its second output half
// there), and its index returned there.
template <int kBRows>
__device__ __forceinline__ bool gemm_mainloop(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                              PipelineState& state, Site site, int warpgroup,
                                              float (&acc)[kBRows / 2], uint64_t* trace, uint32_t* held = nullptr) {
  const int32_t num_k_blocks = gemm_operands(p, in).k / KernelConfig::kBlockK;
#pragma unroll
  for (int i = 0; i < kBRows / 2; ++i) acc[i] = 0.0f;
  uint32_t previous_stage = 0;
  bool ok = true;
  for (int32_t kb = 0; kb < num_k_blocks; ++kb) {
    // NOTE: no early exit on abort: wgmma must stay warpgroup-convergent for ptxas to pipeline it; an aborting
    // kernel computes garbage to the end of the instruction and leaves at the next instruction boundary.
    ok &= wait_barrier(p, &s.full[state.stage], state.phase, site);
    if (trace && kb == 0) trace[kTraceDataReady] = clock64();
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
  if (held != nullptr) {
    *held = previous_stage;
  } else if (num_k_blocks > 0) {
    release_stage(s, previous_stage);
  }
  return ok;
}

}  // namespace mk::gpu
