// Decode attention's block math on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 out): one KV block's scores,
// softmax weights and weighted values for the query heads of one kv head, from Q, K and V staged in shared memory.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../ptx.cuh"
#include "mk/tiles.h"

namespace mk::gpu {

// NOTE: how a block's math spreads over the 8 consumer warps. On the CUDA cores (one score per thread, a serial
// head_dim-long dot product; one output per thread, a serial 128-key sum) a block took ~6.7 us on the H200 (1B
// shape), which was the math, not the load. Here the kv head's query heads (G <= 8) are the mma's M rows 0-7; rows
// 8-15 are zero registers, never loaded: half of each mma is wasted, but with keys as M instead the scores would
// come out transposed against the A operand that P V needs. Scores: warp w takes keys [16w, 16w + 16) (two n-tiles)
// over all of head_dim, so no warp needs another's partial sums, and the softmax needs one exchange of per-warp
// maxima. P V: every warp needs all 128 keys as its K, so the weights go through shared memory as bf16, and warp w
// takes the 8-column n-tiles w, w + 8, ... of head_dim over every key: each output has one writer, no reduction.
// Lane conventions (PTX ISA, mma.m16n8k16): g = lane / 4 is a C row (query head) and a B column, t = lane % 4; C
// registers 0 and 1 hold columns 2t and 2t + 1 of row g (2 and 3, rows g + 8, are dropped).
constexpr int kMmaHeads = 8;                              // M rows that carry query heads
constexpr int kWeightStride = tiles::kDecodeKvBlock + 8;  // 16 bytes of padding: ldmatrix's 8 rows in 8 bank groups
constexpr int kMmaKeysPerWarp = tiles::kDecodeKvBlock / KernelConfig::kConsumerWarps;
static_assert(kMmaKeysPerWarp == 16, "each warp's keys are two n-tiles: one x4 ldmatrix of K per k16 step");

// Row `head`'s scores against this warp's keys: score[j][i] = q_head . k_key / sqrt(head_dim) for key
// 16 warp + 8 j + 2 t + i, -inf for keys >= `keys`. head = g; heads >= G repeat head G - 1. q: (G, stride) bf16,
// k: (kDecodeKvBlock, stride) bf16, rows `stride` elements apart (head_dim + 8: conflict-free ldmatrix).
__device__ __forceinline__ void mma_block_scores(const __nv_bfloat16* q, const __nv_bfloat16* k, int32_t head_dim,
                                                 int32_t stride, int32_t group, int32_t keys, int warp, int lane,
                                                 float (&score)[2][2]) {
  const int32_t first_key = kMmaKeysPerWarp * warp;
  float acc[2][4] = {};
  if (first_key < keys) {  // warp-uniform, as ldmatrix needs: a warp past the block's keys has only -inf scores
    // A (x2): lanes 0-7 point at query rows 0-7 at k 0-7 of the step, lanes 8-15 at k 8-15: A registers 0 and 2.
    // B (x4): lanes 0-7 at keys +0..7, k 0-7, lanes 8-15 at k 8-15, lanes 16-31 likewise for keys +8..15: b0 b1 of
    // n-tile 0, then of n-tile 1.
    const uint32_t q_lane = ptx::smem_address(q + min(lane % 8, group - 1) * stride + lane / 8 % 2 * 8);
    const uint32_t k_lane = ptx::smem_address(k + (first_key + lane % 8 + lane / 16 * 8) * stride + lane / 8 % 2 * 8);
    // NOTE: two steps a trip put both steps' ldmatrix in flight before their mmas wait; the loops stay otherwise
    // rolled, as the whole kernel shares ptxas's 168 registers.
#pragma unroll 2
    for (int32_t step = 0; step < head_dim / 16; ++step) {
      uint32_t q_rows[2], b[4];
      ptx::ldmatrix_x2(q_rows, q_lane + step * 32);
      ptx::ldmatrix_x4(b, k_lane + step * 32);
      const uint32_t a[4] = {q_rows[0], 0u, q_rows[1], 0u};
      ptx::mma_m16n8k16_bf16(acc[0], a, b[0], b[1]);
      ptx::mma_m16n8k16_bf16(acc[1], a, b[2], b[3]);
    }
  }
  const float scale = rsqrtf(float(head_dim));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int32_t key = first_key + 8 * j + 2 * (lane % 4) + i;
      score[j][i] = key < keys ? acc[j][i] * scale : -INFINITY;  // a select: stale K rows may hold NaN
    }
  }
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffff, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffff, value, 1);
  return value + __shfl_xor_sync(0xffffffff, value, 2);
}

// The block's softmax weights exp(score - max) (max over the block's keys, per head) into weights as bf16, and each
// warp's max and sum of its keys' weights into warp_maxima and warp_sums. Synchronizes the consumers once (the max).
// NOTE: the sum adds the bf16-rounded weights that P V multiplies, not the fp32 exponentials: numerator and
// denominator then use the same weights, so the combine's output is a true weighted mean of V (a constant V comes
// back exactly), where the fp32 sum would leave each block's normalization off by the rounding of its weights.
__device__ __forceinline__ void mma_block_weights(const float (&score)[2][2],
                                                  __nv_bfloat16* weights,  // (kMmaHeads, kWeightStride) bf16
                                                  float* warp_maxima,      // (kConsumerWarps, kMmaHeads)
                                                  float* warp_sums,        // (kConsumerWarps, kMmaHeads)
                                                  int warp, int lane) {
  const int head = lane / 4;
  float max = quad_max(fmaxf(fmaxf(score[0][0], score[0][1]), fmaxf(score[1][0], score[1][1])));
  if (lane % 4 == 0) warp_maxima[warp * kMmaHeads + head] = max;
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  for (int w = 0; w < KernelConfig::kConsumerWarps; ++w) max = fmaxf(max, warp_maxima[w * kMmaHeads + head]);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(__expf(score[j][0] - max), __expf(score[j][1] - max));
    const int32_t key = kMmaKeysPerWarp * warp + 8 * j + 2 * (lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(weights + head * kWeightStride + key) = pair;
    const float2 rounded = __bfloat1622float2(pair);
    sum += rounded.x + rounded.y;
  }
  sum = quad_sum(sum);
  if (lane % 4 == 0) warp_sums[warp * kMmaHeads + head] = sum;
}

// V rows [keys, keys rounded up to 32) as zeros: P V reads keys in steps of 32, and a zero weight times a stale NaN
// left in the ring would still be NaN. v: (kDecodeKvBlock, stride) bf16.
__device__ __forceinline__ void zero_value_tail(__nv_bfloat16* v, int32_t head_dim, int32_t stride, int32_t keys,
                                                int consumer_thread) {
  const int32_t chunks = head_dim / 8, rows = (keys + 31) / 32 * 32 - keys;
  for (int32_t i = consumer_thread; i < rows * chunks; i += KernelConfig::kConsumerThreads)
    reinterpret_cast<uint4*>(v + (keys + i / chunks) * stride)[i % chunks] = make_uint4(0, 0, 0, 0);
}

// o[h][e] = sum_key weights[h][key] v[key][e] for heads h < group into record (head h's o at h * record_stride), over
// the block's keys in pairs of k16 steps (V rows past `keys` up to the pair's end are zeros: zero_value_tail).
// weights: (kMmaHeads, kWeightStride) bf16; v: (kDecodeKvBlock, stride) bf16.
__device__ __forceinline__ void mma_block_output(const __nv_bfloat16* weights, const __nv_bfloat16* v, int32_t head_dim,
                                                 int32_t stride, int32_t group, int32_t keys, float* record,
                                                 int32_t record_stride, int warp, int lane) {
  // A (x4): lanes 8i..8i+7 point at weight rows 0-7, keys 8i..8i+7 of the pair: A registers 0 and 2 of its first
  // step, then of its second. B (x4, transposed): lanes 8i..8i+7 at V rows (keys) 8i..8i+7 of the pair, at the
  // n-tile's 8 columns: b0 b1 of the first step, then of the second.
  const uint32_t weights_lane = ptx::smem_address(weights + lane % 8 * kWeightStride + lane / 8 * 8);
  const uint32_t v_lane = ptx::smem_address(v + lane * stride);
  const int32_t pairs = (keys + 31) / 32;
  const int head = lane / 4;
#pragma unroll 1
  for (int32_t tile = warp; tile < head_dim / 8; tile += KernelConfig::kConsumerWarps) {
    float acc[4] = {};
#pragma unroll 2
    for (int32_t pair = 0; pair < pairs; ++pair) {
      uint32_t p[4], b[4];
      ptx::ldmatrix_x4(p, weights_lane + pair * 32 * 2);
      ptx::ldmatrix_x4_trans(b, v_lane + uint32_t(pair * 32 * stride + tile * 8) * 2);
      const uint32_t first[4] = {p[0], 0u, p[1], 0u}, second[4] = {p[2], 0u, p[3], 0u};
      ptx::mma_m16n8k16_bf16(acc, first, b[0], b[1]);
      ptx::mma_m16n8k16_bf16(acc, second, b[2], b[3]);
    }
    if (head < group)
      *reinterpret_cast<float2*>(record + head * record_stride + tile * 8 + 2 * (lane % 4)) =
          make_float2(acc[0], acc[1]);
  }
}

// Head h's max and sum over the block (h < group, one thread each) from the warps' shares, in warp order.
__device__ __forceinline__ float2 mma_block_stats(const float* warp_maxima, const float* warp_sums, int head) {
  float max = -INFINITY, sum = 0.0f;
  for (int w = 0; w < KernelConfig::kConsumerWarps; ++w) {
    max = fmaxf(max, warp_maxima[w * kMmaHeads + head]);
    sum += warp_sums[w * kMmaHeads + head];
  }
  return make_float2(max, sum);
}

}  // namespace mk::gpu
