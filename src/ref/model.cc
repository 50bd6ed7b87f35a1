// The CPU reference forward pass: the layer program's steps one after the other, each over its whole output.
#include <fmt/format.h>

#include "mk/check.h"
#include "mk/random.h"
#include "mk/program.h"
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

void round_to_bf16(Matrix& matrix, Range rows) {
  for (int64_t r = rows.begin; r < rows.end; ++r)
    for (int64_t c = 0; c < matrix.cols; ++c) matrix.row(r)[c] = mk::round_to_bf16(matrix.row(r)[c]);
}

Matrix forward(const ModelWeights& weights, const ModelInput& input, const ForwardOptions& options) {
  const ModelConfig& c = weights.config;
  validate_input(c, input);
  const BufferTable table(c, input.shape);
  const OpContext ctx{c, input.shape, table};
  const ModelOperands operands(weights, input.shape.seq_len);
  // NOTE: one matrix per buffer kind, shared by the layers: each step reads only what the steps before it wrote
  // in the same or the previous layer, so one layer's activations at a time suffice.
  std::vector<Matrix> by_kind(kNumBufferKinds);
  CpuTile cpu{c, operands, input.tokens, table, {}};
  for (const Buffer& buffer : table.buffers()) {
    Matrix& matrix = by_kind[size_t(buffer.kind)];
    if (matrix.rows == 0 && buffer.kind != BufferKind::kTokens) matrix = Matrix(buffer.rows, buffer.cols);
    cpu.buffers.push_back(&matrix);
  }
  if (!c.has_embedding) by_kind[size_t(BufferKind::kHidden)] = input.hidden;
  for_each_step(c, [&](const OpDescriptor& op, uint16_t layer) {
    run_whole_step(op, ctx, cpu, layer, by_kind[size_t(op.output(layer).kind)], options.round_activations_to_bf16);
  });
  return std::move(by_kind[size_t(output_of_pass(c).kind)]);
}

}  // namespace mk::ref
