// The inputs of a generation's passes, shared by every decode engine (src/generate/engines.cc, src/cuda/gpu_decoder.cc).
#pragma once

#include <vector>

#include "mk/check.h"
#include "mk/generate.h"
#include "mk/kv_cache.h"

namespace mk::decode_inputs {

inline RunShape decode_shape(const DecodeSetup& setup) {
  return {setup.batch, 1, PassKind::kDecode, setup.max_context};
}

// The prefill pass over tokens (batch x seq_len, right-padded prompts).
inline ref::ModelInput prefill_input(const DecodeSetup& setup, const std::vector<int32_t>& tokens, int64_t seq_len) {
  ref::ModelInput input;
  input.shape = {setup.batch, seq_len, PassKind::kPrefill, setup.max_context};
  input.tokens = tokens;
  return input;
}

// One decode step: sequence b feeds tokens[b] at positions[b].
inline ref::ModelInput step_input(const DecodeSetup& setup, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& positions) {
  ref::ModelInput input;
  input.shape = decode_shape(setup);
  input.tokens = tokens;
  input.positions = positions;
  input.sampling = setup.sampling;
  return input;
}

// The sampled buffer (batch, 1), as the engines download it: ids held as floats (exact below 2^24).
inline std::vector<int32_t> token_ids(const ref::Matrix& sampled) {
  std::vector<int32_t> ids;
  for (float value : sampled.data) ids.push_back(int32_t(value));
  return ids;
}

// The setup, once its shape and sampling are checked against the model.
inline const DecodeSetup& checked(const ModelConfig& config, const DecodeSetup& setup) {
  check_pass_shape(config, decode_shape(setup));
  ref::validate_sampling(setup.sampling);
  return setup;
}

}  // namespace mk::decode_inputs
