// Row-wise ops run by the consumer warps with plain 16-byte loads and stores: token embedding and RMSNorm.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// hidden[0][rows] <- embedding[tokens[rows]]; one warp per row.
__device__ __forceinline__ void run_embed(const MegakernelParams& p, const Instruction& in, int consumer_thread) {
  const int32_t d_model = p.dims.d_model;
  const int warp = consumer_thread / 32;
  const int lane = consumer_thread % 32;
  for (int32_t row = in.row_begin + warp; row < in.row_end; row += KernelConfig::kConsumerWarps) {
    const int32_t token = p.tokens[row];
    const uint4* source = reinterpret_cast<const uint4*>(p.embedding + int64_t(token) * d_model);
    uint4* target = reinterpret_cast<uint4*>(p.hidden + int64_t(row) * d_model);
    for (int32_t chunk = lane; chunk < d_model / 8; chunk += 32) target[chunk] = source[chunk];
  }
}

// out[rows] <- x * rsqrt(mean(x^2) + eps) * weight; one warp per row, two passes over the row (the second from L1/L2).
__device__ __forceinline__ void run_rmsnorm(const MegakernelParams& p, const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int64_t T = d.tokens;
  const __nv_bfloat16* x;
  const __nv_bfloat16* weight;
  __nv_bfloat16* out;
  switch (in.opcode) {
    case Opcode::kAttnNorm:
      x = p.hidden + in.layer * T * d.d_model;
      weight = p.attn_norm_weight + in.layer * d.d_model;
      out = p.attn_norm + in.layer * T * d.d_model;
      break;
    case Opcode::kMlpNorm:
      x = p.hidden_mid + in.layer * T * d.d_model;
      weight = p.mlp_norm_weight + in.layer * d.d_model;
      out = p.mlp_norm + in.layer * T * d.d_model;
      break;
    default:  // kFinalNorm
      x = p.hidden + d.n_layers * T * d.d_model;
      weight = p.final_norm_weight;
      out = p.final_norm;
      break;
  }
  const int warp = consumer_thread / 32;
  const int lane = consumer_thread % 32;
  const int32_t chunks = d.d_model / 8;
  for (int32_t row = in.row_begin + warp; row < in.row_end; row += KernelConfig::kConsumerWarps) {
    const uint4* x_row = reinterpret_cast<const uint4*>(x + int64_t(row) * d.d_model);
    float sum_of_squares = 0.0f;
    for (int32_t chunk = lane; chunk < chunks; chunk += 32) {
      const uint4 packed = __ldcg(x_row + chunk);
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __bfloat1622float2(pairs[i]);
        sum_of_squares += v.x * v.x + v.y * v.y;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum_of_squares += __shfl_xor_sync(0xffffffff, sum_of_squares, offset);
    const float inv_rms = 1.0f / sqrtf(sum_of_squares / float(d.d_model) + d.rms_norm_eps);
    uint4* out_row = reinterpret_cast<uint4*>(out + int64_t(row) * d.d_model);
    const uint4* weight_row = reinterpret_cast<const uint4*>(weight);
    for (int32_t chunk = lane; chunk < chunks; chunk += 32) {
      const uint4 packed = __ldcg(x_row + chunk);
      const uint4 packed_weight = weight_row[chunk];
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
      out_row[chunk] = result;
    }
  }
}

}  // namespace mk::gpu
