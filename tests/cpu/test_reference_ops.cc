// Tests of the CPU reference ops against closed forms, naive double-precision versions, and their own tilings.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mk/check.h"
#include "mk/model_config.h"
#include "mk/random.h"
#include "mk/reference.h"
#include "reference_fixtures.h"

namespace {

using mk::ref::Matrix;
using mk::ref::Range;
using mk::ref::StackedWeights;
using mk::reference_fixtures::attention_config;
using mk::reference_fixtures::k_col;
using mk::reference_fixtures::q_col;
using mk::reference_fixtures::v_col;
using mk::reference_fixtures::random_matrix;

std::vector<mk::bf16> random_bf16(int64_t count, uint64_t seed, float stddev = 0.1f) {
  std::vector<mk::bf16> values(static_cast<size_t>(count));
  mk::Random random(seed);
  for (mk::bf16& value : values) value = mk::to_bf16(random.symmetric(stddev));
  return values;
}

std::vector<mk::bf16> bf16_vector(std::initializer_list<float> values) {
  std::vector<mk::bf16> result;
  for (float value : values) result.push_back(mk::to_bf16(value));
  return result;
}

double naive_dot(const float* a, const mk::bf16* w, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(a[i]) * double(mk::to_float(w[i]));
  return sum;
}

// max |got - want| / max |want|: a scale-aware error for whole outputs.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  return max_err / max_ref;
}

void run_attention(const mk::ModelConfig& c, int64_t seq_len, const Matrix& qkv, Matrix& out) {
  const int64_t batch = qkv.rows / seq_len;
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t h = 0; h < c.n_heads; ++h) mk::ref::attention_tile(c, seq_len, qkv, out, s, {0, seq_len}, h);
}

}  // namespace

// ---- RMSNorm ----

TEST(RmsNorm, ConstantRowNormalizesToOne) {
  Matrix x(1, 64);
  std::fill(x.data.begin(), x.data.end(), 2.0f);
  Matrix out(1, 64);
  mk::ref::rmsnorm_rows(x, std::vector<mk::bf16>(64, mk::to_bf16(1.0f)), 1e-5f, out, {0, 1});
  // 2 / sqrt(4 + 1e-5)
  for (float value : out.data) EXPECT_NEAR(value, 2.0 / std::sqrt(4.0 + 1e-5), 1e-6);
  for (float value : out.data) EXPECT_NEAR(value, 1.0f, 2e-6);
}

TEST(RmsNorm, KnownTwoElementRow) {
  Matrix x(1, 2);
  x.data = {3.0f, 4.0f};
  Matrix out(1, 2);
  mk::ref::rmsnorm_rows(x, bf16_vector({1.0f, 1.0f}), 0.0f, out, {0, 1});
  // rms = sqrt((9 + 16) / 2) = 5 / sqrt(2)
  EXPECT_NEAR(out.data[0], 3.0 * std::sqrt(2.0) / 5.0, 1e-6);  // 0.848528
  EXPECT_NEAR(out.data[1], 4.0 * std::sqrt(2.0) / 5.0, 1e-6);  // 1.131371

  // eps enters under the square root: 3 / sqrt(12.5 + 0.5)
  mk::ref::rmsnorm_rows(x, bf16_vector({1.0f, 1.0f}), 0.5f, out, {0, 1});
  EXPECT_NEAR(out.data[0], 3.0 / std::sqrt(13.0), 1e-6);
}

TEST(RmsNorm, WeightScalesEachColumn) {
  const Matrix x = random_matrix(3, 40, 1);
  std::vector<mk::bf16> ones(40, mk::to_bf16(1.0f));
  std::vector<mk::bf16> weight = random_bf16(40, 2, 1.0f);
  weight[0] = mk::to_bf16(0.5f);
  weight[1] = mk::to_bf16(-2.0f);
  Matrix unit(3, 40), scaled(3, 40);
  mk::ref::rmsnorm_rows(x, ones, 1e-6f, unit, {0, 3});
  mk::ref::rmsnorm_rows(x, weight, 1e-6f, scaled, {0, 3});
  for (int64_t r = 0; r < 3; ++r) {
    // Multiplying by the weight is the last step, so this is exact.
    for (int64_t c = 0; c < 40; ++c) EXPECT_EQ(scaled.row(r)[c], unit.row(r)[c] * mk::to_float(weight[size_t(c)]));
    EXPECT_EQ(scaled.row(r)[0], 0.5f * unit.row(r)[0]);
    EXPECT_EQ(scaled.row(r)[1], -2.0f * unit.row(r)[1]);
    // And the unit-weight row has mean square ~1.
    double mean_square = 0;
    for (int64_t c = 0; c < 40; ++c) mean_square += double(unit.row(r)[c]) * unit.row(r)[c] / 40;
    EXPECT_NEAR(mean_square, 1.0, 1e-5);
  }
}

TEST(RmsNorm, ScaleInvariantAndWritesOnlyItsRows) {
  Matrix x = random_matrix(4, 33, 3);
  Matrix scaled_x = x;
  for (float& value : scaled_x.data) value *= 8.0f;
  const std::vector<mk::bf16> weight = random_bf16(33, 4, 1.0f);
  Matrix a(4, 33), b(4, 33);
  std::fill(a.data.begin(), a.data.end(), -7.0f);
  mk::ref::rmsnorm_rows(x, weight, 0.0f, a, {1, 3});
  mk::ref::rmsnorm_rows(scaled_x, weight, 0.0f, b, {1, 3});
  for (int64_t c = 0; c < 33; ++c) {
    EXPECT_EQ(a.row(0)[c], -7.0f);  // outside the range: untouched
    EXPECT_EQ(a.row(3)[c], -7.0f);
    EXPECT_NEAR(a.row(1)[c], b.row(1)[c], 1e-6f * std::fabs(a.row(1)[c]) + 1e-7f);
    EXPECT_NEAR(a.row(2)[c], b.row(2)[c], 1e-6f * std::fabs(a.row(2)[c]) + 1e-7f);
  }
}

// ---- embedding ----

TEST(Embedding, CopiesTheTokensRows) {
  const int64_t vocab = 10, d = 24;
  const std::vector<mk::bf16> table = random_bf16(vocab * d, 5);
  const std::vector<int32_t> tokens = {3, 0, 9, 3};
  Matrix out(4, d);
  mk::ref::embedding_rows(tokens, table, out, {0, 4});
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out.row(r)[c], mk::to_float(table[size_t(tokens[size_t(r)] * d + c)]));
}

// ---- attention ----

TEST(Attention, SingleKeyReturnsItsValueExactly) {
  const mk::ModelConfig c = attention_config(2, 1, 16);
  Matrix qkv = random_matrix(3, c.qkv_dim(), 10);
  Matrix out(3, c.q_dim());
  for (int64_t h = 0; h < c.n_heads; ++h) mk::ref::attention_tile(c, 3, qkv, out, 0, {0, 1}, h);
  for (int64_t h = 0; h < c.n_heads; ++h)
    for (int64_t d = 0; d < c.head_dim; ++d) EXPECT_EQ(out.row(0)[q_col(c, h) + d], qkv.row(0)[v_col(c, 0) + d]);
}

TEST(Attention, IdenticalKeysAverageTheirValues) {
  const mk::ModelConfig c = attention_config(1, 1, 32);
  Matrix qkv = random_matrix(2, c.qkv_dim(), 11);
  for (int64_t d = 0; d < c.head_dim; ++d) qkv.row(1)[k_col(c, 0) + d] = qkv.row(0)[k_col(c, 0) + d];
  Matrix out(2, c.q_dim());
  mk::ref::attention_tile(c, 2, qkv, out, 0, {0, 2}, 0);
  for (int64_t d = 0; d < c.head_dim; ++d) {
    const float mean = (qkv.row(0)[v_col(c, 0) + d] + qkv.row(1)[v_col(c, 0) + d]) / 2;
    EXPECT_FLOAT_EQ(out.row(1)[d], mean);
  }
}

TEST(Attention, ZeroQueryGivesThePrefixMeanOfValues) {
  const mk::ModelConfig c = attention_config(2, 2, 16);
  const int64_t S = 9;
  Matrix qkv = random_matrix(S, c.qkv_dim(), 12);
  for (int64_t t = 0; t < S; ++t) std::fill(qkv.row(t), qkv.row(t) + c.q_dim(), 0.0f);
  Matrix out(S, c.q_dim());
  run_attention(c, S, qkv, out);
  for (int64_t h = 0; h < c.n_heads; ++h) {
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        double mean = 0;
        for (int64_t j = 0; j <= i; ++j) mean += qkv.row(j)[v_col(c, h) + d];
        mean /= double(i + 1);
        EXPECT_NEAR(out.row(i)[q_col(c, h) + d], mean, 1e-6) << "head " << h << " query " << i;
      }
    }
  }
}

TEST(Attention, MatchesNaiveSoftmaxAndIsCausal) {
  const mk::ModelConfig c = attention_config(2, 1, 16);
  const int64_t S = 7;
  Matrix qkv = random_matrix(2 * S, c.qkv_dim(), 13);
  Matrix out(2 * S, c.q_dim());
  run_attention(c, S, qkv, out);
  std::vector<float> got;
  std::vector<double> want;
  for (int64_t s = 0; s < 2; ++s) {
    for (int64_t h = 0; h < c.n_heads; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        const float* q = qkv.row(s * S + i) + q_col(c, h);
        std::vector<double> p(size_t(i + 1));
        double total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double score = 0;
          for (int64_t d = 0; d < c.head_dim; ++d) score += double(q[d]) * qkv.row(s * S + j)[k_col(c, 0) + d];
          p[size_t(j)] = std::exp(score / std::sqrt(double(c.head_dim)));
          total += p[size_t(j)];
        }
        for (int64_t d = 0; d < c.head_dim; ++d) {
          double value = 0;
          for (int64_t j = 0; j <= i; ++j) value += p[size_t(j)] / total * qkv.row(s * S + j)[v_col(c, 0) + d];
          want.push_back(value);
          got.push_back(out.row(s * S + i)[q_col(c, h) + d]);
        }
      }
    }
  }
  EXPECT_LT(relative_error(got, want), 1e-5);

  // Changing the last token's k and v must leave every earlier query's output as it was.
  Matrix changed = qkv;
  for (int64_t col = c.q_dim(); col < c.qkv_dim(); ++col) changed.row(S - 1)[col] += 3.0f;
  Matrix out_changed(2 * S, c.q_dim());
  run_attention(c, S, changed, out_changed);
  for (int64_t t = 0; t < S - 1; ++t)
    for (int64_t col = 0; col < c.q_dim(); ++col) EXPECT_EQ(out_changed.row(t)[col], out.row(t)[col]);
  EXPECT_NE(out_changed.row(S - 1)[0], out.row(S - 1)[0]);
  for (int64_t col = 0; col < c.q_dim(); ++col) EXPECT_EQ(out_changed.row(S)[col], out.row(S)[col]);  // other sequence
}

TEST(Attention, GqaEqualsMhaWithRepeatedKvHeads) {
  const mk::ModelConfig gqa = attention_config(4, 2, 16);
  const mk::ModelConfig mha = attention_config(4, 4, 16);
  const int64_t S = 6, T = 2 * S;
  const Matrix gqa_qkv = random_matrix(T, gqa.qkv_dim(), 14);
  Matrix mha_qkv(T, mha.qkv_dim());
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(gqa_qkv.row(t), gqa.q_dim(), mha_qkv.row(t));
    // Query head h uses kv head h / group_size: repeat each kv head group_size times.
    for (int64_t h = 0; h < mha.n_kv_heads; ++h) {
      const int64_t source = h / gqa.group_size();
      std::copy_n(gqa_qkv.row(t) + k_col(gqa, source), gqa.head_dim, mha_qkv.row(t) + k_col(mha, h));
      std::copy_n(gqa_qkv.row(t) + v_col(gqa, source), gqa.head_dim, mha_qkv.row(t) + v_col(mha, h));
    }
  }
  Matrix gqa_out(T, gqa.q_dim()), mha_out(T, mha.q_dim());
  run_attention(gqa, S, gqa_qkv, gqa_out);
  run_attention(mha, S, mha_qkv, mha_out);
  EXPECT_EQ(gqa_out.data, mha_out.data);
  // Heads 0 and 1 share a kv head, but their queries differ, so their outputs must too.
  EXPECT_NE(gqa_out.row(S - 1)[q_col(gqa, 0)], gqa_out.row(S - 1)[q_col(gqa, 1)]);
}

// ---- linear layers ----

TEST(Linear, MatchesNaiveDoubleMatmul) {
  const int64_t T = 7, K = 85, N = 37;  // K not a multiple of the 16 lanes: the tail loop runs too
  const Matrix a = random_matrix(T, K, 30);
  const std::vector<mk::bf16> w_top = random_bf16(20 * K, 31);
  const std::vector<mk::bf16> w_bottom = random_bf16(17 * K, 32);
  StackedWeights w(w_top, 20, K);
  w.append(w_bottom, 17);
  ASSERT_EQ(w.rows(), N);
  Matrix out(T, N);
  mk::ref::linear_tile(a, w, out, {0, T}, {0, N});
  std::vector<double> want;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t n = 0; n < N; ++n) want.push_back(naive_dot(a.row(r), w.row(n), K));
  EXPECT_LT(relative_error(out.data, want), 1e-5);
  // Stacking addresses the second part's rows after the first's.
  EXPECT_EQ(w.row(20), w_bottom.data());
  EXPECT_EQ(w.row(19), w_top.data() + 19 * K);
  EXPECT_THROW(w.row(N), mk::Error);
  EXPECT_THROW(w.append(w_top, 3), mk::Error);  // 20 * K values are not 3 rows

  // The residual variant adds the residual to exactly the same products.
  const Matrix residual = random_matrix(T, N, 33);
  Matrix with_residual(T, N);
  mk::ref::linear_residual_tile(a, w, residual, with_residual, {0, T}, {0, N});
  for (size_t i = 0; i < out.data.size(); ++i) EXPECT_EQ(with_residual.data[i], residual.data[i] + out.data[i]);
}

TEST(Linear, SwigluMatchesNaiveSiluTimesUp) {
  const int64_t T = 5, K = 70, N = 90;
  const Matrix a = random_matrix(T, K, 40);
  const std::vector<mk::bf16> gate_data = random_bf16(N * K, 41, 0.3f);  // wide enough to reach silu's curved part
  const std::vector<mk::bf16> up_data = random_bf16(N * K, 42);
  const StackedWeights gate(gate_data, N, K), up(up_data, N, K);
  Matrix out(T, N);
  mk::ref::swiglu_tile(a, gate, up, out, {0, T}, {0, N});
  std::vector<double> want;
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t n = 0; n < N; ++n) {
      const double g = naive_dot(a.row(r), gate.row(n), K);
      const double u = naive_dot(a.row(r), up.row(n), K);
      want.push_back(g / (1 + std::exp(-g)) * u);
    }
  }
  EXPECT_LT(relative_error(out.data, want), 1e-5);
}

// ---- tiling: the cpu-vm computes the same ops one tile at a time and must get the same bits ----

TEST(Tiling, LinearAndSwigluSubRangesAreBitIdentical) {
  const int64_t T = 9, K = 50, N = 150;  // N above the 64-column block
  const Matrix a = random_matrix(T, K, 50);
  const std::vector<mk::bf16> w_data = random_bf16(N * K, 51);
  const std::vector<mk::bf16> u_data = random_bf16(N * K, 52);
  const StackedWeights w(w_data, N, K), u(u_data, N, K);
  Matrix full(T, N), tiled(T, N), full_swiglu(T, N), tiled_swiglu(T, N);
  mk::ref::linear_tile(a, w, full, {0, T}, {0, N});
  mk::ref::swiglu_tile(a, w, u, full_swiglu, {0, T}, {0, N});
  std::fill(tiled.data.begin(), tiled.data.end(), NAN);
  std::fill(tiled_swiglu.data.begin(), tiled_swiglu.data.end(), NAN);
  for (Range rows : {Range{0, 4}, Range{4, 5}, Range{5, T}}) {
    for (Range cols : {Range{0, 17}, Range{17, 80}, Range{80, 81}, Range{81, N}}) {
      mk::ref::linear_tile(a, w, tiled, rows, cols);
      mk::ref::swiglu_tile(a, w, u, tiled_swiglu, rows, cols);
    }
  }
  EXPECT_EQ(std::memcmp(full.data.data(), tiled.data.data(), full.data.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(full_swiglu.data.data(), tiled_swiglu.data.data(), full.data.size() * sizeof(float)), 0);
}

TEST(Tiling, AttentionAndRopeSubRangesAreBitIdentical) {
  const mk::ModelConfig& c = mk::find_preset("tiny").config;
  const int64_t S = 13, T = 2 * S;
  const mk::ref::RopeTable table = mk::ref::make_rope_table(c, S);
  Matrix qkv = random_matrix(T, c.qkv_dim(), 60);
  Matrix tiled_qkv = qkv;
  mk::ref::rope_tile(c, table, S, qkv, {0, T}, {0, c.qkv_dim()});
  // One head of columns at a time, a few rows at a time.
  for (Range rows : {Range{0, 5}, Range{5, 6}, Range{6, T}})
    for (int64_t head = 0; head < c.n_heads + 2 * c.n_kv_heads; ++head)
      mk::ref::rope_tile(c, table, S, tiled_qkv, rows, {head * c.head_dim, (head + 1) * c.head_dim});
  ASSERT_EQ(std::memcmp(qkv.data.data(), tiled_qkv.data.data(), qkv.data.size() * sizeof(float)), 0);
  EXPECT_THROW(mk::ref::rope_tile(c, table, S, tiled_qkv, {0, 1}, {0, c.head_dim / 2}), mk::Error);

  Matrix full(T, c.q_dim()), tiled(T, c.q_dim());
  run_attention(c, S, qkv, full);
  std::fill(tiled.data.begin(), tiled.data.end(), NAN);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t h = c.n_heads - 1; h >= 0; --h)  // any order
      for (Range queries : {Range{7, S}, Range{0, 1}, Range{1, 7}})
        mk::ref::attention_tile(c, S, qkv, tiled, s, queries, h);
  EXPECT_EQ(std::memcmp(full.data.data(), tiled.data.data(), full.data.size() * sizeof(float)), 0);
}
