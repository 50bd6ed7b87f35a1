// Row-wise ops run by the consumer warps with plain 16-byte loads and stores: token embedding and RMSNorm.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// hidden[0][rows] <- embedding[tokens[rows]], each consumer thread a 16-byte chunk at a time.
// NOTE: one warp per row, its lanes copying chunk after chunk, took 5.7 us for one 4 KB row in a decode step (each
// store may alias the next load, so every chunk was a dependent round trip to HBM), and layer 0's q tiles waited on
// it (fifteenth session, run 1). Spread over every consumer thread, a decode row is one round trip. (Four loads in
// flight per thread made ptxas spill.)
__device__ __forceinline__ void run_embed(const MegakernelParams& p, const Instruction& in, int consumer_thread) {
  const int32_t chunks = p.dims.d_model / 8;
  const int32_t total = (in.row_end - in.row_begin) * chunks;
  for (int32_t i = consumer_thread; i < total; i += KernelConfig::kConsumerThreads) {
    const int32_t row = in.row_begin + i / chunks, chunk = i % chunks;
    const int32_t token = __ldcg(p.tokens + row);
    const uint4* source = reinterpret_cast<const uint4*>(p.weights.embedding + int64_t(token) * p.dims.d_model);
    reinterpret_cast<uint4*>(p.hidden + int64_t(row) * p.dims.d_model)[chunk] = __ldg(source + chunk);
  }
}

// 8 bf16 of a row times inv_rms times the matching 8 norm weights.
__device__ __forceinline__ uint4 normalize_chunk(const uint4& packed, const uint4& packed_weight, float inv_rms) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  const __nv_bfloat162* weights = reinterpret_cast<const __nv_bfloat162*>(&packed_weight);
  uint4 result;
  __nv_bfloat162* results = reinterpret_cast<__nv_bfloat162*>(&result);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(pairs[i]);
    const float2 w = __bfloat1622float2(weights[i]);
    results[i] = __floats2bfloat162_rn(v.x * inv_rms * w.x, v.y * inv_rms * w.y);
  }
  return result;
}

__device__ __forceinline__ float sum_of_squares_of_chunk(const uint4& packed) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(pairs[i]);
    sum += v.x * v.x + v.y * v.y;
  }
  return sum;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffff, value, offset);
  return value;
}

// This lane's 16-byte chunks first + lane + 32 c (c < kCount) of a row of `chunks`, zero past its end or when the
// row is not `valid`: from L2 (kFromL2: rows other SMs wrote) or through L1 (the norm weight). All loads go out before
// any is used: one trip to L2.
template <bool kFromL2, int kCount>
__device__ __forceinline__ void load_chunks(const uint4* row, int32_t first, int32_t chunks, int lane, bool valid,
                                            uint4 (&out)[kCount]) {
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    const int32_t chunk = first + lane + 32 * c;
    out[c] = valid && chunk < chunks ? (kFromL2 ? __ldcg(row + chunk) : row[chunk]) : make_uint4(0, 0, 0, 0);
  }
}

// RMSNorm of one warp's rows (row_begin, then every kConsumerWarps-th row before row_end), whole rows held in
// registers: kChunks 16-byte pieces per lane cover d_model <= 256 kChunks, and kRows rows are loaded at once.
// NOTE: a row's loads are one round trip to L2 (~2 us beside the GEMMs' traffic), and a warp used to make its rows'
// trips one after another. The norm weight is loaded once for all the warp's rows.
template <int kChunks, int kRows>
__device__ __forceinline__ void rmsnorm_rows(const __nv_bfloat16* x, const __nv_bfloat16* weight, __nv_bfloat16* out,
                                             int32_t row_begin, int32_t row_end, int32_t d_model, float eps,
                                             int lane) {
  constexpr int kStride = KernelConfig::kConsumerWarps;  // rows between a warp's rows
  const int32_t chunks = d_model / 8;
  const uint4* weight_row = reinterpret_cast<const uint4*>(weight);
  uint4 packed_weight[kChunks];  // (kChunks) 8 weights each, chunk lane + 32 c
  load_chunks<false>(weight_row, 0, chunks, lane, true, packed_weight);
  for (int32_t first = row_begin; first < row_end; first += kRows * kStride) {
    uint4 packed[kRows][kChunks];  // (kRows, kChunks) 8 bf16 of row first + kStride r each, chunk lane + 32 c
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int32_t row = first + kStride * r;
      load_chunks<true>(reinterpret_cast<const uint4*>(x + int64_t(row) * d_model), 0, chunks, lane, row < row_end,
                        packed[r]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int32_t row = first + kStride * r;
      if (row >= row_end) break;
      float sum_of_squares = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) sum_of_squares += sum_of_squares_of_chunk(packed[r][c]);
      const float inv_rms = 1.0f / sqrtf(warp_sum(sum_of_squares) / float(d_model) + eps);
      uint4* out_row = reinterpret_cast<uint4*>(out + int64_t(row) * d_model);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int32_t chunk = lane + 32 * c;
        if (chunk < chunks) out_row[chunk] = normalize_chunk(packed[r][c], packed_weight[c], inv_rms);
      }
    }
  }
}

// One row too long for registers (d_model > 2048): two passes, each over batches of 2048 elements, loaded at once.
// NOTE: the second pass loaded one chunk at a time (a 32-row task of d_model 3072 took 27 us); batched, 19 us
// (docs/perf.md, eighth session). Holding a 4096-wide row besides its weight spilled.
__device__ __forceinline__ void rmsnorm_long_row(const __nv_bfloat16* x, const __nv_bfloat16* weight,
                                                 __nv_bfloat16* out, int32_t d_model, float eps, int lane) {
  constexpr int kBatch = 8;
  const int32_t chunks = d_model / 8;
  const uint4* x_row = reinterpret_cast<const uint4*>(x);
  float sum_of_squares = 0.0f;
  for (int32_t first = 0; first < chunks; first += 32 * kBatch) {
    uint4 packed[kBatch];  // (kBatch) 8 bf16 each, chunk first + lane + 32 c
    load_chunks<true>(x_row, first, chunks, lane, true, packed);
#pragma unroll
    for (int c = 0; c < kBatch; ++c) sum_of_squares += sum_of_squares_of_chunk(packed[c]);
  }
  const float inv_rms = 1.0f / sqrtf(warp_sum(sum_of_squares) / float(d_model) + eps);
  const uint4* weight_row = reinterpret_cast<const uint4*>(weight);
  uint4* out_row = reinterpret_cast<uint4*>(out);
  for (int32_t first = 0; first < chunks; first += 32 * kBatch) {
    uint4 packed[kBatch];  // (kBatch) 8 bf16 each, chunk first + lane + 32 c
    uint4 packed_weight[kBatch];
    load_chunks<true>(x_row, first, chunks, lane, true, packed);
    load_chunks<false>(weight_row, first, chunks, lane, true, packed_weight);
#pragma unroll
    for (int c = 0; c < kBatch; ++c) {
      const int32_t chunk = first + lane + 32 * c;
      if (chunk < chunks) out_row[chunk] = normalize_chunk(packed[c], packed_weight[c], inv_rms);
    }
  }
}

// out[rows] <- x * rsqrt(mean(x^2) + eps) * weight; each warp takes every kConsumerWarps-th row.
__device__ __forceinline__ void run_rmsnorm(const MegakernelParams& p, const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int64_t T = d.tokens;
  const __nv_bfloat16* x;
  const __nv_bfloat16* weight;
  __nv_bfloat16* out;
  switch (in.opcode) {
    case Opcode::kAttnNorm:
      x = p.hidden + in.layer * T * d.d_model;
      weight = p.weights.attn_norm_weight + in.layer * d.d_model;
      out = p.attn_norm + in.layer * T * d.d_model;
      break;
    case Opcode::kMlpNorm:
      x = p.hidden_mid + in.layer * T * d.d_model;
      weight = p.weights.mlp_norm_weight + in.layer * d.d_model;
      out = p.mlp_norm + in.layer * T * d.d_model;
      break;
    default:  // kFinalNorm
      x = p.hidden + d.n_layers * T * d.d_model;
      weight = p.weights.final_norm_weight;
      out = p.final_norm;
      break;
  }
  const int warp = consumer_thread / 32;
  const int lane = consumer_thread % 32;
  const int32_t first = in.row_begin + warp;
  // NOTE: two instantiations, each holding the norm weight: rows up to 2048 wide take one round trip to L2 with their
  // weight (~2 us each under the GEMMs' traffic, docs/perf.md, eighth session). A third, for rows up to 4096 without
  // the weight held, spilled, and one for up to 4096 in place of the second made 1280-wide rows wait for two trips.
  if (d.d_model <= 1024) {
    rmsnorm_rows<4, 4>(x, weight, out, first, in.row_end, d.d_model, d.rms_norm_eps, lane);
  } else if (d.d_model <= 2048) {
    rmsnorm_rows<8, 1>(x, weight, out, first, in.row_end, d.d_model, d.rms_norm_eps, lane);
  } else {
    for (int32_t row = first; row < in.row_end; row += KernelConfig::kConsumerWarps) {
      const int64_t offset = int64_t(row) * d.d_model;
      rmsnorm_long_row(x + offset, weight, out + offset, d.d_model, d.rms_norm_eps, lane);
    }
  }
}

}  // namespace mk::gpu
