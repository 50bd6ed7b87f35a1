// The CPU reference forward pass: the model written out op by op over whole tensors, parallel over rows.
#include <fmt/format.h>

#include "mk/check.h"
#include "mk/parallel.h"
#include "mk/random.h"
#include "mk/reference.h"

namespace mk::ref {

ModelInput random_input(const ModelConfig& config, const RunShape& shape, uint64_t seed) {
  MK_CHECK(shape.batch > 0 && shape.seq_len > 0, "batch ({}) and sequence length ({}) must be positive", shape.batch,
           shape.seq_len);
  ModelInput input;
  input.shape = shape;
  Random random(seed);
  if (config.has_embedding) {
    input.tokens.resize(size_t(shape.tokens()));
    for (int32_t& token : input.tokens) token = int32_t(random.next_u64() % uint64_t(config.vocab_size));
  } else {
    input.hidden = Matrix(shape.tokens(), config.d_model);
    for (float& value : input.hidden.data) value = mk::round_to_bf16(random.symmetric(1.0f));
  }
  return input;
}

void validate_input(const ModelConfig& config, const ModelInput& input) {
  const int64_t tokens = input.shape.tokens();
  MK_CHECK(input.shape.batch > 0 && input.shape.seq_len > 0, "batch ({}) and sequence length ({}) must be positive",
           input.shape.batch, input.shape.seq_len);
  if (config.rope.type != RopeType::kNone) {
    MK_CHECK(input.shape.seq_len <= config.max_position_embeddings,
             "sequence length {} exceeds the model's max_position_embeddings {}", input.shape.seq_len,
             config.max_position_embeddings);
  }
  if (config.has_embedding) {
    MK_CHECK(int64_t(input.tokens.size()) == tokens, "expected {} token ids, got {}", tokens, input.tokens.size());
    for (size_t i = 0; i < input.tokens.size(); ++i) {
      MK_CHECK(input.tokens[i] >= 0 && input.tokens[i] < config.vocab_size,
               "token id {} at position {} is outside the vocabulary [0, {})", input.tokens[i], i, config.vocab_size);
    }
  } else {
    MK_CHECK(input.hidden.rows == tokens && input.hidden.cols == config.d_model,
             "expected hidden states of shape ({}, {}), got ({}, {})", tokens, config.d_model, input.hidden.rows,
             input.hidden.cols);
  }
}

namespace {

template <typename Op>
void over_rows(int64_t rows, Op&& op) {
  parallel_for(rows, [&](int64_t begin, int64_t end) { op(Range{begin, end}); });
}

}  // namespace

void round_to_bf16(Matrix& matrix, Range rows) {
  for (int64_t r = rows.begin; r < rows.end; ++r)
    for (int64_t c = 0; c < matrix.cols; ++c) matrix.row(r)[c] = mk::round_to_bf16(matrix.row(r)[c]);
}

Matrix forward(const ModelWeights& weights, const ModelInput& input, const ForwardOptions& options) {
  const ModelConfig& c = weights.config;
  validate_input(c, input);
  const int64_t T = input.shape.tokens();
  const int64_t S = input.shape.seq_len;
  const Range all_model_cols{0, c.d_model};

  // Rounds an op's output rows when emulating bf16 activations.
  auto stored = [&](Matrix& m, Range rows) {
    if (options.round_activations_to_bf16) round_to_bf16(m, rows);
  };
  Matrix h(T, c.d_model);  // the residual stream
  if (c.has_embedding) {
    over_rows(T, [&](Range rows) { embedding_rows(input.tokens, weights.embedding, h, rows); });  // bf16 already
  } else {
    h = input.hidden;
  }
  const RopeTable rope = make_rope_table(c, S);

  Matrix xn(T, c.d_model);
  Matrix qkv(T, c.qkv_dim());
  Matrix attn(T, c.q_dim());
  Matrix h_mid(T, c.d_model);
  Matrix act(T, c.d_ff);
  for (const LayerWeights& w : weights.layers) {
    const StackedWeights w_qkv = qkv_weights(c, w);

    over_rows(T, [&](Range rows) {
      rmsnorm_rows(h, w.attn_norm, c.rms_norm_eps, xn, rows);
      stored(xn, rows);
      linear_tile(xn, w_qkv, qkv, rows, {0, c.qkv_dim()});
      if (c.rope.type != RopeType::kNone) rope_tile(c, rope, S, qkv, rows, {0, c.qkv_dim()});
      stored(qkv, rows);
    });
    parallel_for(input.shape.batch * c.n_heads, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) attention_tile(c, S, qkv, attn, i / c.n_heads, {0, S}, i % c.n_heads);
    });
    over_rows(T, [&](Range rows) {
      stored(attn, rows);
      linear_residual_tile(attn, StackedWeights(w.wo, c.d_model, c.q_dim()), h, h_mid, rows, all_model_cols);
      stored(h_mid, rows);
      rmsnorm_rows(h_mid, w.mlp_norm, c.rms_norm_eps, xn, rows);
      stored(xn, rows);
      swiglu_tile(xn, StackedWeights(w.w_gate, c.d_ff, c.d_model), StackedWeights(w.w_up, c.d_ff, c.d_model), act,
                  rows, {0, c.d_ff});
      stored(act, rows);
      linear_residual_tile(act, StackedWeights(w.w_down, c.d_model, c.d_ff), h_mid, h, rows, all_model_cols);
      stored(h, rows);
    });
  }
  if (!c.has_lm_head) return h;

  Matrix logits(T, c.vocab_size);
  const StackedWeights head(weights.lm_head_matrix(), c.vocab_size, c.d_model);
  over_rows(T, [&](Range rows) {
    rmsnorm_rows(h, weights.final_norm, c.rms_norm_eps, xn, rows);
    stored(xn, rows);
    linear_tile(xn, head, logits, rows, {0, c.vocab_size});
    stored(logits, rows);
  });
  return logits;
}

}  // namespace mk::ref
