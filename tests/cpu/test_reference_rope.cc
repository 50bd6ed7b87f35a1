// Tests of the CPU reference's RoPE against its formulas, closed-form rotations and their invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "mk/model_config.h"
#include "mk/reference.h"
#include "reference_fixtures.h"

namespace {

using mk::ref::Matrix;
using mk::reference_fixtures::attention_config;
using mk::reference_fixtures::k_col;
using mk::reference_fixtures::q_col;
using mk::reference_fixtures::random_matrix;
using mk::reference_fixtures::v_col;

float pair_norm(const float* head, int64_t i, int64_t half) { return std::hypot(head[i], head[i + half]); }

// A random (rows, qkv_dim) matrix and a copy of it rotated by RoPE (token t at position t % seq_len), with the table.
struct Rotated {
  mk::ref::RopeTable table;
  Matrix original;  // (rows, qkv_dim)
  Matrix rotated;   // (rows, qkv_dim)
};

Rotated rotate_random(const mk::ModelConfig& c, int64_t seq_len, int64_t rows, uint64_t seed) {
  Rotated r{mk::ref::make_rope_table(c, seq_len), random_matrix(rows, c.qkv_dim(), seed), {}};
  r.rotated = r.original;
  mk::ref::rope_tile(c, r.table, seq_len, r.rotated, {0, rows}, {0, c.qkv_dim()});
  return r;
}

}  // namespace

// ---- RoPE ----

TEST(Rope, DefaultInverseFrequenciesFollowTheFormula) {
  const mk::RopeConfig rope{mk::RopeType::kDefault, 10000.0};
  const std::vector<float> inv_freq = mk::ref::rope_inverse_frequencies(rope, 64);
  ASSERT_EQ(inv_freq.size(), 32u);
  EXPECT_EQ(inv_freq[0], 1.0f);
  for (size_t i = 0; i < inv_freq.size(); ++i)
    EXPECT_NEAR(inv_freq[i], std::pow(10000.0, -2.0 * double(i) / 64.0), 1e-6 * inv_freq[i]) << i;
}

TEST(Rope, Llama3ScalingMatchesTheFormula) {
  for (const char* preset : {"tiny", "llama-3.1-8b", "llama-3.2-1b"}) {
    SCOPED_TRACE(preset);
    const mk::ModelConfig& c = mk::find_preset(preset).config;
    mk::RopeConfig plain = c.rope;
    plain.type = mk::RopeType::kDefault;
    const std::vector<float> base = mk::ref::rope_inverse_frequencies(plain, c.head_dim);
    const std::vector<float> scaled = mk::ref::rope_inverse_frequencies(c.rope, c.head_dim);
    ASSERT_EQ(scaled.size(), size_t(c.head_dim / 2));
    const double old_context = double(c.rope.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / c.rope.low_freq_factor;
    const double high_freq_wavelen = old_context / c.rope.high_freq_factor;
    int high = 0, low = 0, medium = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      const double wavelen = 2 * std::numbers::pi / base[i];
      if (wavelen < high_freq_wavelen) {
        ++high;
        EXPECT_EQ(scaled[i], base[i]) << i;  // high frequencies unchanged
      } else if (wavelen > low_freq_wavelen) {
        ++low;
        EXPECT_FLOAT_EQ(scaled[i], float(base[i] / c.rope.factor)) << i;  // low frequencies divided by factor
      } else {
        ++medium;
        const double smooth = (old_context / wavelen - c.rope.low_freq_factor) /
                              (c.rope.high_freq_factor - c.rope.low_freq_factor);
        const double want = (1 - smooth) * base[i] / c.rope.factor + smooth * base[i];
        EXPECT_NEAR(scaled[i], want, 1e-6 * want) << i;
        EXPECT_LE(scaled[i], base[i]);
        EXPECT_GE(scaled[i], float(base[i] / c.rope.factor));
      }
    }
    EXPECT_GT(high, 0);
    EXPECT_GT(low, 0);
    EXPECT_GT(medium, 0);
  }
  // For tiny (theta 5e5, head_dim 64, original context 64) the regions are known by hand: wavelengths
  // 2 pi 5e5^(i/32) = 6.3, 9.5, 14.3 | 21.5, 32.4, 48.8 | 73.6, ... against the bounds 16 and 64.
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const std::vector<float> f = mk::ref::rope_inverse_frequencies(tiny.rope, tiny.head_dim);
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(500000.0, -double(i) / 32.0);
    if (i <= 2) {
      EXPECT_NEAR(f[size_t(i)], base, 1e-6 * base) << i;
    } else if (i >= 6) {
      EXPECT_NEAR(f[size_t(i)], base / 8.0, 1e-6 * base) << i;
    } else {
      EXPECT_LT(f[size_t(i)], base * (1 - 1e-3)) << i;
      EXPECT_GT(f[size_t(i)], base / 8.0 * (1 + 1e-3)) << i;
    }
  }
}

TEST(Rope, PositionZeroIsTheIdentityAndValuesNeverRotate) {
  const mk::ModelConfig c = attention_config(2, 1, 16, mk::RopeType::kDefault);
  const int64_t S = 5;
  const auto [table, original, qkv] = rotate_random(c, S, 2 * S, 20);
  for (int64_t t : {int64_t{0}, S}) {  // position 0 of either sequence
    for (int64_t col = 0; col < c.qkv_dim(); ++col) EXPECT_EQ(qkv.row(t)[col], original.row(t)[col]) << col;
  }
  for (int64_t t = 0; t < 2 * S; ++t)
    for (int64_t col = v_col(c, 0); col < c.qkv_dim(); ++col) EXPECT_EQ(qkv.row(t)[col], original.row(t)[col]);
  EXPECT_NE(qkv.row(1)[0], original.row(1)[0]);  // q at position 1 did move
  EXPECT_NE(qkv.row(1)[k_col(c, 0)], original.row(1)[k_col(c, 0)]);  // and so did k
  // Token t sits at position t % seq_len: both sequences rotate alike.
  Matrix second = random_matrix(2 * S, c.qkv_dim(), 20);
  for (int64_t t = 0; t < S; ++t) std::copy_n(second.row(t), c.qkv_dim(), second.row(S + t));
  mk::ref::rope_tile(c, table, S, second, {0, 2 * S}, {0, c.qkv_dim()});
  for (int64_t t = 0; t < S; ++t)
    for (int64_t col = 0; col < c.qkv_dim(); ++col) EXPECT_EQ(second.row(S + t)[col], second.row(t)[col]);
}

TEST(Rope, MatchesTheClosedFormRotation) {
  const mk::ModelConfig c = attention_config(1, 1, 16, mk::RopeType::kDefault);
  const int64_t S = 40;
  const auto [table, original, qkv] = rotate_random(c, S, S, 21);
  const int64_t half = c.head_dim / 2;
  for (int64_t p = 0; p < S; ++p) {
    for (int64_t col : {q_col(c, 0), k_col(c, 0)}) {
      const float* x = original.row(p) + col;
      const float* y = qkv.row(p) + col;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(c.head_dim));
        EXPECT_NEAR(y[i], x[i] * std::cos(angle) - x[i + half] * std::sin(angle), 1e-5) << p << " " << i;
        EXPECT_NEAR(y[i + half], x[i + half] * std::cos(angle) + x[i] * std::sin(angle), 1e-5) << p << " " << i;
      }
    }
  }
}

TEST(Rope, PreservesPairNormsAndInvertsWithTheOppositeAngle) {
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;  // llama3 scaling, GQA
  const int64_t S = 50;
  auto [table, original, qkv] = rotate_random(tiny, S, S, 22);
  const int64_t half = tiny.head_dim / 2;
  for (int64_t t = 0; t < S; ++t) {
    for (int64_t head = 0; head < tiny.n_heads + tiny.n_kv_heads; ++head) {
      const float* x = original.row(t) + head * tiny.head_dim;
      const float* y = qkv.row(t) + head * tiny.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float before = pair_norm(x, i, half);
        EXPECT_NEAR(pair_norm(y, i, half), before, 1e-5f * before + 1e-7f);
      }
    }
  }
  // Rotating by -angle (the same table with sin negated) undoes the rotation.
  mk::ref::RopeTable inverse = table;
  for (float& s : inverse.sin) s = -s;
  mk::ref::rope_tile(tiny, inverse, S, qkv, {0, S}, {0, tiny.qkv_dim()});
  for (size_t i = 0; i < qkv.data.size(); ++i) ASSERT_NEAR(qkv.data[i], original.data[i], 1e-5f) << i;
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const mk::ModelConfig c = attention_config(1, 1, 32, mk::RopeType::kDefault);
  const int64_t S = 80;
  const mk::ref::RopeTable table = mk::ref::make_rope_table(c, S);
  // The same q and k at every position.
  const Matrix seed = random_matrix(1, c.qkv_dim(), 23);
  Matrix qkv(S, c.qkv_dim());
  for (int64_t t = 0; t < S; ++t) std::copy_n(seed.row(0), c.qkv_dim(), qkv.row(t));
  double q_norm = 0, k_norm = 0;
  for (int64_t d = 0; d < c.head_dim; ++d) {
    q_norm += double(seed.row(0)[d]) * seed.row(0)[d];
    k_norm += double(seed.row(0)[k_col(c, 0) + d]) * seed.row(0)[k_col(c, 0) + d];
  }
  const double scale = std::sqrt(q_norm * k_norm);
  mk::ref::rope_tile(c, table, S, qkv, {0, S}, {0, c.qkv_dim()});
  auto score = [&](int64_t m, int64_t n) {
    double sum = 0;
    for (int64_t d = 0; d < c.head_dim; ++d) sum += double(qkv.row(m)[q_col(c, 0) + d]) * qkv.row(n)[k_col(c, 0) + d];
    return sum;
  };
  for (int64_t offset : {0, 1, 3, 17}) {
    const double first = score(offset, 0);
    for (int64_t n : {1, 5, 30, 62}) {
      EXPECT_NEAR(score(n + offset, n), first, 1e-4 * scale) << "m - n = " << offset << ", n = " << n;
    }
  }
  // The property is not trivially true: different offsets do give different scores.
  EXPECT_GT(std::fabs(score(3, 0) - score(0, 0)), 1e-2 * scale);
}
