// Small random model shapes, run shapes and prompts shared by the schedule, cpu-vm, op, decode and GPU tests.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/model_config.h"
#include "mk/random.h"

namespace mk {

// Covers GQA ratios 1, 2, 4, 8, head_dim 64 and 128, with and without RoPE, embedding and LM head.
inline ModelConfig random_small_config(Random& random) {
  ModelConfig c;
  c.name = "random-small";
  c.head_dim = random.next_u64() % 2 ? 64 : 128;
  const int64_t ratio = int64_t(1) << (random.next_u64() % 4);
  c.n_kv_heads = ratio == 8 ? 1 : int64_t(1 + random.next_u64() % 2);
  c.n_heads = c.n_kv_heads * ratio;
  c.d_model = 64 * int64_t(1 + random.next_u64() % 4);
  c.d_ff = 64 * int64_t(1 + random.next_u64() % 6);
  c.n_layers = int64_t(1 + random.next_u64() % 2);
  c.vocab_size = int64_t(50 + random.next_u64() % 200);
  c.max_position_embeddings = 4096;
  c.has_embedding = random.next_u64() % 2;
  c.has_lm_head = random.next_u64() % 2;
  c.tie_word_embeddings = c.has_embedding && c.has_lm_head && random.next_u64() % 2;
  switch (random.next_u64() % 3) {
    case 0: c.rope = RopeConfig{}; break;
    case 1: c.rope = RopeConfig{RopeType::kDefault, 10000.0}; break;
    default: c.rope = RopeConfig{RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 64}; break;
  }
  c.validate();
  return c;
}

// batch in [1, max_batch], seq_len in [1, max_seq_len].
inline RunShape random_shape(Random& random, uint64_t max_batch, uint64_t max_seq_len) {
  const int64_t batch = int64_t(1 + random.next_u64() % max_batch);
  return {batch, int64_t(1 + random.next_u64() % max_seq_len)};
}

// `length` token ids drawn uniformly from the model's vocabulary.
inline std::vector<int32_t> random_prompt(const ModelConfig& config, int64_t length, uint64_t seed) {
  Random random(seed);
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& token : prompt) token = int32_t(random.next_u64() % uint64_t(config.vocab_size));
  return prompt;
}

}  // namespace mk
