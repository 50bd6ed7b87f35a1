// CPU reference ops of prefill and decode: the cache append, the decode projections, split-KV attention and its
// combine, and sampling. Each computes through src/ref/arith.h exactly as the forward ops do.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "arith.h"
#include "mk/check.h"
#include "mk/reference.h"
#include "mk/tiles.h"

namespace mk::ref {

namespace {

constexpr int64_t kBlock = tiles::kDecodeKvBlock;
constexpr int64_t kStats = tiles::kDecodePartialStats;

// A head stored in pair order (include/mk/kv_cache.h) back in natural order.
void to_natural(const float* pair_order, int64_t head_dim, float* natural) {
  for (int64_t j = 0; j < head_dim; ++j) natural[natural_column(j, head_dim)] = pair_order[j];
}

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void kv_append_row(const ModelConfig& config, const float* qkv_row, float* cache_row) {
  const int64_t head_dim = config.head_dim, kv_dim = config.kv_dim();
  const float* k = qkv_row + config.q_dim();
  for (int64_t head = 0; head < config.n_kv_heads; ++head)
    for (int64_t j = 0; j < head_dim; ++j)
      cache_row[head * head_dim + j] = k[head * head_dim + natural_column(j, head_dim)];
  std::copy(k + kv_dim, k + 2 * kv_dim, cache_row + kv_dim);
}

void decode_qkv_row(const ModelConfig& config, const RopeTable& rope, const float* normed, const StackedWeights& wqkv,
                    int64_t position, Range cols, float* out) {
  const int64_t head_dim = config.head_dim, half = head_dim / 2;
  const int64_t rotated_cols = config.q_dim() + config.kv_dim();  // q and k are in pair order and rotate
  MK_CHECK((cols.begin >= rotated_cols || cols.begin % 2 == 0) && (cols.end >= rotated_cols || cols.end % 2 == 0),
           "decode_qkv_row: columns [{}, {}) split a RoPE pair", cols.begin, cols.end);
  for (int64_t c = cols.begin; c < cols.end; ++c) {
    const int64_t weight_row = c < rotated_cols ? c - c % head_dim + natural_column(c % head_dim, head_dim) : c;
    out[c - cols.begin] = arith::dot(normed, wqkv.row(weight_row), wqkv.cols);
  }
  if (config.rope.type == RopeType::kNone) return;
  const float* cos = rope.cos.data() + position * half;
  const float* sin = rope.sin.data() + position * half;
  for (int64_t c = cols.begin; c < std::min(cols.end, rotated_cols); c += 2) {
    const int64_t i = (c % head_dim) / 2;
    arith::rotate_pair(out[c - cols.begin], out[c + 1 - cols.begin], cos[i], sin[i]);
  }
}

void decode_attention_partial(const ModelConfig& config, const KvSplit& split, int64_t max_context, const Matrix& q,
                              const Matrix& cache, std::span<const int32_t> positions, Matrix& partial, int64_t row,
                              int64_t kv_head) {
  const int64_t head_dim = config.head_dim, group = config.group_size(), stride = head_dim + kStats;
  const int64_t sequence = row / split.rows_per_sequence();
  const int64_t block = split.block_of_row(row % split.rows_per_sequence());
  const int64_t first_key = block * kBlock;
  const int64_t keys = block < split.blocks ? std::min(kBlock, positions[size_t(sequence)] + 1 - first_key) : 0;
  float* record = partial.row(row) + kv_head * group * stride;
  if (keys <= 0) {  // a block past the position: empty, and left out by the combine
    for (int64_t h = 0; h < group; ++h, record += stride) {
      std::fill(record, record + stride, 0.0f);
      record[head_dim] = -INFINITY;
    }
    return;
  }
  const int64_t first_row = sequence * max_context + first_key;
  std::vector<float> k(static_cast<size_t>(keys * head_dim)), q_head(static_cast<size_t>(head_dim));
  std::vector<float> scores(static_cast<size_t>(keys));
  for (int64_t j = 0; j < keys; ++j)
    to_natural(cache.row(first_row + j) + kv_head * head_dim, head_dim, &k[size_t(j * head_dim)]);
  const float* v = cache.row(first_row) + config.kv_dim() + kv_head * head_dim;
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h, record += stride) {
    to_natural(q.row(sequence) + h * head_dim, head_dim, q_head.data());
    const arith::BlockStats stats =
        arith::attend_block(q_head.data(), k.data(), head_dim, v, cache.cols, keys, head_dim, scores.data(), record);
    record[head_dim] = stats.max;
    record[head_dim + 1] = stats.sum;
    record[head_dim + 2] = record[head_dim + 3] = 0.0f;
  }
}

void decode_attention_combine(const ModelConfig& config, const KvSplit& split, const Matrix& partial,
                              std::span<const int32_t> positions, Matrix& out, int64_t sequence, int64_t head) {
  const int64_t head_dim = config.head_dim, stride = head_dim + kStats;
  const int64_t first_row = sequence * split.rows_per_sequence();
  auto block = [&](int64_t b, arith::BlockStats* stats) {
    const float* record = partial.row(first_row + split.row_of_block(b)) + head * stride;
    *stats = {record[head_dim], record[head_dim + 1]};
    return record;
  };
  std::vector<float> acc(static_cast<size_t>(head_dim));
  const int64_t num_blocks = positions[size_t(sequence)] / kBlock + 1;
  arith::combine_blocks(num_blocks, head_dim, block, acc.data(), out.row(sequence) + head * head_dim);
}

void validate_sampling(const SamplingParams& p, const SamplingNames& names) {
  MK_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f, "{} must be 0 (greedy) or positive, got {}",
           names.temperature, p.temperature);
  MK_CHECK(p.top_k >= 0, "{} must be 0 (no limit) or positive, got {}", names.top_k, p.top_k);
  MK_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "{} must be in (0, 1], got {}", names.top_p, p.top_p);
}

float sampling_uniform(uint64_t seed, int64_t sequence, int64_t position) {
  const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(sequence)) ^ uint64_t(position));
  return float(key >> 40) * 0x1.0p-24f;  // 24 bits: exact in fp32, below 1
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, float uniform) {
  if (p.temperature == 0.0f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  // Candidates largest first, ties to the lower id; only the top k need ordering.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, vocab) : vocab;
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  // Scaled after subtracting the largest: logit / temperature alone overflows to inf at a tiny temperature, and
  // inf - inf is NaN.
  const float max = logits[ids[0]];
  std::vector<float> weight(static_cast<size_t>(k));
  float total = 0.0f;
  for (int64_t i = 0; i < k; ++i) total += weight[size_t(i)] = std::exp((logits[ids[size_t(i)]] - max) / p.temperature);
  // Top-p: the shortest prefix whose share of the weight reaches top_p.
  int64_t kept = k;
  float kept_total = total;
  if (p.top_p < 1.0f) {
    kept_total = 0.0f;
    for (kept = 0; kept < k && kept_total < p.top_p * total;) kept_total += weight[size_t(kept++)];
  }
  const float target = uniform * kept_total;
  float cumulative = 0.0f;
  for (int64_t i = 0; i < kept; ++i) {
    cumulative += weight[size_t(i)];
    if (target < cumulative) return ids[size_t(i)];
  }
  return ids[size_t(kept - 1)];
}

}  // namespace mk::ref
