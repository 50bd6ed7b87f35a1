// Model inputs and outputs as safetensors files.
#include "mk/model_io.h"

#include <fmt/ranges.h>

#include <cstring>

#include "mk/check.h"
#include "mk/safetensors.h"

namespace mk {

namespace {

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(T)};
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
    MK_CHECK(tokens->dtype == DType::kI32 || tokens->dtype == DType::kI64, "{}: 'tokens' must be I32 or I64, got {}",
             path.string(), dtype_name(tokens->dtype));
    input.shape = {tokens->shape[0], tokens->shape[1]};
    std::span<const uint8_t> raw = file.bytes(*tokens);
    input.tokens.resize(size_t(tokens->numel()));
    for (size_t i = 0; i < input.tokens.size(); ++i) {
      int64_t id = 0;
      if (tokens->dtype == DType::kI32) {
        int32_t narrow;
        std::memcpy(&narrow, raw.data() + 4 * i, 4);
        id = narrow;
      } else {
        std::memcpy(&id, raw.data() + 8 * i, 8);
      }
      MK_CHECK(id >= 0 && id < config.vocab_size, "{}: token id {} at index {} is outside the vocabulary [0, {})",
               path.string(), id, i, config.vocab_size);
      input.tokens[i] = int32_t(id);
    }
  } else {
    const TensorInfo* hidden = file.find("hidden");
    MK_CHECK(hidden != nullptr, "{}: missing tensor 'hidden' (the model has no embedding)", path.string());
    MK_CHECK(hidden->shape.size() == 3 && hidden->shape[2] == config.d_model,
             "{}: 'hidden' must have shape (batch, seq_len, {}), got [{}]", path.string(), config.d_model,
             fmt::join(hidden->shape, ", "));
    input.shape = {hidden->shape[0], hidden->shape[1]};
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

}  // namespace mk
