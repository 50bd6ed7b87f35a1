// Split-KV decode attention (one partial per KV block: unnormalized output, max and sum per query head; the block's
// K and V staged in shared memory), the combine that merges a sequence's partials in block order, and greedy
// sampling: run by the consumer warps with plain loads.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"
#include "mk/tiles.h"
#include "rowwise.cuh"

namespace mk::gpu {

constexpr int kDecodeKvBlock = tiles::kDecodeKvBlock;
constexpr int kPartialStats = tiles::kDecodePartialStats;
constexpr int kMaxGroup = 8;      // query heads per kv head the attention handler serves (checked by the engine)
constexpr int kMaxHeadDim = 256;  // likewise
static_assert((kMaxGroup * kMaxHeadDim + kMaxGroup * kDecodeKvBlock + 2 * kMaxGroup) * 4 +
                      kDecodeKvBlock * (2 * kMaxHeadDim + 8) * 2 <=
                  KernelConfig::kNumStages * KernelConfig::kStageBytes,
              "q, scores, and a K and V block of decode attention fit the stage ring");

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  return value;
}

// Row stride of the K block in shared memory: 16 bytes of padding spread the rows of consecutive keys over the banks.
__device__ __forceinline__ int32_t k_stride(int32_t head_dim) { return head_dim + 8; }

// The block's K (rows padded) and V rows of one kv head into shared memory: every 16-byte load in flight at once.
__device__ __forceinline__ void stage_kv_block(const ModelDims& d, const __nv_bfloat16* k, int32_t keys,
                                               __nv_bfloat16* k_block, __nv_bfloat16* v_block, int consumer_thread) {
  const int32_t chunks = d.head_dim / 8;
  for (int32_t i = consumer_thread; i < 2 * keys * chunks; i += KernelConfig::kConsumerThreads) {
    const bool value = i >= keys * chunks;
    const int32_t j = value ? i - keys * chunks : i, key = j / chunks, chunk = j % chunks;
    const uint4 packed =
        __ldcg(reinterpret_cast<const uint4*>(k + int64_t(key) * 2 * d.kv_dim + (value ? d.kv_dim : 0)) + chunk);
    __nv_bfloat16* target = value ? v_block + key * d.head_dim : k_block + key * k_stride(d.head_dim);
    reinterpret_cast<uint4*>(target)[chunk] = packed;
  }
}

// scores[h][key] <- (q_h . k_key) / sqrt(head_dim): one thread per (query head, key).
__device__ __forceinline__ void decode_scores(const ModelDims& d, const float* q, const __nv_bfloat16* k_block,
                                              int32_t keys, float* scores, int consumer_thread) {
  const float scale = rsqrtf(float(d.head_dim));
  for (int32_t i = consumer_thread; i < d.group_size * keys; i += KernelConfig::kConsumerThreads) {
    const int32_t h = i / keys, key = i % keys;
    const float* q_head = q + h * d.head_dim;
    const __nv_bfloat162* k_row = reinterpret_cast<const __nv_bfloat162*>(k_block + key * k_stride(d.head_dim));
    float acc = 0.0f;
    for (int32_t e = 0; e < d.head_dim / 2; ++e) {
      const float2 k_pair = __bfloat1622float2(k_row[e]);
      acc = fmaf(q_head[2 * e], k_pair.x, acc);
      acc = fmaf(q_head[2 * e + 1], k_pair.y, acc);
    }
    scores[h * kDecodeKvBlock + key] = acc * scale;
  }
}

// Per query head: the block's max and sum, scores turned into exp(score - max) in place. One warp per head.
__device__ __forceinline__ void decode_softmax(const ModelDims& d, int32_t keys, float* scores, float* stats, int warp,
                                               int lane) {
  for (int32_t h = warp; h < d.group_size; h += KernelConfig::kConsumerWarps) {
    float* row = scores + h * kDecodeKvBlock;
    float max = -INFINITY;
    for (int32_t key = lane; key < keys; key += 32) max = fmaxf(max, row[key]);
    max = warp_max(max);
    float sum = 0.0f;
    for (int32_t key = lane; key < keys; key += 32) {
      const float weight = __expf(row[key] - max);
      row[key] = weight;
      sum += weight;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      stats[2 * h] = max;
      stats[2 * h + 1] = sum;
    }
  }
}

// attn_partial[l][rows] for sequence in.sequence, kv head in.head: one partial record per query head of the kv head
// and per KV block of the split (blocks past the sequence's position are empty: max -inf, left out by the combine).
__device__ __forceinline__ void run_decode_attention(const MegakernelParams& p, const SharedState& s,
                                                     const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int warp = consumer_thread / 32, lane = consumer_thread % 32;
  const int64_t B = d.batch, C = d.max_context, layer = in.layer;
  const int32_t G = d.group_size, hd = d.head_dim, stride = hd + kPartialStats;
  const int32_t rows_per_sequence = d.kv_splits * d.kv_blocks_per_split;
  const int32_t position = p.positions[in.sequence];
  float* q = reinterpret_cast<float*>(s.stages);      // (G, head_dim)
  float* scores = q + kMaxGroup * kMaxHeadDim;         // (G, kDecodeKvBlock)
  float* stats = scores + kMaxGroup * kDecodeKvBlock;  // (G, 2): max, sum
  __nv_bfloat16* k_block = reinterpret_cast<__nv_bfloat16*>(stats + 2 * kMaxGroup);  // (keys, k_stride)
  __nv_bfloat16* v_block = k_block + kDecodeKvBlock * k_stride(kMaxHeadDim);          // (keys, head_dim)
  const __nv_bfloat16* q_heads = p.decode_q + (layer * B + in.sequence) * d.q_dim + in.head * G * hd;
  for (int32_t i = consumer_thread; i < G * hd; i += KernelConfig::kConsumerThreads)
    q[i] = __bfloat162float(__ldcg(q_heads + i));
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  for (int32_t row = in.row_begin; row < in.row_end; ++row) {
    const int32_t local = row - in.sequence * rows_per_sequence;
    const int32_t block = (local % d.kv_blocks_per_split) * d.kv_splits + local / d.kv_blocks_per_split;
    const int32_t first_key = block * kDecodeKvBlock;
    const int32_t keys = block < d.kv_blocks ? min(kDecodeKvBlock, position + 1 - first_key) : 0;
    float* record = p.attn_partial + (layer * B * rows_per_sequence + row) * int64_t(d.q_dim / hd) * stride +
                    int64_t(in.head) * G * stride;
    if (keys <= 0) {
      for (int32_t i = consumer_thread; i < G * stride; i += KernelConfig::kConsumerThreads)
        record[i] = i % stride == hd ? -INFINITY : 0.0f;
      continue;
    }
    const __nv_bfloat16* k = p.kv_cache + ((layer * B + in.sequence) * C + first_key) * 2 * d.kv_dim + in.head * hd;
    stage_kv_block(d, k, keys, k_block, v_block, consumer_thread);
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    decode_scores(d, q, k_block, keys, scores, consumer_thread);
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    decode_softmax(d, keys, scores, stats, warp, lane);
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    for (int32_t i = consumer_thread; i < G * hd; i += KernelConfig::kConsumerThreads) {
      const int32_t h = i / hd, e = i % hd;
      const float* weights = scores + h * kDecodeKvBlock;
      float acc = 0.0f;
      for (int32_t key = 0; key < keys; ++key) acc = fmaf(weights[key], __bfloat162float(v_block[key * hd + e]), acc);
      record[h * stride + e] = acc;
    }
    if (consumer_thread < G) {
      float* tail = record + consumer_thread * stride + hd;
      tail[0] = stats[2 * consumer_thread];
      tail[1] = stats[2 * consumer_thread + 1];
      tail[2] = tail[3] = 0.0f;
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // scores are reused by the next block
  }
}

// Column col of sequence b's attention output in layer `layer`: the partials of its head combined in block order,
// sum_b w_b o_b / sum_b w_b sum_b with w_b = exp(max_b - max).
__device__ __forceinline__ float combine_partials(const MegakernelParams& p, int64_t layer, int32_t b, int32_t col) {
  const ModelDims& d = p.dims;
  const int32_t hd = d.head_dim, stride = hd + kPartialStats, e = col % hd;
  const int32_t rows_per_sequence = d.kv_splits * d.kv_blocks_per_split;
  const int64_t record_row = int64_t(d.q_dim / hd) * stride;
  const int32_t blocks = p.positions[b] / kDecodeKvBlock + 1;
  const float* first =
      p.attn_partial + (layer * d.batch + b) * rows_per_sequence * record_row + int64_t(col / hd) * stride;
  auto record = [&](int32_t block) {
    const int32_t row = (block % d.kv_splits) * d.kv_blocks_per_split + block / d.kv_splits;
    return first + int64_t(row) * record_row;
  };
  float max = -INFINITY;
  for (int32_t block = 0; block < blocks; ++block) max = fmaxf(max, __ldcg(record(block) + hd));
  float acc = 0.0f, sum = 0.0f;
  for (int32_t block = 0; block < blocks; ++block) {
    const float* r = record(block);
    const float weight = __expf(__ldcg(r + hd) - max);
    sum = fmaf(weight, __ldcg(r + hd + 1), sum);
    acc = fmaf(weight, __ldcg(r + e), acc);
  }
  return acc / sum;
}

// Row b's attention output (q_dim values) into `out` as bf16, from its partial records of every block, first copied
// into `scratch` (scratch_bytes) with every 16-byte load in flight at once: decode_o_proj_combine's staging. Each
// tile needs the whole row, so loading record by record, value by value, would be a chain of L2 trips per value.
// Rows whose records do not fit the scratch are combined from global memory. Ends with the consumers synchronized.
__device__ __forceinline__ void stage_combined_row(const MegakernelParams& p, int64_t layer, int32_t b,
                                                   __nv_bfloat16* out, float* scratch, int32_t scratch_bytes,
                                                   int consumer_thread) {
  const ModelDims& d = p.dims;
  const int32_t hd = d.head_dim, stride = hd + kPartialStats, record_floats = d.q_dim / hd * stride;
  const int32_t rows_per_sequence = d.kv_splits * d.kv_blocks_per_split;
  const int32_t blocks = p.positions[b] / kDecodeKvBlock + 1;
  if (blocks * record_floats * 4 > scratch_bytes) {
    for (int32_t i = consumer_thread; i < d.q_dim; i += KernelConfig::kConsumerThreads)
      out[i] = __float2bfloat16_rn(combine_partials(p, layer, b, i));
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    return;
  }
  const float* first = p.attn_partial + (layer * d.batch + b) * rows_per_sequence * int64_t(record_floats);
  const int32_t chunks = record_floats / 4;
  for (int32_t i = consumer_thread; i < blocks * chunks; i += KernelConfig::kConsumerThreads) {
    const int32_t block = i / chunks;
    const int32_t row = (block % d.kv_splits) * d.kv_blocks_per_split + block / d.kv_splits;
    reinterpret_cast<uint4*>(scratch)[i] =
        __ldcg(reinterpret_cast<const uint4*>(first + int64_t(row) * record_floats) + i % chunks);
  }
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  for (int32_t i = consumer_thread; i < d.q_dim; i += KernelConfig::kConsumerThreads) {
    const float* record = scratch + i / hd * stride;
    float max = -INFINITY;
    for (int32_t block = 0; block < blocks; ++block) max = fmaxf(max, record[block * record_floats + hd]);
    float acc = 0.0f, sum = 0.0f;
    for (int32_t block = 0; block < blocks; ++block) {
      const float* r = record + block * record_floats;
      const float weight = __expf(r[hd] - max);
      sum = fmaf(weight, r[hd + 1], sum);
      acc = fmaf(weight, r[i % hd], acc);
    }
    out[i] = __float2bfloat16_rn(acc / sum);
  }
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
}

// attn[l][rows, cols] <- for sequences rows and the query heads of cols, their partials combined. One thread per
// output element.
__device__ __forceinline__ void run_decode_combine(const MegakernelParams& p, const Instruction& in,
                                                   int consumer_thread) {
  const ModelDims& d = p.dims;
  const int32_t width = in.col_end - in.col_begin;
  for (int32_t i = consumer_thread; i < (in.row_end - in.row_begin) * width; i += KernelConfig::kConsumerThreads) {
    const int32_t b = in.row_begin + i / width, col = in.col_begin + i % width;
    const float value = combine_partials(p, in.layer, b, col);
    p.attn[(int64_t(in.layer) * d.batch + b) * d.q_dim + col] = __float2bfloat16_rn(value);
  }
}

// The better of two (logit, id) candidates: the larger logit, ties to the lower id.
__device__ __forceinline__ void keep_best(float& value, int32_t& id, float other_value, int32_t other_id) {
  if (other_value > value || (other_value == value && other_id < id)) {
    value = other_value;
    id = other_id;
  }
}

// This thread's best (logit, id) of one row of logits: 16-byte loads, kSampleBatch of them in flight at once (one
// scalar load at a time made the LM head's 128k logits a 60 us chain of round trips on one SM).
constexpr int kSampleBatch = 8;
__device__ __forceinline__ void best_of_row(const __nv_bfloat16* logits, int32_t vocab, int consumer_thread,
                                            float& value, int32_t& id) {
  constexpr int kThreads = KernelConfig::kConsumerThreads;
  const int32_t chunks = vocab % 8 == 0 ? vocab / 8 : 0;  // rows are 16-byte aligned only then
  const uint4* row = reinterpret_cast<const uint4*>(logits);
  for (int32_t first = consumer_thread; first < chunks; first += kSampleBatch * kThreads) {
    uint4 batch[kSampleBatch];
#pragma unroll
    for (int u = 0; u < kSampleBatch; ++u) {
      const int32_t chunk = first + u * kThreads;
      batch[u] = chunk < chunks ? __ldcg(row + chunk) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kSampleBatch; ++u) {
      const int32_t chunk = first + u * kThreads;
      const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&batch[u]);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (chunk < chunks) keep_best(value, id, __bfloat162float(x[e]), 8 * chunk + e);
    }
  }
  for (int32_t i = 8 * chunks + consumer_thread; i < vocab; i += kThreads)
    keep_best(value, id, __bfloat162float(__ldcg(logits + i)), i);
}

// sampled[rows] <- argmax of logits[rows] (greedy), ties to the lower id.
__device__ __forceinline__ void run_sample(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                           int consumer_thread) {
  const int warp = consumer_thread / 32, lane = consumer_thread % 32;
  const int32_t vocab = p.dims.vocab_size;
  float* warp_values = reinterpret_cast<float*>(s.stages);
  int32_t* warp_ids = reinterpret_cast<int32_t*>(warp_values + KernelConfig::kConsumerWarps);
  for (int32_t b = in.row_begin; b < in.row_end; ++b) {
    const __nv_bfloat16* logits = p.logits + int64_t(b) * vocab;
    float value = -INFINITY;
    int32_t id = vocab;
    best_of_row(logits, vocab, consumer_thread, value, id);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      keep_best(value, id, __shfl_xor_sync(0xffffffff, value, offset), __shfl_xor_sync(0xffffffff, id, offset));
    if (lane == 0) {
      warp_values[warp] = value;
      warp_ids[warp] = id;
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    if (consumer_thread == 0) {
      for (int w = 1; w < KernelConfig::kConsumerWarps; ++w) keep_best(value, id, warp_values[w], warp_ids[w]);
      p.sampled[b] = id < vocab ? id : 0;
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  }
}

}  // namespace mk::gpu
