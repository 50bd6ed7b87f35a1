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

// Sequences of a prefill pass over tokens (n x seq_len, right-padded prompts).
inline int64_t prefill_sequences(const DecodeSetup& setup, const std::vector<int32_t>& tokens, int64_t seq_len,
                                 int64_t first_sequence) {
  MK_CHECK(seq_len > 0 && int64_t(tokens.size()) % seq_len == 0,
           "internal error: {} prefill tokens are no whole number of sequences of {}", tokens.size(), seq_len);
  const int64_t count = int64_t(tokens.size()) / seq_len;
  MK_CHECK(first_sequence >= 0 && count >= 1 && first_sequence + count <= setup.batch,
           "internal error: prefill sequences [{}, {}) outside the batch of {}", first_sequence,
           first_sequence + count, setup.batch);
  return count;
}

// The prefill pass over tokens (n x seq_len) of sequences [first, first + n): into the batch's cache when n is the
// batch, else into a cache of its own of seq_len positions a sequence (DecodeEngine::prefill).
inline ref::ModelInput prefill_input(const DecodeSetup& setup, const std::vector<int32_t>& tokens, int64_t seq_len,
                                     int64_t first_sequence) {
  const int64_t count = prefill_sequences(setup, tokens, seq_len, first_sequence);
  ref::ModelInput input;
  input.shape = {count, seq_len, PassKind::kPrefill, count == setup.batch ? setup.max_context : seq_len};
  input.tokens = tokens;
  return input;
}

// Whether a prefill pass (prefill_input's shape) is of the whole batch, which writes the batch's cache itself; a part
// writes a cache of its own, then copied.
inline bool whole_batch(const DecodeSetup& setup, const RunShape& pass) { return pass.batch == setup.batch; }

// The cpu engines' cache of a prefill pass of part of the batch, empty for the whole batch.
inline std::vector<ref::Matrix> part_cache(const ModelConfig& config, const DecodeSetup& setup, const RunShape& pass) {
  return whole_batch(setup, pass) ? std::vector<ref::Matrix>{} : ref::make_kv_cache(config, pass);
}

// A part's own cache (layers of (n seq_len, 2 kv_dim)) into the rows [0, seq_len) of sequences [first, first + n)
// of the batch's cache (layers of (batch max_context, 2 kv_dim)); nothing for part_cache's empty one.
inline void copy_prefill_rows(const std::vector<ref::Matrix>& part, std::vector<ref::Matrix>& cache,
                              int64_t first_sequence, int64_t seq_len, int64_t max_context) {
  if (part.empty()) return;
  for (size_t layer = 0; layer < cache.size(); ++layer) {
    const ref::Matrix& from = part[layer];
    for (int64_t b = 0; b < from.rows / seq_len; ++b)
      std::copy(from.row(b * seq_len), from.row((b + 1) * seq_len),
                cache[layer].row((first_sequence + b) * max_context));
  }
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

// The setup, once its shape and sampling are checked against the model. An engine checks with the default names
// (SamplingParams' fields): a front end checked its user's values first (check_decode_setup), naming its settings.
inline const DecodeSetup& checked(const ModelConfig& config, const DecodeSetup& setup,
                                  const ref::SamplingNames& names = {}) {
  check_pass_shape(config, decode_shape(setup));
  ref::validate_sampling(setup.sampling, names);
  return setup;
}

}  // namespace mk::decode_inputs
