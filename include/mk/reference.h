// The CPU reference model: fp32 arithmetic over bf16 weights, written as ops that compute one rectangle of their
// output. The reference runs each op over the whole output; the cpu-vm runs the same functions one tile at a time,
// so the two agree bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mk/bf16.h"
#include "mk/kv_cache.h"
#include "mk/model_config.h"
#include "mk/weights.h"

namespace mk::ref {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// A row-major fp32 matrix.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> data;  // (rows, cols)

  Matrix() = default;
  Matrix(int64_t rows_, int64_t cols_) : rows(rows_), cols(cols_), data(size_t(rows_ * cols_)) {}
  float* row(int64_t r) { return data.data() + r * cols; }
  const float* row(int64_t r) const { return data.data() + r * cols; }
};

// Rows of one or more bf16 weight matrices stacked on top of each other, e.g. [wq; wk; wv].
struct StackedWeights {
  struct Part {
    const bf16* data;  // (rows, cols)
    int64_t rows;
  };
  std::vector<Part> parts;
  int64_t cols = 0;

  StackedWeights() = default;
  StackedWeights(const std::vector<bf16>& matrix, int64_t rows, int64_t cols_);
  void append(const std::vector<bf16>& matrix, int64_t rows);
  int64_t rows() const;
  const bf16* row(int64_t r) const;
};

// [wq; wk; wv] of one layer: (q_dim + 2 kv_dim, d_model), the weight of the fused QKV projection.
StackedWeights qkv_weights(const ModelConfig& config, const LayerWeights& layer);

// cos/sin of RoPE per position and frequency, computed the way transformers computes them in fp32.
struct RopeTable {
  int64_t half_dim = 0;
  std::vector<float> cos;  // (max_positions, half_dim)
  std::vector<float> sin;  // (max_positions, half_dim)
};
RopeTable make_rope_table(const ModelConfig& config, int64_t max_positions);
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim);  // (head_dim / 2)

// The weights arranged the way the tile ops take them, and the RoPE table of one sequence length (and of the
// positions a decode step may feed, up to rope_positions): built once per pass, or once per generation.
struct ModelOperands {
  struct Layer {
    StackedWeights qkv;   // (q_dim + 2 kv_dim, d_model)
    StackedWeights o;     // (d_model, q_dim)
    StackedWeights gate;  // (d_ff, d_model)
    StackedWeights up;    // (d_ff, d_model)
    StackedWeights down;  // (d_model, d_ff)
  };
  ModelOperands(const ModelWeights& weights, int64_t seq_len, int64_t rope_positions = 0);
  const ModelWeights& weights;  // norm weights and the embedding are read from here
  std::vector<Layer> layers;    // (n_layers)
  StackedWeights lm_head;       // (vocab_size, d_model); empty without an LM head
  RopeTable rope;               // (max(seq_len, rope_positions), head_dim / 2)
  int64_t seq_len;
};

// ---- ops: each writes only out[rows, cols] ----

// out (T, d_model) <- embedding rows of tokens (T)
void embedding_rows(const std::vector<int32_t>& tokens, const std::vector<bf16>& table, Matrix& out, Range rows);
// out (T, d) <- x * rsqrt(mean(x^2) + eps) * weight
void rmsnorm_rows(const Matrix& x, const std::vector<bf16>& weight, float eps, Matrix& out, Range rows);
// out (T, N) <- a (T, K) @ w (N, K)^T
void linear_tile(const Matrix& a, const StackedWeights& w, Matrix& out, Range rows, Range cols);
// out (T, N) <- residual (T, N) + a (T, K) @ w (N, K)^T
void linear_residual_tile(const Matrix& a, const StackedWeights& w, const Matrix& residual, Matrix& out, Range rows,
                          Range cols);
// out (T, d_ff) <- silu(a @ w_gate^T) * (a @ w_up^T)
void swiglu_tile(const Matrix& a, const StackedWeights& w_gate, const StackedWeights& w_up, Matrix& out, Range rows,
                 Range cols);
// Rotates the q and k columns of qkv (T, q_dim + 2 kv_dim) in place; cols must hold whole heads.
// Token t sits at position t % seq_len.
void rope_tile(const ModelConfig& config, const RopeTable& table, int64_t seq_len, Matrix& qkv, Range rows, Range cols);
// Causal attention of one query head for the queries [queries) of sequence `sequence`:
// out (T, q_dim) head columns <- softmax(q k^T / sqrt(head_dim)) v, reading q, k, v from qkv (T, q_dim + 2 kv_dim).
void attention_tile(const ModelConfig& config, int64_t seq_len, const Matrix& qkv, Matrix& out, int64_t sequence,
                    Range queries, int64_t head);

// ---- prefill and decode ops (include/mk/kv_cache.h: the cache, its split and the pair order) ----

// One prefill token's cache row (2 kv_dim) from its qkv row: K heads into pair order, V as they are.
void kv_append_row(const ModelConfig& config, const float* qkv_row, float* cache_row);
// Columns [cols) of the q | k | v column space for one decode token, q and k heads in pair order (cols must hold
// whole pairs) and RoPE'd at `position`, from its normalized hidden row: out[c - cols.begin]. Each column is the
// forward qkv's natural column, computed the same way.
void decode_qkv_row(const ModelConfig& config, const RopeTable& rope, const float* normed, const StackedWeights& wqkv,
                    int64_t position, Range cols, float* out);
// Split-KV attention: partial row `row` of the partial buffer (B rows_per_sequence, n_heads (head_dim + 4)) for kv
// head `kv_head`: for each of its query heads, one KV block's unnormalized output, max and sum, from q (B, q_dim)
// and the cache (B max_context, 2 kv_dim); an empty partial (max -inf, sum 0) for a block past the position.
void decode_attention_partial(const ModelConfig& config, const KvSplit& split, int64_t max_context, const Matrix& q,
                              const Matrix& cache, std::span<const int32_t> positions, Matrix& partial, int64_t row,
                              int64_t kv_head);
// The attention output of query head `head` for sequence `sequence` (a row of out (B, q_dim)): the partials of its
// blocks 0 .. positions[sequence] / kDecodeKvBlock combined in block order.
void decode_attention_combine(const ModelConfig& config, const KvSplit& split, const Matrix& partial,
                              std::span<const int32_t> positions, Matrix& out, int64_t sequence, int64_t head);

// How the next token is chosen: greedy (temperature 0: the first largest logit), else drawn from
// softmax(logits / temperature) restricted to the top_k largest logits (0: all) and then to the shortest prefix of
// them, largest first, whose probability reaches top_p.
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};
// What validate_sampling's messages call each parameter. The defaults name the fields, for a library caller; a front
// end that checks its user's values passes its own names (SettingNames::sampling: mk generate's flags, Python's
// arguments), so that the message names the setting the user gave.
struct SamplingNames {
  std::string temperature = "SamplingParams::temperature";
  std::string top_k = "SamplingParams::top_k";
  std::string top_p = "SamplingParams::top_p";
};
// Throws mk::Error naming the bad parameter by `names`.
void validate_sampling(const SamplingParams& params, const SamplingNames& names = {});
// The uniform number in [0, 1) that draws the token after `position` of sequence `sequence`: a counter-based hash
// of (seed, sequence, position) (splitmix64's finalizer, 24 bits), the same on every engine and every run.
float sampling_uniform(uint64_t seed, int64_t sequence, int64_t position);
// The token chosen from logits (vocab) with `uniform` from sampling_uniform. Ties go to the lower id.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, float uniform);

// ---- the model ----

// Inputs of one pass: token ids for models with an embedding, hidden states otherwise; a decode step also feeds each
// sequence's position and samples with `sampling`.
struct ModelInput {
  RunShape shape;
  std::vector<int32_t> tokens;     // (batch * seq_len)
  Matrix hidden;                   // (batch * seq_len, d_model), bf16-representable values
  std::vector<int32_t> positions;  // (batch) decode: the position of each sequence's token, its row in the cache
  SamplingParams sampling;         // decode
};
ModelInput random_input(const ModelConfig& config, const RunShape& shape, uint64_t seed);
void validate_input(const ModelConfig& config, const ModelInput& input);  // token ids in range, shapes right

struct ForwardOptions {
  // Round every op's output to bf16, as a bf16 PyTorch model (and the GPU) stores its activations: the yardstick of
  // the tolerance policy, which lets the GPU err at most about twice as much as this against the fp32 forward.
  bool round_activations_to_bf16 = false;
};

// Logits (T, vocab) with an LM head, final hidden states (T, d_model) without.
Matrix forward(const ModelWeights& weights, const ModelInput& input, const ForwardOptions& options = {});

// The KV cache of one generation: kv_cache[l] (batch * max_context, 2 kv_dim) per layer, NaN until written.
std::vector<Matrix> make_kv_cache(const ModelConfig& config, const RunShape& shape);

// One pass of any kind (input.shape.pass) with the program's steps each over its whole output, one matrix per
// buffer kind shared by the layers, except the KV cache: `cache` (prefill and decode), one matrix per layer, read
// and written in place. Returns the matrices by kind (decode: logits and sampled).
std::vector<Matrix> run_pass(const ModelOperands& operands, const ModelInput& input, std::vector<Matrix>* cache,
                             const ForwardOptions& options = {});

void round_to_bf16(Matrix& matrix, Range rows);  // in place, rows [rows) only

}  // namespace mk::ref
