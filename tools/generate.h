// `mk generate`: prompts in, token ids streamed out as each decode step makes them, then the prefill time, the
// per-token latency, tokens/s and the share of the bandwidth floor, and one `tokens:` line per sequence.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/reference.h"
#include "mk/tokenizer.h"

namespace mk::cli {

struct GenerateCommand {
  std::string preset, model_dir;
  std::string tokens_path, prompt_ids, prompt_text;
  std::string engine = "auto", policy = "cost-model", eos, output_path;
  int64_t max_new_tokens = 16, batch = 0, max_context = 0;
  uint64_t weights_seed = 1;
  ref::SamplingParams sampling;
  int32_t num_sms = 132;
  double memory_budget_gib = 0;  // 0: the machine's memory
  double bandwidth_gbs = 4200;

  CLI::App* add(CLI::App& app);
  int run() const;

 private:
  // From --tokens, --prompt-ids or --prompt (which loads `tokenizer`), repeated to --batch when there is one.
  std::vector<std::vector<int32_t>> read_prompts(const ModelConfig& config, std::optional<Tokenizer>& tokenizer) const;
};

}  // namespace mk::cli
