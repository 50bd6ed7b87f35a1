// Model inputs and outputs as safetensors files.
#include "mk/model_io.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "mk/check.h"
#include "mk/safetensors.h"

namespace mk {

namespace {

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(T)};
}

// The values of an I32 or I64 tensor, widened.
std::vector<int64_t> integers(const SafetensorsFile& file, const TensorInfo& tensor) {
  MK_CHECK(tensor.dtype == DType::kI32 || tensor.dtype == DType::kI64, "{}: '{}' must be I32 or I64, got {}",
           file.path(), tensor.name, dtype_name(tensor.dtype));
  std::span<const uint8_t> raw = file.bytes(tensor);
  std::vector<int64_t> values(size_t(tensor.numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    if (tensor.dtype == DType::kI32) {
      int32_t narrow;
      std::memcpy(&narrow, raw.data() + 4 * i, 4);
      values[i] = narrow;
    } else {
      std::memcpy(&values[i], raw.data() + 8 * i, 8);
    }
  }
  return values;
}

}  // namespace

ref::ModelInput load_model_input(const std::filesystem::path& path, const ModelConfig& config) {
  SafetensorsFile file(path);
  ref::ModelInput input;
  if (config.has_embedding) {
    const TensorInfo* tokens = file.find("tokens");
    MK_CHECK(tokens != nullptr, "{}: missing tensor 'tokens' (the model has an embedding)", path.string());
    MK_CHECK(tokens->shape.size() == 2, "{}: 'tokens' must have shape (batch, seq_len), got [{}]", path.string(),
             fmt::join(tokens->shape, ", "));
    input.shape = {tokens->shape[0], tokens->shape[1]};
    input.shape.validate();
    const std::vector<int64_t> ids = integers(file, *tokens);
    for (size_t i = 0; i < ids.size(); ++i) {
      MK_CHECK(ids[i] >= 0 && ids[i] < config.vocab_size, "{}: token id {} at index {} is outside the vocabulary [0, {})",
               path.string(), ids[i], i, config.vocab_size);
      input.tokens.push_back(int32_t(ids[i]));
    }
  } else {
    const TensorInfo* hidden = file.find("hidden");
    MK_CHECK(hidden != nullptr, "{}: missing tensor 'hidden' (the model has no embedding)", path.string());
    MK_CHECK(hidden->shape.size() == 3 && hidden->shape[2] == config.d_model,
             "{}: 'hidden' must have shape (batch, seq_len, {}), got [{}]", path.string(), config.d_model,
             fmt::join(hidden->shape, ", "));
    input.shape = {hidden->shape[0], hidden->shape[1]};
    input.shape.validate();
    std::vector<bf16> values = file.read_bf16(*hidden);
    input.hidden = ref::Matrix(input.shape.tokens(), config.d_model);
    for (size_t i = 0; i < values.size(); ++i) input.hidden.data[i] = to_float(values[i]);
  }
  ref::validate_input(config, input);
  return input;
}

void save_model_input(const std::filesystem::path& path, const ref::ModelInput& input, const ModelConfig& config) {
  if (config.has_embedding) {
    write_safetensors(path, {{"tokens", DType::kI32, {input.shape.batch, input.shape.seq_len}, as_bytes(input.tokens)}});
  } else {
    write_safetensors(path, {{"hidden", DType::kF32, {input.shape.batch, input.shape.seq_len, config.d_model},
                              as_bytes(input.hidden.data)}});
  }
}

void save_model_output(const std::filesystem::path& path, const std::string& name, const ref::Matrix& output,
                       const RunShape& shape) {
  write_safetensors(path, {{name, DType::kF32, {shape.batch, shape.seq_len, output.cols}, as_bytes(output.data)}});
}

ref::Matrix load_model_output(const std::filesystem::path& path, const std::string& name) {
  SafetensorsFile file(path);
  const TensorInfo* tensor = file.find(name);
  MK_CHECK(tensor != nullptr && tensor->dtype == DType::kF32 && tensor->shape.size() == 3,
           "{}: expected F32 tensor '{}' of shape (batch, seq_len, n)", path.string(), name);
  ref::Matrix output(tensor->shape[0] * tensor->shape[1], tensor->shape[2]);
  std::memcpy(output.data.data(), file.bytes(*tensor).data(), output.data.size() * sizeof(float));
  return output;
}

std::vector<std::vector<int32_t>> load_prompts(const std::filesystem::path& path, const ModelConfig& config) {
  MK_CHECK(config.has_embedding, "model '{}' has no embedding: prompts are token ids", config.name);
  const ref::ModelInput input = load_model_input(path, config);
  const int64_t batch = input.shape.batch, seq_len = input.shape.seq_len;
  std::vector<int64_t> lengths(size_t(batch), seq_len);
  SafetensorsFile file(path);
  if (const TensorInfo* tensor = file.find("lengths")) {
    MK_CHECK(tensor->shape == std::vector<int64_t>{batch}, "{}: 'lengths' must have shape ({}), got [{}]",
             path.string(), batch, fmt::join(tensor->shape, ", "));
    lengths = integers(file, *tensor);
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = lengths[size_t(b)];
    MK_CHECK(length >= 1 && length <= seq_len, "{}: sequence {} has length {}, outside [1, {}]", path.string(), b,
             length, seq_len);
    const auto first = input.tokens.begin() + b * seq_len;
    prompts.emplace_back(first, first + length);
  }
  return prompts;
}

void save_sequences(const std::filesystem::path& path, const std::vector<std::vector<int32_t>>& sequences,
                    const std::vector<int32_t>& prompt_lengths) {
  size_t longest = 0;
  for (const std::vector<int32_t>& sequence : sequences) longest = std::max(longest, sequence.size());
  std::vector<int32_t> tokens(sequences.size() * longest, -1), lengths;
  for (size_t b = 0; b < sequences.size(); ++b) {
    std::copy(sequences[b].begin(), sequences[b].end(), tokens.begin() + int64_t(b * longest));
    lengths.push_back(int32_t(sequences[b].size()));
  }
  const int64_t batch = int64_t(sequences.size());
  write_safetensors(path, {{"tokens", DType::kI32, {batch, int64_t(longest)}, as_bytes(tokens)},
                           {"lengths", DType::kI32, {batch}, as_bytes(lengths)},
                           {"prompt_lengths", DType::kI32, {batch}, as_bytes(prompt_lengths)}});
}

}  // namespace mk
