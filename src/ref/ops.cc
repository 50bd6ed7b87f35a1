// CPU reference ops: fp32 arithmetic over bf16 weights, each op computing one rectangle of its output.
#include <cmath>
#include <numbers>

#include "arith.h"
#include "mk/check.h"
#include "mk/reference.h"
#include "mk/tiles.h"

namespace mk::ref {

namespace {

using arith::dot;

float sum_of_squares(const float* a, int64_t n) { return dot(a, a, n); }

// Visits out[rows, cols] column block by column block so that the weight rows of a block stay in cache while
// every activation row streams past them.
template <typename Element>
void for_each_output(Range rows, Range cols, Element&& element) {
  constexpr int64_t kColumnBlock = 64;
  for (int64_t c0 = cols.begin; c0 < cols.end; c0 += kColumnBlock) {
    const int64_t c1 = std::min(cols.end, c0 + kColumnBlock);
    for (int64_t r = rows.begin; r < rows.end; ++r)
      for (int64_t c = c0; c < c1; ++c) element(r, c);
  }
}

}  // namespace

StackedWeights::StackedWeights(const std::vector<bf16>& matrix, int64_t rows, int64_t cols_) : cols(cols_) {
  append(matrix, rows);
}

void StackedWeights::append(const std::vector<bf16>& matrix, int64_t rows) {
  MK_CHECK(int64_t(matrix.size()) == rows * cols, "weight matrix has {} values, expected {} x {}", matrix.size(), rows,
           cols);
  parts.push_back({matrix.data(), rows});
}

int64_t StackedWeights::rows() const {
  int64_t total = 0;
  for (const Part& part : parts) total += part.rows;
  return total;
}

const bf16* StackedWeights::row(int64_t r) const {
  for (const Part& part : parts) {
    if (r < part.rows) return part.data + r * cols;
    r -= part.rows;
  }
  throw Error("StackedWeights: row out of range");
}

StackedWeights qkv_weights(const ModelConfig& config, const LayerWeights& layer) {
  StackedWeights stacked(layer.wq, config.q_dim(), config.d_model);
  stacked.append(layer.wk, config.kv_dim());
  stacked.append(layer.wv, config.kv_dim());
  return stacked;
}

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim) {
  const int64_t half_dim = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half_dim));
  for (int64_t i = 0; i < half_dim; ++i) {
    // transformers: 1.0 / (theta ** (arange(0, dim, 2).float() / dim)), all in fp32
    const float exponent = float(2 * i) / float(head_dim);
    inv_freq[size_t(i)] = 1.0f / std::pow(float(rope.theta), exponent);
  }
  if (rope.type != RopeType::kLlama3) return inv_freq;
  const double old_context = double(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = float(f / rope.factor);
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
      f = float((1.0 - smooth) * f / rope.factor + smooth * f);
    }
  }
  return inv_freq;
}

RopeTable make_rope_table(const ModelConfig& config, int64_t max_positions) {
  RopeTable table;
  table.half_dim = config.head_dim / 2;
  if (config.rope.type == RopeType::kNone) return table;
  const std::vector<float> inv_freq = rope_inverse_frequencies(config.rope, config.head_dim);
  table.cos.resize(size_t(max_positions * table.half_dim));
  table.sin.resize(size_t(max_positions * table.half_dim));
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < table.half_dim; ++i) {
      const float angle = float(p) * inv_freq[size_t(i)];  // fp32, as transformers computes it
      table.cos[size_t(p * table.half_dim + i)] = float(std::cos(double(angle)));
      table.sin[size_t(p * table.half_dim + i)] = float(std::sin(double(angle)));
    }
  }
  return table;
}

ModelOperands::ModelOperands(const ModelWeights& weights_, int64_t seq_len_, int64_t rope_positions)
    : weights(weights_), rope(make_rope_table(weights_.config, std::max(seq_len_, rope_positions))), seq_len(seq_len_) {
  const ModelConfig& c = weights.config;
  for (const LayerWeights& w : weights.layers) {
    layers.push_back({qkv_weights(c, w), StackedWeights(w.wo, c.d_model, c.q_dim()),
                      StackedWeights(w.w_gate, c.d_ff, c.d_model), StackedWeights(w.w_up, c.d_ff, c.d_model),
                      StackedWeights(w.w_down, c.d_model, c.d_ff)});
  }
  if (c.has_lm_head) lm_head = StackedWeights(weights.lm_head_matrix(), c.vocab_size, c.d_model);
}

void embedding_rows(const std::vector<int32_t>& tokens, const std::vector<bf16>& table, Matrix& out, Range rows) {
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const bf16* source = table.data() + int64_t(tokens[size_t(r)]) * out.cols;
    float* target = out.row(r);
    for (int64_t c = 0; c < out.cols; ++c) target[c] = to_float(source[c]);
  }
}

void rmsnorm_rows(const Matrix& x, const std::vector<bf16>& weight, float eps, Matrix& out, Range rows) {
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const float* in = x.row(r);
    const float inv_rms = 1.0f / std::sqrt(sum_of_squares(in, x.cols) / float(x.cols) + eps);
    float* target = out.row(r);
    for (int64_t c = 0; c < x.cols; ++c) target[c] = (in[c] * inv_rms) * to_float(weight[size_t(c)]);
  }
}

void linear_tile(const Matrix& a, const StackedWeights& w, Matrix& out, Range rows, Range cols) {
  for_each_output(rows, cols, [&](int64_t r, int64_t c) { out.row(r)[c] = dot(a.row(r), w.row(c), a.cols); });
}

void linear_residual_tile(const Matrix& a, const StackedWeights& w, const Matrix& residual, Matrix& out, Range rows,
                          Range cols) {
  for_each_output(rows, cols, [&](int64_t r, int64_t c) {
    out.row(r)[c] = residual.row(r)[c] + dot(a.row(r), w.row(c), a.cols);
  });
}

void swiglu_tile(const Matrix& a, const StackedWeights& w_gate, const StackedWeights& w_up, Matrix& out, Range rows,
                 Range cols) {
  for_each_output(rows, cols, [&](int64_t r, int64_t c) {
    const float gate = dot(a.row(r), w_gate.row(c), a.cols);
    const float up = dot(a.row(r), w_up.row(c), a.cols);
    out.row(r)[c] = arith::silu(gate) * up;
  });
}

void rope_tile(const ModelConfig& config, const RopeTable& table, int64_t seq_len, Matrix& qkv, Range rows,
               Range cols) {
  const int64_t head_dim = config.head_dim;
  const int64_t half = head_dim / 2;
  const int64_t rotated_cols = config.q_dim() + config.kv_dim();  // q and k rotate, v does not
  MK_CHECK(cols.begin % head_dim == 0 && cols.end % head_dim == 0, "rope_tile: columns must hold whole heads");
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const int64_t position = r % seq_len;
    const float* cos = table.cos.data() + position * half;
    const float* sin = table.sin.data() + position * half;
    float* row = qkv.row(r);
    for (int64_t head_begin = cols.begin; head_begin < std::min(cols.end, rotated_cols); head_begin += head_dim) {
      float* x = row + head_begin;
      for (int64_t i = 0; i < half; ++i) arith::rotate_pair(x[i], x[i + half], cos[i], sin[i]);
    }
  }
}

void attention_tile(const ModelConfig& config, int64_t seq_len, const Matrix& qkv, Matrix& out, int64_t sequence,
                    Range queries, int64_t head) {
  const int64_t head_dim = config.head_dim;
  const int64_t kv_head = head / config.group_size();
  const int64_t q_col = head * head_dim;
  const int64_t k_col = config.q_dim() + kv_head * head_dim;
  const int64_t v_col = config.q_dim() + config.kv_dim() + kv_head * head_dim;
  const int64_t first_row = sequence * seq_len;
  // NOTE: in blocks of the decode's KV block, combined in block order: split-KV decode computes the same partials,
  // so decoding token by token gives these bits exactly.
  constexpr int64_t kBlock = tiles::kDecodeKvBlock;
  const int64_t max_blocks = (seq_len + kBlock - 1) / kBlock;
  std::vector<float> scores(static_cast<size_t>(kBlock)), block_out(static_cast<size_t>(max_blocks * head_dim));
  std::vector<float> acc(static_cast<size_t>(head_dim));
  std::vector<arith::BlockStats> stats(static_cast<size_t>(max_blocks));
  for (int64_t i = queries.begin; i < queries.end; ++i) {  // causal: query i sees keys 0..i
    const float* q = qkv.row(first_row + i) + q_col;
    const int64_t num_blocks = i / kBlock + 1;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t first_key = first_row + b * kBlock;
      stats[size_t(b)] = arith::attend_block(q, qkv.row(first_key) + k_col, qkv.cols, qkv.row(first_key) + v_col,
                                             qkv.cols, std::min(kBlock, i + 1 - b * kBlock), head_dim,
                                             scores.data(), block_out.data() + b * head_dim);
    }
    auto block = [&](int64_t b, arith::BlockStats* s) {
      *s = stats[size_t(b)];
      return block_out.data() + b * head_dim;
    };
    arith::combine_blocks(num_blocks, head_dim, block, acc.data(), out.row(first_row + i) + q_col);
  }
}

}  // namespace mk::ref
