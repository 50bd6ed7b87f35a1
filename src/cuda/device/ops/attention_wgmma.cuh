// Causal attention tiles with wgmma: one (sequence, 128-query block, query head) per instruction. The producer loads
// Q into the output tile, then K and V blocks of 128 keys into separate stages of the ring; each consumer warpgroup
// owns 64 queries: S = Q K^T (wgmma, both operands in shared memory), online softmax in registers (base 2), then
// O += P V (wgmma with P from registers, V N-major in shared memory). O replaces Q in the output tile and the storer
// stores it with TMA.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../output_tile.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// Key blocks the tile needs: keys [0, last query of the tile].
__device__ __forceinline__ int32_t attention_kv_blocks(const MegakernelParams& p, const Instruction& in) {
  const int32_t query_end = in.row_end - in.sequence * p.dims.seq_len;
  return (query_end + KernelConfig::kBlockKv - 1) / KernelConfig::kBlockKv;
}

// ---- producer ----

__device__ __forceinline__ bool produce_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, OutputState& output,
                                                  Site site) {
  const ModelDims& d = p.dims;
  const int32_t boxes = d.head_dim / KernelConfig::kBoxCols;
  const int32_t plane = in.layer * d.batch + in.sequence;
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  const int32_t kv_head = in.head / d.group_size;
  const int32_t k_col = d.q_dim + kv_head * d.head_dim;
  const int32_t v_col = d.q_dim + d.kv_dim + kv_head * d.head_dim;
  if (!load_output_tile(p, s, output, &p.maps[kMapQuery], boxes, in.col_begin, query_begin, plane, site)) return false;
  ++output.loads;
  ++output.uses;
  const uint32_t block_bytes = uint32_t(KernelConfig::kBlockKv * d.head_dim * 2);
  const int32_t kv_blocks = attention_kv_blocks(p, in);
  for (int32_t kb = 0; kb < kv_blocks; ++kb) {
    for (int32_t col : {k_col, v_col}) {
      if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
      uint8_t* stage = s.stage(state.stage);
      ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], block_bytes);
      for (int32_t box = 0; box < boxes; ++box)
        ptx::tma_load_3d(stage + box * KernelConfig::kBlockKv * 128, &p.maps[kMapKeyValue], &s.full[state.stage],
                         col + KernelConfig::kBoxCols * box, kb * KernelConfig::kBlockKv, plane);
      state.advance();
    }
  }
  return true;
}

// ---- consumers ----

constexpr int kScoreValues = KernelConfig::kBlockKv / 2;  // S registers per thread: 64 queries x 128 keys

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// S (64 queries of this warpgroup x 128 keys) = Q K^T, Q from the output tile and K from a stage, both K-major.
template <int kHeadDim>
__device__ __forceinline__ void attention_scores(const uint8_t* q_tile, const uint8_t* k_tile, int warpgroup,
                                                 float (&score)[kScoreValues]) {
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    // 16 head dimensions are 32 bytes of a 128-byte row: 2 in the descriptor's 16-byte units; 64 per box
    const uint64_t desc_q = ptx::wgmma_descriptor_k_major_sw128(q_tile + (kk / 4) * KernelConfig::kOutputBoxBytes +
                                                                warpgroup * 64 * 128) + 2 * (kk % 4);
    const uint64_t desc_k =
        ptx::wgmma_descriptor_k_major_sw128(k_tile + (kk / 4) * KernelConfig::kBlockKv * 128) + 2 * (kk % 4);
    ptx::wgmma_m64n128k16(score, desc_q, desc_k, kk > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(score);
}

// O (64 x kHeadDim) += P (64 x 128 keys, bf16 from the scores' registers) V (128 keys x kHeadDim, N-major).
template <int kHeadDim>
__device__ __forceinline__ void attention_values(const float (&probability)[kScoreValues], const uint8_t* v_tile,
                                                 float (&o)[kHeadDim / 2]) {
  constexpr int kSteps = KernelConfig::kBlockKv / 16;
  // The m64k16 A fragment of keys [16 kc, 16 kc + 16) is the score accumulator's column groups 2 kc and 2 kc + 1.
  // NOTE: all fragments are packed before the wgmma fence: a register written between the fence and the MMA that
  // reads it makes ptxas serialize every wgmma of the kernel.
  uint32_t a[kSteps][4];
#pragma unroll
  for (int kc = 0; kc < kSteps; ++kc) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kc][r] = pack_bf16(probability[8 * kc + 2 * r], probability[8 * kc + 2 * r + 1]);
  }
  ptx::fence_registers(o);
  ptx::wgmma_fence();
#pragma unroll
  for (int kc = 0; kc < kSteps; ++kc) {
    const uint64_t desc_v =
        ptx::wgmma_descriptor_mn_major_sw128(v_tile + kc * 16 * 128, KernelConfig::kBlockKv * 128);
    if constexpr (kHeadDim == 128) {
      ptx::wgmma_m64n128k16_rs_nmajor(o, a[kc], desc_v);
    } else {
      ptx::wgmma_m64n64k16_rs_nmajor(o, a[kc], desc_v);
    }
  }
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(o);
}

// Online softmax of one block of scores, in place (scores become unnormalized probabilities); returns the factor
// by which the output accumulated so far must be scaled, per row half.
__device__ __forceinline__ float2 online_softmax(float (&score)[kScoreValues], float (&row_max)[2],
                                                 float (&row_sum)[2], float scale_log2, bool diagonal,
                                                 int32_t first_key, int32_t query0, int thread_in_wg) {
  float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kScoreValues / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2;
      const int32_t key = first_key + 8 * j + 2 * (thread_in_wg % 4) + (e % 2);
      float& value = score[4 * j + e];
      value = diagonal && key > query0 + 8 * half ? -INFINITY : value * scale_log2;
      block_max[half] = fmaxf(block_max[half], value);
    }
  }
  float correction[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    block_max[half] = fmaxf(block_max[half], __shfl_xor_sync(0xffffffff, block_max[half], 1));
    block_max[half] = fmaxf(block_max[half], __shfl_xor_sync(0xffffffff, block_max[half], 2));
    const float new_max = fmaxf(row_max[half], block_max[half]);  // finite: key 0 is visible to every query
    correction[half] = exp2f(row_max[half] - new_max);
    row_max[half] = new_max;
    row_sum[half] *= correction[half];
  }
#pragma unroll
  for (int i = 0; i < kScoreValues; ++i) {
    const int half = (i / 2) % 2;
    score[i] = exp2f(score[i] - row_max[half]);
    row_sum[half] += score[i];
  }
  return make_float2(correction[0], correction[1]);
}

template <int kHeadDim>
__device__ __forceinline__ bool consume_attention_head_dim(const MegakernelParams& p, const SharedState& s,
                                                           const Instruction& in, PipelineState& state,
                                                           OutputState& output, Site site, int warpgroup,
                                                           int thread_in_wg, uint64_t* trace) {
  const ModelDims& d = p.dims;
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  // position (within the sequence) of this thread's first accumulator row; the second is 8 further
  const int32_t query0 = query_begin + warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
  bool ok = wait_barrier(p, s.loaded, output.loaded_parity(), site);  // Q
  if (trace) trace[kTraceDataReady] = clock64();

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share; summed over the quad at the end
  const int32_t kv_blocks = attention_kv_blocks(p, in);
  for (int32_t kb = 0; kb < kv_blocks; ++kb) {
    float score[kScoreValues];
    ok &= wait_barrier(p, &s.full[state.stage], state.phase, site);
    attention_scores<kHeadDim>(s.output, s.stage(state.stage), warpgroup, score);
    release_stage(s, state.stage);
    state.advance();

    const bool diagonal = kb == kv_blocks - 1;  // earlier blocks end before the tile's first query
    const float2 correction = online_softmax(score, row_max, row_sum, d.softmax_scale_log2, diagonal,
                                             kb * KernelConfig::kBlockKv, query0, thread_in_wg);
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= (i / 2) % 2 == 0 ? correction.x : correction.y;

    ok &= wait_barrier(p, &s.full[state.stage], state.phase, site);
    attention_values<kHeadDim>(score, s.stage(state.stage), o);
    release_stage(s, state.stage);
    state.advance();
  }
  if (trace) trace[kTraceMathDone] = clock64();

  float inverse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 2);
    inverse[half] = 1.0f / row_sum[half];
  }
  // NOTE: O overwrites this warpgroup's own Q rows, which its last QK^T (complete) was the last to read.
  write_output_tile<kHeadDim / 8>(s, false, [&](int i) { return o[i] * inverse[(i / 2) % 2]; }, warpgroup,
                                  thread_in_wg);
  stage_output_tile(s, output, true, thread_in_wg);
  return ok;
}

__device__ __forceinline__ bool consume_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, OutputState& output,
                                                  Site site, int warpgroup, int thread_in_wg, uint64_t* trace) {
  if (p.dims.head_dim == 128)
    return consume_attention_head_dim<128>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
  return consume_attention_head_dim<64>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
}

// ---- storer ----

__device__ __forceinline__ bool store_attention(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                                OutputState& output, Site site) {
  const ModelDims& d = p.dims;
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  return store_output_tile(p, s, output, &p.maps[kMapAttnOut], d.head_dim / KernelConfig::kBoxCols, in.col_begin,
                           in.col_end, query_begin, in.layer * d.batch + in.sequence, in.signal_counter, site);
}

}  // namespace mk::gpu
