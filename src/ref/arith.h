// The reference's shared arithmetic: dot products in a fixed lane order, SiLU, RoPE's rotation and the blocked
// attention softmax. Forward and decode ops both compute through these, which is what makes decode bit-identical
// to the full-sequence forward pass.
#pragma once

#include <cmath>
#include <cstdint>

#include "mk/bf16.h"

namespace mk::ref::arith {

// NOTE: 16 independent partial sums in a fixed order: vectorizes without -ffast-math and gives the same bits
// wherever it is called, which is what makes reference and cpu-vm agree exactly.
constexpr int kLanes = 16;

inline float reduce_lanes(const float (&lanes)[kLanes]) {
  float pairs[kLanes / 2];
  for (int l = 0; l < kLanes / 2; ++l) pairs[l] = lanes[l] + lanes[l + kLanes / 2];
  float quads[kLanes / 4];
  for (int l = 0; l < kLanes / 4; ++l) quads[l] = pairs[l] + pairs[l + kLanes / 4];
  return (quads[0] + quads[2]) + (quads[1] + quads[3]);
}

inline float dot(const float* a, const bf16* w, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * to_float(w[i + l]);
  float sum = reduce_lanes(lanes);
  for (; i < n; ++i) sum += a[i] * to_float(w[i]);
  return sum;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  float sum = reduce_lanes(lanes);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// RoPE on one pair (x1 = column i, x2 = column i + head_dim / 2), as transformers computes
// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1].
inline void rotate_pair(float& x1, float& x2, float cos, float sin) {
  const float a = x1, b = x2;
  x1 = a * cos + (-b) * sin;
  x2 = b * cos + a * sin;
}

inline float attention_scale(int64_t head_dim) { return 1.0f / std::sqrt(float(head_dim)); }

// The softmax statistics of one block of keys for one query.
struct BlockStats {
  float max;  // of the block's scores
  float sum;  // of exp(score - max)
};

// One query against keys [0, n) of a block (each a head_dim row at k + j * k_stride, values likewise): writes
// o[d] = sum_j exp(s_j - max) v_j[d] with s_j = (q . k_j) * scale, every sum in key order. scores: n floats.
inline BlockStats attend_block(const float* q, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                               int64_t n, int64_t head_dim, float* scores, float* o) {
  const float scale = attention_scale(head_dim);
  BlockStats stats{-INFINITY, 0.0f};
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = dot(q, k + j * k_stride, head_dim) * scale;
    stats.max = std::max(stats.max, scores[j]);
  }
  for (int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float p = std::exp(scores[j] - stats.max);
    stats.sum += p;
    const float* value = v + j * v_stride;
    for (int64_t d = 0; d < head_dim; ++d) o[d] += p * value[d];
  }
  return stats;
}

// Combines blocks 0 .. num_blocks - 1 in block order: out[d] = sum_b w_b o_b[d] / sum_b w_b sum_b, with
// w_b = exp(max_b - max over blocks). block(b, &stats) returns block b's o and fills its stats. acc: head_dim floats.
template <typename Block>
void combine_blocks(int64_t num_blocks, int64_t head_dim, Block&& block, float* acc, float* out) {
  float max = -INFINITY;
  BlockStats stats;
  for (int64_t b = 0; b < num_blocks; ++b) {
    block(b, &stats);
    max = std::max(max, stats.max);
  }
  float sum = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
  for (int64_t b = 0; b < num_blocks; ++b) {
    const float* o = block(b, &stats);
    const float w = std::exp(stats.max - max);
    sum += w * stats.sum;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * o[d];
  }
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] / sum;
}

}  // namespace mk::ref::arith
