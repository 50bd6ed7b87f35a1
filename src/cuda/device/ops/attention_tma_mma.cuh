// Causal attention tiles: one (sequence, 128-query block, query head) per instruction. The producer streams Q and
// then 64-key K/V blocks through the stage ring with TMA; each of the 8 consumer warps owns 16 queries and runs an
// FA2-style online softmax with mma.sync m16n8k16 (first version; wgmma for QK^T and PV is the next step).
#pragma once

#include <cuda_bf16.h>

#include <utility>

#include "../config.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// Key blocks the tile needs: keys [0, last query of the tile].
__device__ __forceinline__ int32_t attention_kv_blocks(const MegakernelParams& p, const Instruction& in) {
  const int32_t query_end = in.row_end - in.sequence * p.dims.seq_len;
  return (query_end + KernelConfig::kBlockKv - 1) / KernelConfig::kBlockKv;
}

__device__ __forceinline__ int32_t attention_stages(const MegakernelParams& p, const Instruction& in) {
  return 1 + attention_kv_blocks(p, in);
}

// ---- producer ----

__device__ __forceinline__ bool produce_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, Site site) {
  const ModelDims& d = p.dims;
  const int32_t halves = d.head_dim / 64;  // 64-column boxes per head: the 128-byte swizzle spans 64 bf16
  const int32_t plane = in.layer * d.batch + in.sequence;
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  const int32_t kv_head = in.head / d.group_size;
  const int32_t k_col = d.q_dim + kv_head * d.head_dim;
  const int32_t v_col = d.q_dim + d.kv_dim + kv_head * d.head_dim;

  if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
  {
    uint8_t* stage = s.stage(state.stage);
    ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], uint32_t(KernelConfig::kBlockQ * d.head_dim * 2));
    for (int32_t h = 0; h < halves; ++h)
      ptx::tma_load_3d(stage + h * KernelConfig::kBlockQ * 128, &p.maps[kMapQuery], &s.full[state.stage],
                       in.col_begin + 64 * h, query_begin, plane);
    state.advance();
  }
  const int32_t kv_blocks = attention_kv_blocks(p, in);
  const int32_t tile_bytes = KernelConfig::kBlockKv * d.head_dim * 2;
  for (int32_t kb = 0; kb < kv_blocks; ++kb) {
    if (!wait_barrier(p, &s.empty[state.stage], state.phase ^ 1, site)) return false;
    uint8_t* stage = s.stage(state.stage);
    ptx::mbarrier_arrive_expect_tx(&s.full[state.stage], uint32_t(2 * tile_bytes));
    for (int32_t h = 0; h < halves; ++h) {
      ptx::tma_load_3d(stage + h * KernelConfig::kBlockKv * 128, &p.maps[kMapKeyValue], &s.full[state.stage],
                       k_col + 64 * h, kb * KernelConfig::kBlockKv, plane);
      ptx::tma_load_3d(stage + tile_bytes + h * KernelConfig::kBlockKv * 128, &p.maps[kMapKeyValue],
                       &s.full[state.stage], v_col + 64 * h, kb * KernelConfig::kBlockKv, plane);
    }
    state.advance();
  }
  return true;
}

// ---- consumer ----

// ldmatrix row addresses into a tile that TMA wrote as boxes of 64 columns (128-byte rows) with the 128-byte
// swizzle: 16-byte chunk c of row r sits at chunk c ^ (r % 8). Each lane addresses one row of one 8x8 matrix: the
// row (within the tile) and the chunk parity are fixed per lane, the rest is compile-time.
// NOTE: keeping only two per-lane values (instead of one address per fragment) stops ptxas from hoisting dozens
// of loop-invariant addresses into registers.
struct SwizzledRows {
  uint32_t row_bytes;  // (row of this lane) * 128
  uint32_t chunk_xor;  // (row % 8) ^ (8-column half of the 16-column chunk this lane addresses)

  __device__ __forceinline__ SwizzledRows(int32_t row, int32_t column_half) {
    row_bytes = uint32_t(row) * 128;
    chunk_xor = uint32_t((row % 8) ^ column_half);
  }
  // Address for the lane's row plus `row_step` rows, at 16-column chunk col16 (col / 16) of a tile whose boxes
  // hold `box_rows` rows.
  template <int kBoxRows, int kRowStep, int kCol16>
  __device__ __forceinline__ uint32_t at(uint32_t tile) const {
    constexpr uint32_t kBox = kCol16 / 4;
    constexpr uint32_t kChunkPair = 2 * (kCol16 % 4);
    return tile + kBox * kBoxRows * 128 + kRowStep * 128 + row_bytes + ((kChunkPair ^ chunk_xor) << 4);
  }
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <int kHeadDim>
__device__ __forceinline__ bool consume_attention_head_dim(const MegakernelParams& p, const SharedState& s,
                                                           const Instruction& in, PipelineState& state, Site site,
                                                           int consumer_thread, uint64_t* trace) {
  constexpr int kChunks = kHeadDim / 16;  // 16-wide k-chunks of QK^T, and pairs of 8-wide output tiles of PV
  const ModelDims& d = p.dims;
  const int warp = consumer_thread / 32;
  const int lane = consumer_thread % 32;
  const int matrix = lane / 8;  // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  // query positions (within the sequence) of this thread's two accumulator rows
  const int32_t query0 = query_begin + warp * 16 + lane / 4;
  const int32_t query1 = query0 + 8;

  // Q fragments stay in registers for the whole tile, so the Q stage is released at once.
  uint32_t q[kChunks][4];
  if (!wait_barrier(p, &s.full[state.stage], state.phase, site)) return false;  // the whole warp agrees: no MMA yet
  {
    const uint32_t tile = ptx::smem_address(s.stage(state.stage));
    const SwizzledRows rows(warp * 16 + (matrix % 2) * 8 + lane % 8, matrix / 2);
    [&]<int... kc>(std::integer_sequence<int, kc...>) {
      (ptx::ldmatrix_x4(q[kc], rows.at<KernelConfig::kBlockQ, 0, kc>(tile)), ...);
    }(std::make_integer_sequence<int, kChunks>{});
    release_stage(s, state.stage);
    state.advance();
  }

  float o[2 * kChunks][4];
#pragma unroll
  for (int t = 0; t < 2 * kChunks; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share; summed over the quad at the end

  const int32_t kv_blocks = attention_kv_blocks(p, in);
  const SwizzledRows key_rows((matrix / 2) * 8 + lane % 8, matrix % 2);    // K as the B operand of QK^T
  const SwizzledRows value_rows((matrix % 2) * 8 + lane % 8, matrix / 2);  // V, transposed, as the B operand of PV
  bool ok = true;
  for (int32_t kb = 0; kb < kv_blocks; ++kb) {
    ok &= wait_barrier(p, &s.full[state.stage], state.phase, site);
    const uint32_t k_tile = ptx::smem_address(s.stage(state.stage));
    const uint32_t v_tile = k_tile + KernelConfig::kBlockKv * kHeadDim * 2;

    // NOTE: the 64-key stage is processed as two 32-key halves to keep the score tile at 16 registers.
#pragma unroll
    for (int key_half = 0; key_half < 2; ++key_half) {
      const int32_t first_key = kb * KernelConfig::kBlockKv + key_half * 32;
      // scores (16 queries x 32 keys) = Q K^T, as 4 tiles of 16 x 8
      float score[4][4];
#pragma unroll
      for (int t = 0; t < 4; ++t) score[t][0] = score[t][1] = score[t][2] = score[t][3] = 0.0f;
      [&]<int... kc>(std::integer_sequence<int, kc...>) {
        auto chunk = [&]<int kChunk>(std::integral_constant<int, kChunk>) {
          uint32_t b[4];
          ptx::ldmatrix_x4(b, key_rows.at<KernelConfig::kBlockKv, 0, kChunk>(k_tile + key_half * 32 * 128));
          ptx::mma_m16n8k16_bf16(score[0], q[kChunk], b[0], b[1]);
          ptx::mma_m16n8k16_bf16(score[1], q[kChunk], b[2], b[3]);
          ptx::ldmatrix_x4(b, key_rows.at<KernelConfig::kBlockKv, 16, kChunk>(k_tile + key_half * 32 * 128));
          ptx::mma_m16n8k16_bf16(score[2], q[kChunk], b[0], b[1]);
          ptx::mma_m16n8k16_bf16(score[3], q[kChunk], b[2], b[3]);
        };
        (chunk(std::integral_constant<int, kc>{}), ...);
      }(std::make_integer_sequence<int, kChunks>{});

      // causal mask and online softmax in base 2
      float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t key = first_key + t * 8 + 2 * (lane % 4) + (e % 2);
          const int32_t query = e < 2 ? query0 : query1;
          const float value = key > query ? -INFINITY : score[t][e] * d.softmax_scale_log2;
          score[t][e] = value;
          block_max[e / 2] = fmaxf(block_max[e / 2], value);
        }
      }
      float correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffff, block_max[r], 1));
        block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffff, block_max[r], 2));
        const float new_max = fmaxf(row_max[r], block_max[r]);  // finite: key 0 is visible to every query
        correction[r] = exp2f(row_max[r] - new_max);
        row_max[r] = new_max;
        row_sum[r] *= correction[r];
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          score[t][e] = exp2f(score[t][e] - row_max[e / 2]);
          row_sum[e / 2] += score[t][e];
        }
      }
#pragma unroll
      for (int t = 0; t < 2 * kChunks; ++t) {
        o[t][0] *= correction[0];
        o[t][1] *= correction[0];
        o[t][2] *= correction[1];
        o[t][3] *= correction[1];
      }

      // o (16 x head_dim) += P (16 x 32 keys, bf16) V (32 keys x head_dim)
#pragma unroll
      for (int kc = 0; kc < 2; ++kc) {
        const uint32_t a[4] = {pack_bf16(score[2 * kc][0], score[2 * kc][1]),
                               pack_bf16(score[2 * kc][2], score[2 * kc][3]),
                               pack_bf16(score[2 * kc + 1][0], score[2 * kc + 1][1]),
                               pack_bf16(score[2 * kc + 1][2], score[2 * kc + 1][3])};
        const uint32_t v_rows = v_tile + (key_half * 32 + kc * 16) * 128;
        [&]<int... pair>(std::integer_sequence<int, pair...>) {
          auto dims = [&]<int kPair>(std::integral_constant<int, kPair>) {
            uint32_t b[4];
            ptx::ldmatrix_x4_trans(b, value_rows.at<KernelConfig::kBlockKv, 0, kPair>(v_rows));
            ptx::mma_m16n8k16_bf16(o[2 * kPair], a, b[0], b[1]);
            ptx::mma_m16n8k16_bf16(o[2 * kPair + 1], a, b[2], b[3]);
          };
          (dims(std::integral_constant<int, pair>{}), ...);
        }(std::make_integer_sequence<int, kChunks>{});
      }
    }
    release_stage(s, state.stage);
    state.advance();
  }

  if (trace) trace[kTraceMathDone] = clock64();
  // normalize and store the rows that belong to the sequence
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
  }
  __nv_bfloat16* out = p.attn + int64_t(in.layer) * d.tokens * d.q_dim;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int32_t query = r == 0 ? query0 : query1;
    if (query >= d.seq_len || in.sequence * d.seq_len + query >= in.row_end) continue;
    const float inverse = 1.0f / row_sum[r];
    __nv_bfloat16* row_pointer = out + int64_t(in.sequence * d.seq_len + query) * d.q_dim + in.col_begin;
#pragma unroll
    for (int t = 0; t < 2 * kChunks; ++t) {
      const int32_t col = t * 8 + 2 * (lane % 4);
      *reinterpret_cast<__nv_bfloat162*>(row_pointer + col) =
          __floats2bfloat162_rn(o[t][2 * r] * inverse, o[t][2 * r + 1] * inverse);
    }
  }
  return ok;
}

__device__ __forceinline__ bool consume_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, Site site,
                                                  int consumer_thread, uint64_t* trace) {
  if (p.dims.head_dim == 128) return consume_attention_head_dim<128>(p, s, in, state, site, consumer_thread, trace);
  return consume_attention_head_dim<64>(p, s, in, state, site, consumer_thread, trace);
}

}  // namespace mk::gpu
