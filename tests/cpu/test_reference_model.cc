// Tests of the CPU reference forward pass, checked against an independent naive double-precision model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/model_config.h"
#include "mk/random.h"
#include "mk/reference.h"
#include "mk/weights.h"
#include "test_util.h"

namespace {

using mk::testing_util::error_of;

using ::testing::HasSubstr;
using mk::ref::Matrix;

// ---- an independent model: plain loops in double, nothing shared with src/ref except the RoPE frequencies ----

using Rows = std::vector<std::vector<double>>;  // (tokens, features)

std::vector<double> widen(const std::vector<mk::bf16>& values) {
  std::vector<double> result;
  for (mk::bf16 value : values) result.push_back(double(mk::to_float(value)));
  return result;
}

Rows rmsnorm(const Rows& x, const std::vector<mk::bf16>& weight, double eps) {
  const std::vector<double> w = widen(weight);
  Rows out = x;
  for (std::vector<double>& row : out) {
    double mean_square = 0;
    for (double v : row) mean_square += v * v;
    mean_square /= double(row.size());
    const double inv_rms = 1.0 / std::sqrt(mean_square + eps);
    for (size_t i = 0; i < row.size(); ++i) row[i] = row[i] * inv_rms * w[i];
  }
  return out;
}

// x (T, in) @ w (out, in)^T
Rows matmul(const Rows& x, const std::vector<mk::bf16>& weight, int64_t out_features) {
  const std::vector<double> w = widen(weight);
  const size_t in = x[0].size();
  Rows out(x.size(), std::vector<double>(size_t(out_features)));
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t o = 0; o < size_t(out_features); ++o) {
      double sum = 0;
      for (size_t i = 0; i < in; ++i) sum += x[t][i] * w[o * in + i];
      out[t][o] = sum;
    }
  return out;
}

void add(Rows& x, const Rows& y) {
  for (size_t t = 0; t < x.size(); ++t)
    for (size_t i = 0; i < x[t].size(); ++i) x[t][i] += y[t][i];
}

// Rotates each head_dim slice of every row by the angles of the row's position (rotate_half convention).
void rope(Rows& x, const mk::ModelConfig& c, int64_t seq_len) {
  if (c.rope.type == mk::RopeType::kNone) return;
  const std::vector<float> inv_freq = mk::ref::rope_inverse_frequencies(c.rope, c.head_dim);
  const size_t half = size_t(c.head_dim / 2);
  for (size_t t = 0; t < x.size(); ++t) {
    const double position = double(int64_t(t) % seq_len);
    for (size_t head = 0; head < x[t].size(); head += size_t(c.head_dim)) {
      double* v = x[t].data() + head;
      for (size_t i = 0; i < half; ++i) {
        const double angle = position * double(inv_freq[i]);
        const double a = v[i], b = v[i + half];
        v[i] = a * std::cos(angle) - b * std::sin(angle);
        v[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
}

Rows attention(const Rows& q, const Rows& k, const Rows& v, const mk::ModelConfig& c, int64_t seq_len) {
  const size_t hd = size_t(c.head_dim);
  Rows out(q.size(), std::vector<double>(size_t(c.q_dim())));
  for (size_t first = 0; first < q.size(); first += size_t(seq_len)) {
    for (int64_t head = 0; head < c.n_heads; ++head) {
      const size_t kv = size_t(head / (c.n_heads / c.n_kv_heads));
      for (size_t i = 0; i < size_t(seq_len); ++i) {
        std::vector<double> scores(i + 1);
        double max_score = -INFINITY;
        for (size_t j = 0; j <= i; ++j) {
          double s = 0;
          for (size_t d = 0; d < hd; ++d) s += q[first + i][size_t(head) * hd + d] * k[first + j][kv * hd + d];
          scores[j] = s / std::sqrt(double(hd));
          max_score = std::max(max_score, scores[j]);
        }
        double total = 0;
        for (double& s : scores) total += (s = std::exp(s - max_score));
        for (size_t d = 0; d < hd; ++d) {
          double value = 0;
          for (size_t j = 0; j <= i; ++j) value += scores[j] / total * v[first + j][kv * hd + d];
          out[first + i][size_t(head) * hd + d] = value;
        }
      }
    }
  }
  return out;
}

Rows naive_forward(const mk::ModelWeights& w, const mk::ref::ModelInput& input) {
  const mk::ModelConfig& c = w.config;
  const int64_t S = input.shape.seq_len;
  const double eps = c.rms_norm_eps;
  Rows h(size_t(input.shape.tokens()), std::vector<double>(size_t(c.d_model)));
  for (size_t t = 0; t < h.size(); ++t)
    for (size_t i = 0; i < size_t(c.d_model); ++i)
      h[t][i] = c.has_embedding ? double(mk::to_float(w.embedding[size_t(input.tokens[t]) * size_t(c.d_model) + i]))
                                : double(input.hidden.row(int64_t(t))[i]);
  for (const mk::LayerWeights& layer : w.layers) {
    const Rows x = rmsnorm(h, layer.attn_norm, eps);
    Rows q = matmul(x, layer.wq, c.q_dim());
    Rows k = matmul(x, layer.wk, c.kv_dim());
    const Rows v = matmul(x, layer.wv, c.kv_dim());
    rope(q, c, S);
    rope(k, c, S);
    add(h, matmul(attention(q, k, v, c, S), layer.wo, c.d_model));
    const Rows x2 = rmsnorm(h, layer.mlp_norm, eps);
    Rows gate = matmul(x2, layer.w_gate, c.d_ff);
    const Rows up = matmul(x2, layer.w_up, c.d_ff);
    for (size_t t = 0; t < gate.size(); ++t)
      for (size_t i = 0; i < gate[t].size(); ++i) gate[t][i] = gate[t][i] / (1 + std::exp(-gate[t][i])) * up[t][i];
    add(h, matmul(gate, layer.w_down, c.d_model));
  }
  if (!c.has_lm_head) return h;
  return matmul(rmsnorm(h, w.final_norm, eps), w.lm_head_matrix(), c.vocab_size);
}

// Random weights with per-tensor scales chosen so that attention is sharp and every path moves the output: with
// the default std 0.02 the scores are near zero and a RoPE or attention bug would hardly show.
mk::ModelWeights strong_weights(const mk::ModelConfig& config, uint64_t seed) {
  mk::ModelWeights weights = mk::random_weights(config, seed);  // norm weights in [0.5, 1.5] kept
  mk::Random random(seed + 99);
  auto fill = [&](std::vector<mk::bf16>& data, float stddev) {
    for (mk::bf16& value : data) value = mk::to_bf16(random.symmetric(stddev));
  };
  fill(weights.embedding, 1.0f);
  for (mk::LayerWeights& layer : weights.layers) {
    fill(layer.wq, 0.15f);
    fill(layer.wk, 0.15f);
    fill(layer.wv, 0.12f);
    fill(layer.wo, 0.12f);
    fill(layer.w_gate, 0.15f);
    fill(layer.w_up, 0.12f);
    fill(layer.w_down, 0.1f);
  }
  fill(weights.lm_head, 0.12f);
  return weights;
}

double relative_error(const Matrix& got, const Rows& want) {
  double max_err = 0, max_ref = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      max_err = std::max(max_err, std::fabs(double(got.row(int64_t(t))[i]) - want[t][i]));
      max_ref = std::max(max_ref, std::fabs(want[t][i]));
    }
  return max_err / max_ref;
}

mk::ModelConfig small_llama(const std::string& name) {
  mk::ModelConfig c;
  c.name = name;
  c.d_model = 64;
  c.d_ff = 160;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 100;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5f;
  // wavelengths 2 pi 1e4^(i/8) = 6.3, 19.9, 62.8, ... against bounds 8 and 32: all three llama3 regions
  c.rope = mk::RopeConfig{mk::RopeType::kLlama3, 10000.0, 8.0, 1.0, 4.0, 32};
  return c;
}

bool all_finite(const Matrix& m) {
  for (float value : m.data)
    if (!std::isfinite(value)) return false;
  return true;
}

}  // namespace

TEST(ReferenceModel, TinyForwardIsDeterministicWithTheRightShape) {
  const mk::Preset& tiny = mk::find_preset("tiny");
  const mk::ModelWeights weights = mk::random_weights(tiny.config, 1);
  const mk::ref::ModelInput input = mk::ref::random_input(tiny.config, tiny.shape, 2);
  const Matrix a = mk::ref::forward(weights, input);
  const Matrix b = mk::ref::forward(weights, input);
  EXPECT_EQ(a.rows, tiny.shape.tokens());
  EXPECT_EQ(a.cols, tiny.config.vocab_size);
  ASSERT_EQ(a.data.size(), size_t(a.rows * a.cols));
  EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)), 0);
  EXPECT_TRUE(all_finite(a));
  // Not degenerate: logits differ between tokens.
  EXPECT_NE(a.row(0)[0], a.row(1)[0]);
}

TEST(ReferenceModel, SequencesOfABatchAreIndependent) {
  const mk::Preset& tiny = mk::find_preset("tiny");
  const mk::ModelWeights weights = mk::random_weights(tiny.config, 3);
  const mk::ref::ModelInput batch = mk::ref::random_input(tiny.config, {3, 17}, 4);
  const Matrix together = mk::ref::forward(weights, batch);
  for (int64_t s = 0; s < 3; ++s) {
    mk::ref::ModelInput alone;
    alone.shape = {1, 17};
    alone.tokens.assign(batch.tokens.begin() + s * 17, batch.tokens.begin() + (s + 1) * 17);
    const Matrix single = mk::ref::forward(weights, alone);
    EXPECT_EQ(std::memcmp(single.data.data(), together.row(s * 17), single.data.size() * sizeof(float)), 0) << s;
  }
}

TEST(ReferenceModel, RandomInputIsSeededAndInRange) {
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const mk::ref::ModelInput a = mk::ref::random_input(tiny, {2, 30}, 5);
  EXPECT_EQ(a.tokens, mk::ref::random_input(tiny, {2, 30}, 5).tokens);
  EXPECT_NE(a.tokens, mk::ref::random_input(tiny, {2, 30}, 6).tokens);
  ASSERT_EQ(a.tokens.size(), 60u);
  for (int32_t token : a.tokens) {
    EXPECT_GE(token, 0);
    EXPECT_LT(token, tiny.vocab_size);
  }
  const mk::ModelConfig& seed = mk::find_preset("seed").config;
  const mk::ref::ModelInput hidden = mk::ref::random_input(seed, {1, 3}, 5);
  EXPECT_EQ(hidden.hidden.rows, 3);
  EXPECT_EQ(hidden.hidden.cols, seed.d_model);
  for (float value : hidden.hidden.data) EXPECT_EQ(value, mk::round_to_bf16(value));  // bf16-representable
  EXPECT_THAT(error_of([&] { mk::ref::random_input(tiny, {0, 4}, 1); }), HasSubstr("must be positive"));
}

TEST(ReferenceModel, RejectsBadInputs) {
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const mk::ModelWeights weights = mk::random_weights(tiny, 1);
  mk::ref::ModelInput input = mk::ref::random_input(tiny, {1, 8}, 1);

  input.tokens[3] = int32_t(tiny.vocab_size);
  EXPECT_THAT(error_of([&] { mk::ref::forward(weights, input); }),
              HasSubstr("token id 384 at position 3 is outside the vocabulary [0, 384)"));
  input.tokens[3] = -1;
  EXPECT_THAT(error_of([&] { mk::ref::forward(weights, input); }), HasSubstr("token id -1"));

  input = mk::ref::random_input(tiny, {1, tiny.max_position_embeddings + 1}, 1);
  EXPECT_THAT(error_of([&] { mk::ref::forward(weights, input); }),
              HasSubstr("sequence length 1025 exceeds the model's max_position_embeddings 1024"));
  input = mk::ref::random_input(tiny, {1, tiny.max_position_embeddings}, 1);
  EXPECT_NO_THROW(mk::ref::validate_input(tiny, input));  // exactly the maximum is fine

  input = mk::ref::random_input(tiny, {2, 8}, 1);
  input.tokens.pop_back();
  EXPECT_THAT(error_of([&] { mk::ref::forward(weights, input); }), HasSubstr("expected 16 token ids, got 15"));
  input.shape = {0, 8};
  EXPECT_THAT(error_of([&] { mk::ref::forward(weights, input); }), HasSubstr("must be positive"));
}

TEST(ReferenceModel, OneLayerMatchesNaiveDoubleModel) {
  const mk::ModelConfig config = small_llama("naive-gqa");
  config.validate();
  const mk::ModelWeights weights = strong_weights(config, 10);
  const mk::ref::ModelInput input = mk::ref::random_input(config, {2, 24}, 11);
  const Matrix got = mk::ref::forward(weights, input);
  const Rows want = naive_forward(weights, input);
  ASSERT_EQ(got.rows, 48);
  ASSERT_EQ(got.cols, config.vocab_size);
  EXPECT_LT(relative_error(got, want), 1e-4);

  // The check has teeth: the same model without RoPE is measurably different.
  mk::ModelWeights no_rope = weights;
  no_rope.config.rope.type = mk::RopeType::kNone;
  EXPECT_GT(relative_error(got, naive_forward(no_rope, input)), 1e-2);
}

TEST(ReferenceModel, TiedMultiHeadTwoLayersMatchNaiveDoubleModel) {
  mk::ModelConfig config = small_llama("naive-tied");
  config.n_layers = 2;
  config.n_kv_heads = 4;
  config.tie_word_embeddings = true;
  config.rope = mk::RopeConfig{mk::RopeType::kDefault, 500000.0};
  config.validate();
  mk::ModelWeights weights = strong_weights(config, 20);
  ASSERT_TRUE(weights.lm_head.empty());
  // The embedding doubles as the LM head here: scale it down so the logits stay in a sensible range.
  for (mk::bf16& value : weights.embedding) value = mk::to_bf16(mk::to_float(value) * 0.125f);
  const mk::ref::ModelInput input = mk::ref::random_input(config, {1, 40}, 21);
  EXPECT_LT(relative_error(mk::ref::forward(weights, input), naive_forward(weights, input)), 1e-4);
}

TEST(ReferenceModel, SeedStyleModelMatchesNaiveDoubleModel) {
  // No embedding, no LM head, no RoPE: hidden states in and out, as the seed model works.
  mk::ModelConfig config = small_llama("naive-seed");
  config.has_embedding = false;
  config.has_lm_head = false;
  config.rope.type = mk::RopeType::kNone;
  config.n_kv_heads = 4;
  config.validate();
  const mk::ModelWeights weights = strong_weights(config, 30);
  EXPECT_TRUE(weights.embedding.empty());
  const mk::ref::ModelInput input = mk::ref::random_input(config, {2, 10}, 31);
  const Matrix got = mk::ref::forward(weights, input);
  EXPECT_EQ(got.cols, config.d_model);
  EXPECT_EQ(got.rows, 20);
  EXPECT_LT(relative_error(got, naive_forward(weights, input)), 1e-4);
}
