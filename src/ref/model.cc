// The CPU reference passes (forward, prefill, decode): the pass's program step by step, each over its whole output.
#include <fmt/format.h>

#include "mk/check.h"
#include "mk/kv_cache.h"
#include "mk/random.h"
#include "mk/program.h"
#include "mk/reference.h"

namespace mk::ref {

ModelInput random_input(const ModelConfig& config, const RunShape& shape, uint64_t seed) {
  shape.validate();
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
  const RunShape& shape = input.shape;
  check_pass_shape(config, shape);  // validates the shape before tokens() multiplies it
  const int64_t tokens = shape.tokens();
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
  if (shape.pass != PassKind::kDecode) return;
  MK_CHECK(int64_t(input.positions.size()) == shape.batch, "a decode step of batch {} needs {} positions, got {}",
           shape.batch, shape.batch, input.positions.size());
  for (size_t b = 0; b < input.positions.size(); ++b) {
    MK_CHECK(input.positions[b] >= 0 && input.positions[b] < shape.max_context,
             "sequence {}: position {} is outside the KV cache [0, {})", b, input.positions[b], shape.max_context);
  }
  validate_sampling(input.sampling);
}

void round_to_bf16(Matrix& matrix, Range rows) {
  for (int64_t r = rows.begin; r < rows.end; ++r)
    for (int64_t c = 0; c < matrix.cols; ++c) matrix.row(r)[c] = mk::round_to_bf16(matrix.row(r)[c]);
}

std::vector<Matrix> make_kv_cache(const ModelConfig& config, const RunShape& shape) {
  std::vector<Matrix> cache;
  for (int64_t layer = 0; layer < config.n_layers; ++layer) {
    cache.emplace_back(shape.batch * shape.max_context, 2 * config.kv_dim());
    std::fill(cache.back().data.begin(), cache.back().data.end(), NAN);  // a read before its write shows
  }
  return cache;
}

std::vector<Matrix> run_pass(const ModelOperands& operands, const ModelInput& input, std::vector<Matrix>* cache,
                             const ForwardOptions& options) {
  const ModelConfig& c = operands.weights.config;
  validate_input(c, input);
  const RunShape& shape = input.shape;
  const bool rope_covers = c.rope.type == RopeType::kNone ||
                           int64_t(operands.rope.cos.size()) >= shape.max_context * operands.rope.half_dim;
  MK_CHECK(operands.seq_len == shape.seq_len && rope_covers,
           "internal error: operands for seq {} used for a pass of seq {} and max context {}", operands.seq_len,
           shape.seq_len, shape.max_context);
  const bool with_cache = shape.pass != PassKind::kForward;
  MK_CHECK(!with_cache || (cache && int64_t(cache->size()) == c.n_layers &&
                           cache->front().rows == shape.batch * shape.max_context),
           "internal error: a {} pass needs a KV cache of {} layers x {} rows", pass_kind_name(shape.pass), c.n_layers,
           shape.batch * shape.max_context);
  const BufferTable table(c, shape);
  const OpContext ctx{c, shape, table};
  // NOTE: one matrix per buffer kind, shared by the layers: each step reads only what the steps before it wrote
  // in the same or the previous layer, so one layer's activations at a time suffice. The cache is per layer.
  std::vector<Matrix> by_kind(kNumBufferKinds);
  CpuTile cpu{c, operands, input, table, {}};
  for (const Buffer& buffer : table.buffers()) {
    if (buffer.kind == BufferKind::kKvCache) {
      cpu.buffers.push_back(&(*cache)[size_t(buffer.layer)]);
      continue;
    }
    Matrix& matrix = by_kind[size_t(buffer.kind)];
    if (matrix.rows == 0 && !buffer.host_written) matrix = Matrix(buffer.rows, buffer.cols);
    cpu.buffers.push_back(&matrix);
  }
  if (!c.has_embedding) by_kind[size_t(BufferKind::kHidden)] = input.hidden;
  for_each_step(c, shape.pass, [&](const OpDescriptor& op, uint16_t layer) {
    const BufferRef out = op.output(layer);
    Matrix& matrix = out.kind == BufferKind::kKvCache ? (*cache)[size_t(out.layer)] : by_kind[size_t(out.kind)];
    // Only what the gpu engine stores as bf16 is rounded: not fp32 partials, not token ids.
    const bool round = options.round_activations_to_bf16 && buffer_kind_info(out.kind).element == ElementType::kBf16;
    run_whole_step(op, ctx, cpu, layer, matrix, round);
  });
  return by_kind;
}

Matrix forward(const ModelWeights& weights, const ModelInput& input, const ForwardOptions& options) {
  MK_CHECK(input.shape.pass == PassKind::kForward, "ref::forward runs forward passes, not {}",
           pass_kind_name(input.shape.pass));
  const ModelOperands operands(weights, input.shape.seq_len);
  std::vector<Matrix> by_kind = run_pass(operands, input, nullptr, options);
  return std::move(by_kind[size_t(output_of_pass(weights.config).kind)]);
}

}  // namespace mk::ref
