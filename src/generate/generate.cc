// The generation loop (prefill, then decode steps with per-sequence positions and stops), the default cache size
// and the memory check.
#include "mk/generate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "mk/buffers.h"
#include "mk/check.h"
#include "mk/files.h"
#include "mk/kv_cache.h"
#include "mk/tiles.h"
#include "mk/tokenizer.h"
#include "mk/weights.h"
#include "decode_inputs.h"

namespace mk {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(int64_t(1) << 30)); }

// Prompt b's tokens: a generation starts from at least one.
template <typename Id>
void check_prompt_not_empty(const std::vector<Id>& prompt, size_t b) {
  MK_CHECK(!prompt.empty(), "prompt {} is empty: generation starts from at least one token", b);
}

// An id the model lacks beside one it has is harmless (it never matches); with none it has, generation would run on to
// the budget as if there were no EOS.
void check_eos_reaches_vocabulary(const ModelConfig& config, const std::vector<int32_t>& ids,
                                  const std::string& source) {
  const bool any_in_vocabulary =
      std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id >= 0 && id < config.vocab_size; });
  MK_CHECK(ids.empty() || any_in_vocabulary,
           "{} names no id in the model's vocabulary [0, {}), got {}: no token could end a sequence", source,
           config.vocab_size, fmt::join(ids, ", "));
}

// Checks the prompts against the engine: one per sequence, each at least one token, each fitting the cache.
void check_prompts(const std::vector<std::vector<int32_t>>& prompts, const DecodeSetup& setup,
                   const SettingNames& names) {
  MK_CHECK(int64_t(prompts.size()) == setup.batch, "{} prompts for an engine of batch {}", prompts.size(), setup.batch);
  for (size_t b = 0; b < prompts.size(); ++b) {
    check_prompt_not_empty(prompts[b], b);
    MK_CHECK(int64_t(prompts[b].size()) <= setup.max_context,
             "prompt {} has {} tokens, more than the KV cache's {} positions ({})", b, prompts[b].size(),
             setup.max_context, names.max_context);
  }
}

// What generate() checks of its arguments; the engine checked its setup when it was built.
void check_run(const std::vector<std::vector<int32_t>>& prompts, const GenerationOptions& options,
               const DecodeSetup& setup, const SettingNames& names = {}) {
  check_prompts(prompts, setup, names);
  MK_CHECK(options.max_new_tokens >= 0, "max new tokens must not be negative, got {}", options.max_new_tokens);
  MK_CHECK(options.prefill_batch >= 0, "prefill batch must not be negative, got {}", options.prefill_batch);
  MK_CHECK(options.steps_per_sync >= 1 && options.steps_per_sync <= kMaxStepsPerSync,
           "steps per sync must be in [1, {}], got {}", kMaxStepsPerSync, options.steps_per_sync);
}

// Every prompt of sequences [first, first + count) but its last token, right-padded to seq_len: a prefill pass's
// (count, seq_len) tokens.
std::vector<int32_t> prefill_tokens(const std::vector<std::vector<int32_t>>& prompts, size_t first, size_t count,
                                    int64_t seq_len, int32_t pad) {
  std::vector<int32_t> tokens(count * size_t(seq_len), pad);
  for (size_t b = 0; b < count; ++b)
    std::copy(prompts[first + b].begin(), prompts[first + b].end() - 1, tokens.begin() + int64_t(b) * seq_len);
  return tokens;
}

// The prompts but their last tokens, into the cache: options.prefill_batch sequences a pass; returns the passes.
int64_t prefill(DecodeEngine& engine, const std::vector<std::vector<int32_t>>& prompts, int64_t seq_len,
                const GenerationOptions& options) {
  const size_t batch = prompts.size();
  const size_t per_pass = options.prefill_batch > 0 ? std::min(size_t(options.prefill_batch), batch) : batch;
  int64_t passes = 0;
  for (size_t first = 0; first < batch; first += per_pass, ++passes) {
    const size_t count = std::min(per_pass, batch - first);
    engine.prefill(prefill_tokens(prompts, first, count, seq_len, options.pad_id), seq_len, int64_t(first));
  }
  return passes;
}

// Steps the next wait for the engine covers: no more than any generating sequence may still make, nor than any
// sequence's cache has rows left for. A finished sequence is fed its own ids too inside a group (the engine feeds
// every sequence), so it writes cache rows past its end that nothing reads; the host feeds it its last token and
// position again at the next wait. NOTE: grouping used to stop for the whole batch once any sequence finished.
int64_t steps_before_sync(const DecodeEngine& engine, const GenerationResult& result, const std::vector<bool>& done,
                          const std::vector<int32_t>& positions, const GenerationOptions& options) {
  if (options.keep_logits) return 1;
  const DecodeSetup& setup = engine.setup();
  int64_t count = std::min(options.steps_per_sync, engine.max_steps_per_sync());
  for (size_t b = 0; b < done.size(); ++b) {
    const SequenceResult& sequence = result.sequences[b];
    const int64_t made = int64_t(sequence.tokens.size()) - sequence.prompt_length;
    if (!done[b]) count = std::min(count, options.max_new_tokens - made);
    count = std::min<int64_t>(count, setup.max_context - positions[b]);
  }
  return std::max<int64_t>(count, 1);
}

// One step's ids into the result: each generating sequence takes its id and stops at EOS, at max new tokens or at
// the cache's end, or feeds it next; the ids of sequences already done are ignored. The ids taken (-1: none).
std::vector<int32_t> take_step(const std::vector<int32_t>& next, const DecodeSetup& setup,
                               const GenerationOptions& options, GenerationResult& result, std::vector<bool>& done,
                               std::vector<int32_t>& tokens, std::vector<int32_t>& positions) {
  std::vector<int32_t> made(done.size(), -1);
  for (size_t b = 0; b < done.size(); ++b) {
    if (done[b]) continue;
    SequenceResult& sequence = result.sequences[b];
    made[b] = next[b];
    sequence.tokens.push_back(next[b]);
    done[b] = true;
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), next[b]) != options.eos_ids.end()) {
      sequence.stop = StopReason::kEos;
    } else if (int64_t(sequence.tokens.size()) - sequence.prompt_length == options.max_new_tokens) {
      sequence.stop = StopReason::kMaxNewTokens;
    } else if (positions[b] + 1 >= setup.max_context) {
      sequence.stop = StopReason::kCacheFull;  // no cache row left to feed the new token at
    } else {
      done[b] = false;
      tokens[b] = next[b];
      ++positions[b];
    }
  }
  return made;
}

}  // namespace

const char* stop_reason_text(StopReason reason) {
  switch (reason) {
    case StopReason::kEos:
      return "EOS";
    case StopReason::kMaxNewTokens:
      return "max new tokens";
    case StopReason::kCacheFull:
      return "the KV cache's end";
  }
  return "?";
}

GenerationResult generate(DecodeEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationOptions& options, const StepCallback& on_step) {
  const DecodeSetup& setup = engine.setup();
  check_run(prompts, options, setup);
  GenerationResult result;
  const size_t batch = prompts.size();
  int64_t longest = 0;
  for (const std::vector<int32_t>& prompt : prompts) longest = std::max<int64_t>(longest, int64_t(prompt.size()));
  if (longest > 1) {
    const auto start = std::chrono::steady_clock::now();
    result.prefill_passes = prefill(engine, prompts, longest - 1, options);
    result.prefill_s = seconds_since(start);
  }
  std::vector<int32_t> tokens(batch), positions(batch);
  std::vector<bool> done(batch, options.max_new_tokens == 0);
  for (size_t b = 0; b < batch; ++b) {
    result.sequences.push_back({prompts[b], int64_t(prompts[b].size()), StopReason::kMaxNewTokens});
    tokens[b] = prompts[b].back();
    positions[b] = int32_t(prompts[b].size() - 1);
  }
  for (int64_t step = 0; std::find(done.begin(), done.end(), false) != done.end();) {
    const int64_t count = steps_before_sync(engine, result, done, positions, options);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::vector<int32_t>> group = engine.steps(tokens, positions, count);
    const double seconds = seconds_since(start);
    ++result.waits;
    // Steps past the last sequence's stop made nothing; their time goes to the steps that did.
    std::vector<std::vector<int32_t>> made_by_step;
    for (const std::vector<int32_t>& next : group) {
      if (std::find(done.begin(), done.end(), false) == done.end()) break;
      if (options.keep_logits) result.logits.push_back(engine.logits());  // count is 1 then
      made_by_step.push_back(take_step(next, setup, options, result, done, tokens, positions));
    }
    for (const std::vector<int32_t>& made : made_by_step) {
      result.step_s.push_back(seconds / double(made_by_step.size()));
      if (on_step) on_step(step, made);
      ++step;
    }
  }
  return result;
}

void check_decode_setup(const ModelConfig& config, const DecodeSetup& setup, const SettingNames& names) {
  decode_inputs::checked(config, setup, names.sampling);
}

void check_generation(const ModelConfig& config, const std::vector<std::vector<int32_t>>& prompts,
                      const GenerationOptions& options, const DecodeSetup& setup, const SettingNames& names) {
  check_decode_setup(config, setup, names);
  check_run(prompts, options, setup, names);
}

std::vector<int32_t> model_eos_ids(const ModelConfig& config, const std::filesystem::path& model_dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::filesystem::path path = model_dir / name;
    const std::optional<nlohmann::json> json = read_config_json_if_present(path);
    if (!json) continue;
    const auto eos = json->find("eos_token_id");
    if (eos == json->end() || eos->is_null()) continue;
    const std::string source = path.string() + ": eos_token_id";
    const std::vector<int32_t> ids = json_token_ids(*eos, source);
    check_eos_reaches_vocabulary(config, ids, source);
    return ids;
  }
  return {};
}

std::vector<int32_t> default_eos_ids(const ModelConfig& config, const std::filesystem::path& model_dir,
                                     const Tokenizer* tokenizer) {
  std::vector<int32_t> ids = model_dir.empty() ? std::vector<int32_t>{} : model_eos_ids(config, model_dir);
  if (!ids.empty()) return ids;
  std::optional<Tokenizer> loaded;
  if (tokenizer == nullptr && !model_dir.empty() && Tokenizer::in_model_dir(model_dir)) {
    try {
      tokenizer = &loaded.emplace(Tokenizer::load(model_dir));
    } catch (const Error& error) {  // a run of ids would not say why it read the tokenizer
      throw Error(
          fmt::format("{} (read for the default EOS ids: neither generation_config.json nor config.json "
                      "names an eos_token_id)",
                      error.what()));
    }
  }
  if (tokenizer == nullptr) return ids;
  // The tokenizer checked its ids against its own vocabulary, which may be larger than the model's.
  check_eos_reaches_vocabulary(config, tokenizer->eos_ids(), tokenizer->eos_source());
  return tokenizer->eos_ids();
}

namespace {

template <typename Id>
void check_prompt_ids_of(const ModelConfig& config, const std::vector<std::vector<Id>>& prompts) {
  for (size_t b = 0; b < prompts.size(); ++b) {
    check_prompt_not_empty(prompts[b], b);
    // Named here, by the model's limit: past it, the cache (which cannot grow past it) would be blamed instead.
    MK_CHECK(config.rope.type == RopeType::kNone || int64_t(prompts[b].size()) <= config.max_position_embeddings,
             "prompt {} has {} tokens, more than the model's max_position_embeddings {}", b, prompts[b].size(),
             config.max_position_embeddings);
    for (size_t i = 0; i < prompts[b].size(); ++i) {
      const Id id = prompts[b][i];
      MK_CHECK(id >= 0 && id < config.vocab_size,
               "prompt {}: token id {} at position {} is outside the vocabulary [0, {})", b, id, i, config.vocab_size);
    }
  }
}

}  // namespace

void check_prompt_ids(const ModelConfig& config, const std::vector<std::vector<int32_t>>& prompts) {
  check_prompt_ids_of(config, prompts);
}

std::vector<std::vector<int32_t>> checked_prompt_ids(const ModelConfig& config,
                                                     const std::vector<std::vector<int64_t>>& prompts) {
  check_prompt_ids_of(config, prompts);
  std::vector<std::vector<int32_t>> narrow;
  for (const std::vector<int64_t>& prompt : prompts) narrow.emplace_back(prompt.begin(), prompt.end());
  return narrow;
}

std::vector<int32_t> checked_eos_ids(const ModelConfig& config, const std::vector<int64_t>& eos_ids,
                                     const std::string& eos_source) {
  for (const int64_t id : eos_ids) {
    MK_CHECK(id >= 0 && id < config.vocab_size,
             "EOS id {} (from {}) is outside the vocabulary [0, {}): no token could end a sequence with it", id,
             eos_source, config.vocab_size);
  }
  return {eos_ids.begin(), eos_ids.end()};
}

int64_t default_max_context(const ModelConfig& config, int64_t longest_prompt, int64_t max_new_tokens) {
  // Checked here, not only in generate(): a negative count would shrink the cache below the prompt, and the error
  // would blame the cache.
  MK_CHECK(max_new_tokens >= 0, "max new tokens must not be negative, got {}", max_new_tokens);
  const int64_t block = tiles::kDecodeKvBlock;
  int64_t context = (longest_prompt + max_new_tokens + block - 1) / block * block;
  if (config.rope.type != RopeType::kNone) context = std::min(context, config.max_position_embeddings);
  return std::max<int64_t>(context, 1);
}

GenerationMemory generation_memory(const ModelConfig& config, int64_t batch, int64_t prefill_len, int64_t max_context,
                                   bool fp32_activations, int64_t prefill_batch) {
  GenerationMemory memory;
  memory.weights = 2.0 * double(parameter_count(config));
  if (!fp32_activations) memory.weights += folded_lm_head_copy_bytes(config);  // the gpu engine's
  // As the gpu engine stores each kind, or as fp32 where the cpu engines hold every buffer so.
  auto bytes_of = [&](const RunShape& shape) {
    double bytes = 0;
    const BufferTable table(config, shape);
    for (const Buffer& buffer : table.buffers()) {
      if (buffer.kind == BufferKind::kKvCache) continue;
      bytes += fp32_activations ? 4.0 * double(buffer.rows) * double(buffer.cols) : device_bytes(buffer);
    }
    return bytes;
  };
  const int64_t element_bytes = fp32_activations ? 4 : 2;
  memory.kv_cache = kv_cache_bytes(config, batch, max_context, element_bytes);
  memory.activations = bytes_of({batch, 1, PassKind::kDecode, max_context});
  if (prefill_len <= 0) return memory;
  const int64_t per_pass = prefill_batch > 0 ? std::min(prefill_batch, batch) : batch;
  memory.activations += bytes_of({per_pass, prefill_len, PassKind::kPrefill, max_context});
  if (per_pass < batch) memory.activations += kv_cache_bytes(config, per_pass, prefill_len, element_bytes);
  return memory;
}

void check_memory_budget(const GenerationMemory& memory, double budget_bytes, int64_t batch, int64_t max_context,
                         bool prefill_batch_given, const SettingNames& names) {
  const std::string raise_budget = names.memory_budget.empty() ? "" : ", or raise " + names.memory_budget;
  const std::string lower_prefill_batch =
      prefill_batch_given && !names.prefill_batch.empty() ? ", or lower " + names.prefill_batch : "";
  MK_CHECK(memory.total() <= budget_bytes,
           "the KV cache of batch {} x max context {} needs {} (with {} of weights and {} of activations, {} in all), "
           "more than the memory budget of {}: lower {} or {}{}{}",
           batch, max_context, gib(memory.kv_cache), gib(memory.weights), gib(memory.activations), gib(memory.total()),
           gib(budget_bytes), names.max_context, names.batch, raise_budget, lower_prefill_batch);
}

int64_t prefill_batch_within(const ModelConfig& config, int64_t batch, int64_t prefill_len, int64_t max_context,
                             bool fp32_activations, double budget_bytes, double headroom_bytes,
                             const SettingNames& names) {
  auto memory_at = [&](int64_t per_pass) {
    return generation_memory(config, batch, prefill_len, max_context, fp32_activations, per_pass);
  };
  const double target = budget_bytes - headroom_bytes;
  if (memory_at(batch).total() <= target) return batch;
  check_memory_budget(memory_at(1), budget_bytes, batch, max_context, /*prefill_batch_given=*/false, names);
  // The memory grows with the sequences a pass: the most that fit the target, by bisection (batches reach 2^31), then
  // the fewest passes of that many at most, evened out. One a pass where even that misses the target but fits.
  int64_t fits = 1, too_many = batch;
  while (too_many - fits > 1) {
    const int64_t middle = fits + (too_many - fits) / 2;
    (memory_at(middle).total() <= target ? fits : too_many) = middle;
  }
  const int64_t passes = (batch + fits - 1) / fits;
  return (batch + passes - 1) / passes;
}

}  // namespace mk
