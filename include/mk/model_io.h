// Model inputs and outputs as safetensors files: what `mk run --input/--output` read and write.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "mk/reference.h"

namespace mk {

// Reads a safetensors file holding either "tokens" (I32 or I64, shape (batch, seq_len)) for models with an
// embedding, or "hidden" (BF16/F16/F32, shape (batch, seq_len, d_model)) for models without.
ref::ModelInput load_model_input(const std::filesystem::path& path, const ModelConfig& config);
void save_model_input(const std::filesystem::path& path, const ref::ModelInput& input, const ModelConfig& config);

// Writes the forward pass's output (T, N) as F32 `name` of shape (batch, seq_len, N).
void save_model_output(const std::filesystem::path& path, const std::string& name, const ref::Matrix& output,
                       const RunShape& shape);
ref::Matrix load_model_output(const std::filesystem::path& path, const std::string& name);

// Prompts for `mk generate`: "tokens" (batch, seq_len) as load_model_input reads it, and optionally "lengths"
// (batch) of the right-padded rows (default: every row whole).
std::vector<std::vector<int32_t>> load_prompts(const std::filesystem::path& path, const ModelConfig& config);
// Generated sequences: "tokens" (batch, longest) I32 right-padded with -1, "lengths" and "prompt_lengths" (batch).
void save_sequences(const std::filesystem::path& path, const std::vector<std::vector<int32_t>>& sequences,
                    const std::vector<int32_t>& prompt_lengths);

}  // namespace mk
