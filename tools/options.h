// The options mk's subcommands share: which model and token batch (ModelOptions), and how the schedule is built or
// loaded (ScheduleOptions).
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "guards.h"
#include "mk/check.h"
#include "mk/gpu.h"
#include "mk/graph.h"
#include "mk/model_config.h"
#include "mk/schedule.h"
#include "mk/tiles.h"
#include "mk/weights.h"

namespace mk::cli {

// Token ids separated by commas or spaces ("1,2,3"); `what` names the option in errors.
inline std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::string list = text;
  std::replace(list.begin(), list.end(), ',', ' ');
  std::istringstream words(list);
  for (std::string word; words >> word;) {
    int32_t id = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), id);
    MK_CHECK(error == std::errc() && end == word.data() + word.size(), "{}: \"{}\" is not a token id", what, word);
    ids.push_back(id);
  }
  return ids;
}

// A validator refusing "": an empty path or name would otherwise read as "not given" and fall back to a default.
inline const CLI::Validator kNonEmpty(
    [](std::string& text) { return text.empty() ? std::string("must not be empty") : std::string(); }, "NONEMPTY");

// `text`, all of it, as a real number of type Real into `value`: "" when it is one, else why not ("not a number", or
// out of Real's range, which `range` words). CLI11's own parse reads "" as 0 and rounds what Real cannot hold.
template <typename Real>
std::string parse_real(const std::string& text, Real& value, const char* range) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool whole_text = end == text.data() + text.size();
  if (error == std::errc::result_out_of_range && whole_text)
    return fmt::format("out of range ({}), got {}", range, text);
  if (error != std::errc() || !whole_text) return fmt::format("not a number: {}", text);
  return std::string();
}

// A positive, finite real number. CLI::PositiveNumber lets "nan" through and words its range with DBL_MAX in full.
inline const CLI::Validator kPositiveFinite(
    [](std::string& text) {
      double value = 0;
      std::string why_not = parse_real(text, value, "a double holds about 1e-308 to 1e308");
      if (why_not.empty() && (!std::isfinite(value) || value <= 0))
        why_not = fmt::format("must be a positive finite number, got {}", text);
      return why_not;
    },
    "POSITIVE");

// A real number held in a float (the sampling flags). CLI11 alone reads "" as 0, and rounds 1e-320 to 0 and 1e39 to
// inf, so that a temperature given would silently be greedy; the range is the engine's to check.
inline const CLI::Validator kFloat(
    [](std::string& text) {
      float value = 0;
      return parse_real(text, value, "a float holds about 1e-45 to 3e38");
    },
    "");

// --stall-timeout of the gpu engine's commands: a counter wait longer than this aborts the launch with a report
// naming it, never a hang. Raised for runs under compute-sanitizer, whose racecheck slows a decode step to seconds.
inline void add_stall_timeout_option(CLI::App& command, double& seconds) {
  command
      .add_option("--stall-timeout", seconds,
                  "gpu: seconds a wait may take before the launch is aborted and the wait reported")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            double value = 0;
            const bool number = parse_real(text, value, "").empty();
            if (number && value >= mk::kMinStallTimeoutS && value <= mk::kMaxStallTimeoutS) return std::string();
            return fmt::format("must be a number of seconds in [{}, {}], got {}", mk::kMinStallTimeoutS,
                               mk::kMaxStallTimeoutS, text);
          },
          "SECONDS"));
}

// --skip-dependency-waits of the gpu engine's commands (GpuOptions::skip_dependency_waits): a diagnostic that times
// the launches with every wait on another SM's counter passing at once; their output is not the model's.
inline void add_skip_dependency_waits_flag(CLI::App& command, bool& skip) {
  command.add_flag("--skip-dependency-waits", skip,
                   "gpu, a diagnostic: every wait on another SM's counter passes at once, so that the time shows what "
                   "the dependency waits cost; the output is not the model's (no checksum, no --output)");
}

// The output of a run with --skip-dependency-waits is not the model's: it is not written over a user's file.
inline void check_no_output_when_skipping_waits(bool skip, const std::string& output_path) {
  if (skip && !output_path.empty())
    throw UsageError("--output with --skip-dependency-waits: that output is not the model's; time the run without "
                     "--output");
}

// A seed: a whole number in [0, 2^64). CLI11 alone takes both -1 and 99999999999999999999 as 2^64 - 1, so that
// different seeds given would silently be one.
inline const CLI::Validator kSeed(
    [](std::string& text) {
      uint64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error == std::errc::result_out_of_range) return fmt::format("must be below 2^64, got {}", text);
      if (error != std::errc() || end != text.data() + text.size())
        return fmt::format("must be a whole number from 0, got {}", text);
      return std::string();
    },
    "SEED");

// A size flag: a whole number in [1, max]. 0 stands for "not given" internally, so a given size must be positive.
inline CLI::Validator size_in_range(int64_t max) {
  return CLI::Validator(
      [max](std::string& text) {
        int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error == std::errc::result_out_of_range) return fmt::format("out of range: {}", text);
        if (error != std::errc() || end != text.data() + text.size()) return fmt::format("not a number: {}", text);
        if (value <= 0) return fmt::format("must be positive, got {}", text);
        if (value > max) return fmt::format("must be at most {}, got {}", max, text);
        return std::string();
      },
      fmt::format("1..{}", max));
}

// Which model and which token batch a subcommand works on.
struct ModelOptions {
  std::string preset;
  std::string model_dir;
  int64_t batch = 0;  // 0: the preset's default (1 for --model)
  int64_t seq_len = 0;
  uint64_t seed = 1;
  mk::ShapeOverrides overrides;  // for sweeps; see ShapeOverrides
  // A decode step of --batch sequences instead of a forward pass (`mk info`, `mk schedule`: add_pass_to).
  bool decode = false;
  int64_t max_context = 0;  // 0: --seq rounded up to whole KV blocks

  void add_to(CLI::App& command) {
    auto* preset_option =
        command.add_option("--preset", preset, "built-in model: seed, tiny, llama-3.2-1b, llama-3.1-8b")
            ->check(kNonEmpty);
    auto* model_option =
        command.add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")
            ->check(kNonEmpty);
    preset_option->excludes(model_option);
    const CLI::Validator tokens = size_in_range(mk::kMaxTokens), columns = size_in_range(mk::kMaxColumns);
    command.add_option("--batch", batch, "sequences per forward pass (default: the preset's)")->check(tokens);
    command.add_option("--seq", seq_len, "tokens per sequence (default: the preset's)")->check(tokens);
    command.add_option("--seed", seed, "seed of random weights and inputs")->capture_default_str()->check(kSeed);
    // Shape overrides change a preset: with --model they would be ignored.
    model_option->excludes(command.add_option("--layers", overrides.layers, "override the preset's layer count")
                               ->check(size_in_range(mk::kMaxLayers)));
    model_option->excludes(command
                               .add_option("--d-model", overrides.d_model,
                                           "override the preset's width (heads = d_model / head_dim, d_ff = 4 d_model)")
                               ->check(columns));
    model_option->excludes(
        command.add_option("--heads", overrides.heads, "override the preset's query heads")->check(columns));
    model_option->excludes(
        command.add_option("--kv-heads", overrides.kv_heads, "override the preset's kv heads")->check(columns));
    model_option->excludes(
        command.add_option("--d-ff", overrides.d_ff, "override the preset's MLP width")->check(columns));
  }

  // The files of --model, which no output may overwrite: those mk reads (generate reads the generation and tokenizer
  // configs too) and the weights.
  void add_inputs(CommandFiles& files) const {
    if (model_dir.empty()) return;
    for (const std::filesystem::path& file : mk::model_dir_files(model_dir))
      files.input(fmt::format("--model {}'s {}", model_dir, file.filename().string()), file.string());
  }

  void add_pass_to(CLI::App& command) {
    command.add_flag("--decode", decode,
                     "a decode step of --batch sequences (one token each) instead of a forward pass");
    command.add_option("--max-context", max_context, "--decode: KV cache positions (default: --seq rounded up to 128)")
        ->check(size_in_range(mk::kMaxTokens));
  }

  mk::ModelConfig config() const {
    if (!model_dir.empty()) {
      MK_CHECK(!overrides.any(), "shape overrides apply to presets only, not to --model");
      return mk::load_model_dir_config(model_dir);
    }
    const std::string name = preset.empty() ? "seed" : preset;
    const int64_t head_dim = mk::find_preset(name).config.head_dim;
    if (overrides.d_model != 0 && overrides.heads == 0 && overrides.d_model % head_dim != 0)
      throw UsageError(fmt::format("--d-model {} is not a multiple of the {} preset's head_dim {}, so heads = "
                                   "d_model / head_dim is not whole: give a multiple of {}, or --heads too",
                                   overrides.d_model, name, head_dim, head_dim));
    return mk::preset_config(name, overrides);
  }

  mk::RunShape shape() const {
    mk::RunShape result{1, 128};
    if (model_dir.empty()) result = mk::find_preset(preset.empty() ? "seed" : preset).shape;
    if (batch != 0) result.batch = batch;
    if (seq_len != 0) result.seq_len = seq_len;
    if (!decode && max_context != 0) throw UsageError("--max-context describes the KV cache of a --decode step");
    if (decode) {
      const int64_t block = mk::tiles::kDecodeKvBlock;
      const int64_t context = max_context > 0 ? max_context : (result.seq_len + block - 1) / block * block;
      result = {result.batch, 1, mk::PassKind::kDecode, context};
    }
    result.validate();
    return result;
  }

  mk::ModelWeights weights(const mk::ModelConfig& config) const {
    if (model_dir.empty()) return mk::random_weights(config, seed);
    mk::ModelWeights weights = mk::load_weights(model_dir, config);
    if (const std::string warning = mk::unused_tensors_warning(model_dir, weights); !warning.empty())
      fmt::print(stderr, "warning: {}\n", warning);
    return weights;
  }
};

// How a schedule is built (or loaded) for the cpu-vm and gpu engines.
struct ScheduleOptions {
  int32_t num_sms = 132;
  bool sms_given = false;
  std::string policy = "cost-model";
  std::string schedule_file;

  void add_to(CLI::App& command) {
    command
        .add_option_function<int32_t>(
            "--sms",
            [this](int32_t n) {
              num_sms = n;
              sms_given = true;
            },
            "SM count to schedule for (default 132; gpu: the device's)")
        ->check(CLI::Range(1, 4096));
    auto* policy_option = command.add_option("--policy", policy, "round-robin | cost-model")
                              ->capture_default_str()
                              ->check(CLI::IsMember({"round-robin", "cost-model"}));
    // A schedule file fixes its SM count and policy: --sms and --policy would be ignored.
    command.add_option("--schedule", schedule_file, "use a schedule file written by `mk schedule --out`")
        ->check(kNonEmpty)
        ->excludes(command.get_option("--sms"))
        ->excludes(policy_option);
  }

  void add_inputs(CommandFiles& files) const { files.given_input("--schedule", schedule_file); }

  // The gpu engine schedules for the device's SMs unless --sms says otherwise.
  void use_device_sm_count() {
    const mk::GpuInfo gpu = mk::query_gpu();
    MK_CHECK(gpu.usable, "gpu engine: {}", gpu.reason);
    if (!sms_given) num_sms = gpu.sm_count;
  }

  // Builds the schedule, or loads it and checks it was built for this model and shape; verified either way.
  mk::Schedule make(const mk::Graph& graph) const {
    mk::Schedule schedule;
    if (!schedule_file.empty()) {
      schedule = mk::load_schedule(schedule_file, graph).schedule;  // refuses another shape, model or task count
    } else {
      schedule = mk::make_schedule(graph, mk::derive_dependencies(graph), mk::parse_schedule_policy(policy), num_sms);
    }
    mk::verify_schedule(graph, schedule);
    return schedule;
  }
};

}  // namespace mk::cli
