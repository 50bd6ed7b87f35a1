// `mk generate`: prompts in, the new tokens streamed out (ids or text) as each decode step makes them, then the
// prefill time, the per-token latency, tokens/s and the share of the bandwidth floor, and one `tokens:` line per
// sequence.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/generate.h"
#include "mk/reference.h"
#include "mk/tokenizer.h"
#include "stream.h"

namespace mk::cli {

struct GenerateCommand {
  std::string preset, model_dir;
  std::string tokens_path, prompt_ids, prompt_text;
  std::string engine = "auto", policy = "cost-model", eos, output_path, stream = "auto", trace_path;
  int64_t max_new_tokens = 16, batch = 0, max_context = 0, steps_per_sync = 8, prefill_batch = 0;
  uint64_t weights_seed = 1;
  ref::SamplingParams sampling;
  int32_t num_sms = 132;
  double memory_budget_gib = 0;  // 0: the machine's memory
  double bandwidth_gbs = 4200;
  double stall_timeout_s = kDefaultStallTimeoutS;
  bool skip_dependency_waits = false;

  CLI::App* command = nullptr;  // add()'s, for which flags were given

  CLI::App* add(CLI::App& app);
  int run() const;

 private:
  // From --tokens, --prompt-ids or --prompt (which loads `tokenizer`); one prompt with --batch is repeated by run(),
  // once the memory budget allows it.
  std::vector<std::vector<int32_t>> read_prompts(const ModelConfig& config, std::optional<Tokenizer>& tokenizer) const;
  // --stream resolved: auto is text when read_prompts loaded a tokenizer (a text prompt), ids otherwise; text loads
  // the model directory's tokenizer when the prompts were ids.
  StreamKind stream_kind(std::optional<Tokenizer>& tokenizer) const;
  // Usage errors for flags this run would ignore: the cpu-vm's schedule flags on another engine, --weights-seed with
  // --model's weights, the sampling flags when greedy.
  void check_flags_apply(const std::string& engine_name) const;
  // --eos (each inside the vocabulary: a typo would never stop a sequence), else the model directory's, else the
  // tokenizer's (as transformers, an id of theirs outside the vocabulary is let be: no token matches it).
  std::vector<int32_t> eos_ids(const ModelConfig& config, const std::optional<Tokenizer>& tokenizer) const;
  void print_header(const ModelConfig& config, const DecodeEngine& decoder, const DecodeSetup& setup, int64_t longest,
                    const std::vector<int32_t>& eos_ids) const;
  // The `text:` lines (with a tokenizer), the --output file, then the `tokens:` lines, last for scripts.
  void print_sequences(const GenerationResult& result, const std::optional<Tokenizer>& tokenizer) const;
};

}  // namespace mk::cli
