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
// A tile of several blocks may instead give each half of the warps every other block (BlockWarps): a warp then
// scores 32 keys and takes two n-tiles of P V at once, and the halves' chains of dependent instructions overlap.
constexpr int kMmaHeads = 8;                              // M rows that carry query heads
constexpr int kWeightStride = tiles::kDecodeKvBlock + 8;  // 16 bytes of padding: ldmatrix's 8 rows in 8 bank groups

// The warps that compute one block: all consumer warps (kWarps 8, the consumers' barrier 1), or one half of them
// (kWarps 4, named barrier 2 + half; decode kernels only, where the forward's attention barriers are not compiled).
template <int kWarps>
struct BlockWarps {
  static_assert(kWarps == KernelConfig::kConsumerWarps || 2 * kWarps == KernelConfig::kConsumerWarps,
                "all consumer warps, or one half");
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeys = tiles::kDecodeKvBlock / kWarps;  // a warp's keys: 16 or 32
  static constexpr int kKeyTiles = kKeys / 8;                    // its n-tiles of scores: 2 or 4
  static constexpr int kValueTilesAtOnce = KernelConfig::kConsumerWarps / kWarps;  // of P V a trip: 1 or 2
  static_assert(kKeys % 16 == 0, "each warp's keys are whole n-tile pairs: one x4 ldmatrix of K a k16 step");
  int warp;          // in the set
  int first_warp;    // the set's first consumer warp: its slots in warp_maxima and warp_sums
  uint32_t barrier;  // the set's named barrier
  int thread;        // in the set
  __device__ __forceinline__ void sync() const { ptx::named_barrier_sync(barrier, kThreads); }
};

// Row `head`'s scores against this warp's keys: score[j][i] = q_head . k_key / sqrt(head_dim) for key
// kKeys warp + 8 j + 2 t + i, -inf for keys >= `keys`. head = g; heads >= G repeat head G - 1. q: (G, stride) bf16,
// k: (kDecodeKvBlock, stride) bf16, rows `stride` elements apart (head_dim + 8: conflict-free ldmatrix).
template <int kWarps>
__device__ __forceinline__ void mma_block_scores(const __nv_bfloat16* q, const __nv_bfloat16* k, int32_t head_dim,
                                                 int32_t stride, int32_t group, int32_t keys,
                                                 const BlockWarps<kWarps>& set, int lane,
                                                 float (&score)[BlockWarps<kWarps>::kKeyTiles][2]) {
  constexpr int kTiles = BlockWarps<kWarps>::kKeyTiles;
  const int32_t first_key = BlockWarps<kWarps>::kKeys * set.warp;
  float acc[kTiles][4] = {};
  if (first_key < keys) {  // warp-uniform, as ldmatrix needs: a warp past the block's keys has only -inf scores
    // A (x2): lanes 0-7 point at query rows 0-7 at k 0-7 of the step, lanes 8-15 at k 8-15: A registers 0 and 2.
    // B (x4, a pair of n-tiles): lanes 0-7 at keys +0..7, k 0-7, lanes 8-15 at k 8-15, lanes 16-31 likewise for
    // keys +8..15: b0 b1 of the pair's first n-tile, then of its second.
    const uint32_t q_lane = ptx::smem_address(q + min(lane % 8, group - 1) * stride + lane / 8 % 2 * 8);
    const uint32_t k_lane = ptx::smem_address(k + (first_key + lane % 8 + lane / 16 * 8) * stride + lane / 8 % 2 * 8);
    // NOTE: two steps a trip put both steps' ldmatrix in flight before their mmas wait; the loops stay otherwise
    // rolled, as the whole kernel shares ptxas's 168 registers.
#pragma unroll 2
    for (int32_t step = 0; step < head_dim / 16; ++step) {
      uint32_t q_rows[2];
      ptx::ldmatrix_x2(q_rows, q_lane + step * 32);
      const uint32_t a[4] = {q_rows[0], 0u, q_rows[1], 0u};
#pragma unroll
      for (int pair = 0; pair < kTiles / 2; ++pair) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, k_lane + uint32_t(pair * 16 * stride * 2) + step * 32);
        ptx::mma_m16n8k16_bf16(acc[2 * pair], a, b[0], b[1]);
        ptx::mma_m16n8k16_bf16(acc[2 * pair + 1], a, b[2], b[3]);
      }
    }
  }
  const float scale = rsqrtf(float(head_dim));
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
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
// warp's max and sum of its keys' weights into warp_maxima and warp_sums. Synchronizes the set once (the max).
// NOTE: the sum adds the bf16-rounded weights that P V multiplies, not the fp32 exponentials: numerator and
// denominator then use the same weights, so the combine's output is a true weighted mean of V (a constant V comes
// back exactly), where the fp32 sum would leave each block's normalization off by the rounding of its weights.
template <int kWarps>
__device__ __forceinline__ void mma_block_weights(const float (&score)[BlockWarps<kWarps>::kKeyTiles][2],
                                                  __nv_bfloat16* weights,  // (kMmaHeads, kWeightStride) bf16
                                                  float* warp_maxima,      // (kConsumerWarps, kMmaHeads)
                                                  float* warp_sums,        // (kConsumerWarps, kMmaHeads)
                                                  const BlockWarps<kWarps>& set, int lane) {
  constexpr int kTiles = BlockWarps<kWarps>::kKeyTiles;
  const int head = lane / 4, slot = (set.first_warp + set.warp) * kMmaHeads + head;
  float max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) max = fmaxf(max, fmaxf(score[j][0], score[j][1]));
  max = quad_max(max);
  if (lane % 4 == 0) warp_maxima[slot] = max;
  set.sync();
  for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_maxima[(set.first_warp + w) * kMmaHeads + head]);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(__expf(score[j][0] - max), __expf(score[j][1] - max));
    const int32_t key = BlockWarps<kWarps>::kKeys * set.warp + 8 * j + 2 * (lane % 4);
    *reinterpret_cast<__nv_bfloat162*>(weights + head * kWeightStride + key) = pair;
    const float2 rounded = __bfloat1622float2(pair);
    sum += rounded.x + rounded.y;
  }
  sum = quad_sum(sum);
  if (lane % 4 == 0) warp_sums[slot] = sum;
}

// V rows [keys, keys rounded up to 32) as zeros: P V reads keys in steps of 32, and a zero weight times a stale NaN
// left in the ring would still be NaN. v: (kDecodeKvBlock, stride) bf16.
__device__ __forceinline__ void zero_value_tail(__nv_bfloat16* v, int32_t head_dim, int32_t stride, int32_t keys,
                                                int thread, int threads) {
  const int32_t chunks = head_dim / 8, rows = (keys + 31) / 32 * 32 - keys;
  for (int32_t i = thread; i < rows * chunks; i += threads)
    reinterpret_cast<uint4*>(v + (keys + i / chunks) * stride)[i % chunks] = make_uint4(0, 0, 0, 0);
}

// o[h][e] = sum_key weights[h][key] v[key][e] for heads h < group into record (head h's o at h * record_stride), over
// the block's keys in pairs of k16 steps (V rows past `keys` up to the pair's end are zeros: zero_value_tail).
// A warp takes kValueTilesAtOnce n-tiles a trip (tile, tile + kWarps, ...), one weight fragment for all of them.
// weights: (kMmaHeads, kWeightStride) bf16; v: (kDecodeKvBlock, stride) bf16.
template <int kWarps>
__device__ __forceinline__ void mma_block_output(const __nv_bfloat16* weights, const __nv_bfloat16* v, int32_t head_dim,
                                                 int32_t stride, int32_t group, int32_t keys, float* record,
                                                 int32_t record_stride, const BlockWarps<kWarps>& set, int lane) {
  constexpr int kAtOnce = BlockWarps<kWarps>::kValueTilesAtOnce;
  // A (x4): lanes 8i..8i+7 point at weight rows 0-7, keys 8i..8i+7 of the pair: A registers 0 and 2 of its first
  // step, then of its second. B (x4, transposed): lanes 8i..8i+7 at V rows (keys) 8i..8i+7 of the pair, at the
  // n-tile's 8 columns: b0 b1 of the first step, then of the second.
  const uint32_t weights_lane = ptx::smem_address(weights + lane % 8 * kWeightStride + lane / 8 * 8);
  const uint32_t v_lane = ptx::smem_address(v + lane * stride);
  const int32_t pairs = (keys + 31) / 32, tiles = head_dim / 8;
  const int head = lane / 4;
#pragma unroll 1
  for (int32_t tile = set.warp; tile < tiles; tile += kWarps * kAtOnce) {
    float acc[kAtOnce][4] = {};
#pragma unroll 2
    for (int32_t pair = 0; pair < pairs; ++pair) {
      uint32_t p[4];
      ptx::ldmatrix_x4(p, weights_lane + pair * 32 * 2);
      const uint32_t first[4] = {p[0], 0u, p[1], 0u}, second[4] = {p[2], 0u, p[3], 0u};
#pragma unroll
      for (int i = 0; i < kAtOnce; ++i) {
        if (i > 0 && tile + i * kWarps >= tiles) break;  // warp-uniform
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, v_lane + uint32_t(pair * 32 * stride + (tile + i * kWarps) * 8) * 2);
        ptx::mma_m16n8k16_bf16(acc[i], first, b[0], b[1]);
        ptx::mma_m16n8k16_bf16(acc[i], second, b[2], b[3]);
      }
    }
#pragma unroll
    for (int i = 0; i < kAtOnce; ++i) {
      if (head < group && tile + i * kWarps < tiles)
        *reinterpret_cast<float2*>(record + head * record_stride + (tile + i * kWarps) * 8 + 2 * (lane % 4)) =
            make_float2(acc[i][0], acc[i][1]);
    }
  }
}

// Head h's max and sum over the block (h < group, one thread each) from the set's warps' shares, in warp order.
template <int kWarps>
__device__ __forceinline__ float2 mma_block_stats(const float* warp_maxima, const float* warp_sums,
                                                  const BlockWarps<kWarps>& set, int head) {
  float max = -INFINITY, sum = 0.0f;
  for (int w = set.first_warp; w < set.first_warp + kWarps; ++w) {
    max = fmaxf(max, warp_maxima[w * kMmaHeads + head]);
    sum += warp_sums[w * kMmaHeads + head];
  }
  return make_float2(max, sum);
}

}  // namespace mk::gpu
