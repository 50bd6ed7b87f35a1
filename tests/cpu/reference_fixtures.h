// Fixtures shared by the CPU reference ops' tests (test_reference_ops.cc, test_reference_rope.cc): a one-layer
// attention config, random fp32 matrices, and where each head's q, k and v sit in a qkv row.
#pragma once

#include <cstdint>

#include "mk/model_config.h"
#include "mk/random.h"
#include "mk/reference.h"

namespace mk::reference_fixtures {

using mk::ref::Matrix;

// One layer of n_heads query heads over n_kv_heads, head_dim each, with the given RoPE.
inline mk::ModelConfig attention_config(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                        mk::RopeType rope = mk::RopeType::kNone) {
  mk::ModelConfig c;
  c.name = "ops";
  c.d_model = n_heads * head_dim;
  c.d_ff = 2 * c.d_model;
  c.n_layers = 1;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 16;
  c.max_position_embeddings = 256;
  c.rope.type = rope;
  c.validate();
  return c;
}

// (rows, cols) values uniform in [-stddev, stddev).
inline Matrix random_matrix(int64_t rows, int64_t cols, uint64_t seed, float stddev = 1.0f) {
  Matrix m(rows, cols);
  mk::Random random(seed);
  for (float& value : m.data) value = random.symmetric(stddev);
  return m;
}

// Column offsets of head h's q, k and v inside a qkv row.
inline int64_t q_col(const mk::ModelConfig& c, int64_t head) { return head * c.head_dim; }
inline int64_t k_col(const mk::ModelConfig& c, int64_t kv_head) { return c.q_dim() + kv_head * c.head_dim; }
inline int64_t v_col(const mk::ModelConfig& c, int64_t kv_head) {
  return c.q_dim() + c.kv_dim() + kv_head * c.head_dim;
}

}  // namespace mk::reference_fixtures
