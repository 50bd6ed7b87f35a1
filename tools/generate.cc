// `mk generate`: reads the prompts, checks the cache against the memory budget before allocating anything, runs
// the generation on the chosen engine with the new tokens streamed to stdout (ids or text), then reports times and
// the floor.
#include "generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "guards.h"
#include "mk/check.h"
#include "mk/generate.h"
#include "mk/model_io.h"
#include "mk/program.h"
#include "mk/tokenizer.h"
#include "options.h"
#include "stream.h"

namespace mk::cli {

namespace {

// The q-quantile of `values` by nearest rank.
double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t rank = size_t(std::ceil(q * double(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

// The last decode step again (each sequence's last fed token at its position: the same cache row, the same values),
// traced.
void trace_last_step(DecodeEngine& decoder, const GenerationResult& result, const std::string& path) {
  std::vector<int32_t> tokens, positions;
  for (const SequenceResult& sequence : result.sequences) {
    const bool generated = int64_t(sequence.tokens.size()) > sequence.prompt_length;
    const int64_t fed = int64_t(sequence.tokens.size()) - (generated ? 2 : 1);
    tokens.push_back(sequence.tokens[size_t(fed)]);
    positions.push_back(int32_t(fed));
  }
  const std::string summary = decoder.trace_step(tokens, positions, path);
  fmt::print("{}wrote {}\n", summary, path);
}

std::string time_text(double seconds) {
  return seconds < 1e-3  ? fmt::format("{:.1f} us", seconds * 1e6)
         : seconds < 1.0 ? fmt::format("{:.3f} ms", seconds * 1e3)
                         : fmt::format("{:.3f} s", seconds);
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += fmt::format("{}{}", text.empty() ? "" : " ", id);
  return text;
}

void report(const GenerationResult& result, const ModelConfig& config, const DecodeSetup& setup,
            const GenerationOptions& options, double bandwidth_gbs) {
  std::string stops;
  int64_t generated = 0;
  for (size_t b = 0; b < result.sequences.size(); ++b) {
    const SequenceResult& sequence = result.sequences[b];
    const int64_t made = int64_t(sequence.tokens.size()) - sequence.prompt_length;
    generated += made;
    stops += fmt::format("{}sequence {} at {} ({} new)", b ? "; " : "", b, stop_reason_text(sequence.stop), made);
  }
  fmt::print("stopped: {}\n", stops);
  fmt::print("prefill: {}{}\n", result.prefill_s > 0 ? time_text(result.prefill_s) : "none (one-token prompts)",
             result.prefill_passes > 1 ? fmt::format(" in {} passes of up to {} sequence{} (--prefill-batch)",
                                                     result.prefill_passes, options.prefill_batch,
                                                     options.prefill_batch == 1 ? "" : "s")
                                       : "");
  if (result.step_s.empty()) return;
  double decode_s = 0;
  for (double s : result.step_s) decode_s += s;
  const double p50 = percentile(result.step_s, 0.5);
  fmt::print("decode: {} steps, per-token latency p50 {}, p99 {}; {:.2f} tokens/s ({} tokens)\n", result.step_s.size(),
             time_text(p50), time_text(percentile(result.step_s, 0.99)), double(generated) / decode_s, generated);
  if (result.waits < int64_t(result.step_s.size()))
    fmt::print("steps per wait: {} steps in {} waits for the engine (--steps-per-sync {}): the latencies above are "
               "each group's time spread evenly over its steps\n",
               result.step_s.size(), result.waits, options.steps_per_sync);
  const double weights = forward_cost(config, {setup.batch, 1, PassKind::kDecode, setup.max_context}).weights_read;
  const double floor_s = weights / (bandwidth_gbs * 1e9);
  fmt::print("bandwidth floor: {:.4g} GB of weights per step at {:.0f} GB/s = {}; p50 is {:.3g}% of the floor\n",
             weights / 1e9, bandwidth_gbs, time_text(floor_s), 100.0 * floor_s / p50);
}

}  // namespace

CLI::App* GenerateCommand::add(CLI::App& app) {
  command =
      app.add_subcommand("generate", "generate tokens from prompts: prefill, then one decode step per token");
  auto* preset_option =
      command->add_option("--preset", preset, "built-in model (random weights): tiny, llama-3.2-1b, ...")
          ->check(kNonEmpty);
  auto* model_option =
      command->add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")
          ->check(kNonEmpty);
  preset_option->excludes(model_option);
  CLI::Option_group* source = command->add_option_group("prompts", "where the prompts come from (one of)");
  source->add_option("--tokens", tokens_path, "safetensors with 'tokens' (batch, seq) and optionally 'lengths' (batch)")
      ->check(kNonEmpty);
  source->add_option("--prompt-ids", prompt_ids, "token ids, '1,2,3'; sequences of a batch separated by ';'")
      ->check(kNonEmpty);
  source->add_option("--prompt", prompt_text, "text, tokenized with the model directory's tokenizer.json");
  source->require_option(1);
  command->add_option("--max-new-tokens", max_new_tokens, "new tokens per sequence at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), kMaxTokens));
  command->add_option("--steps-per-sync", steps_per_sync,
                      "at most this many decode steps a wait for the engine, where it feeds greedy steps their "
                      "tokens itself (gpu); 1: a wait every step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), kMaxStepsPerSync));
  command->add_option("--batch", batch, "sequences; one prompt is repeated to fill them (default: the prompts' count)")
      ->check(size_in_range(kMaxTokens));
  command->add_option("--temperature", sampling.temperature, "0: greedy")->capture_default_str()->check(kFloat);
  command->add_option("--top-k", sampling.top_k, "sample from the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(kNonEmpty);
  command->add_option("--top-p", sampling.top_p, "then from the fewest whose probability reaches p")
      ->capture_default_str()
      ->check(kFloat);
  command->add_option("--seed", sampling.seed, "seed of the sampling's random numbers")
      ->capture_default_str()
      ->check(kSeed);
  command
      ->add_option("--max-context", max_context,
                   "KV cache positions per sequence (default: longest prompt + new tokens, rounded up to 128)")
      ->check(size_in_range(kMaxTokens));
  add_stall_timeout_option(*command, stall_timeout_s);
  add_skip_dependency_waits_flag(*command, skip_dependency_waits);
  command
      ->add_option("--prefill-batch", prefill_batch,
                   "sequences a prefill pass (default: as many as the memory budget allows, in passes of equal size)")
      ->check(size_in_range(kMaxTokens));
  command
      ->add_option("--memory-budget", memory_budget_gib,
                   "GiB the generation may allocate (default: the machine's memory)")
      ->check(kPositiveFinite);
  command->add_option("--eos", eos,
                      "ids that end a sequence (default: generation_config.json's or config.json's eos_token_id, "
                      "else the model directory's tokenizer's eos_token, from tokenizer_config.json, as in Python)");
  command->add_option("--trace", trace_path,
                      "gpu: after generating, trace one more decode step (the last token fed again) into this "
                      "Perfetto JSON and print its per-op summary")
      ->check(kNonEmpty);
  command->add_option("--output", output_path, "write the sequences as safetensors: tokens, lengths, prompt_lengths")
      ->check(kNonEmpty);
  command
      ->add_option("--stream", stream,
                   "what stdout shows as tokens are made: text (needs a tokenizer.json), ids, none, or auto: text for "
                   "a --prompt, ids otherwise")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "text", "ids", "none"}));
  command->add_option("--engine", engine, "auto (gpu where there is one, else cpu-vm) | gpu | cpu-vm | reference")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "gpu", "cpu-vm", "reference"}));
  command->add_option("--sms", num_sms, "cpu-vm: SM count to schedule for")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  command->add_option("--policy", policy, "cpu-vm: round-robin | cost-model")
      ->capture_default_str()
      ->check(CLI::IsMember({"round-robin", "cost-model"}));
  command->add_option("--weights-seed", weights_seed, "seed of a preset's random weights")
      ->capture_default_str()
      ->check(kSeed);
  command
      ->add_option("--bandwidth", bandwidth_gbs, "GB/s of the bandwidth floor (default: the H200's measured 4.2 TB/s)")
      ->capture_default_str()
      ->check(kPositiveFinite);
  return command;
}

std::vector<std::vector<int32_t>> GenerateCommand::read_prompts(const ModelConfig& config,
                                                                std::optional<Tokenizer>& tokenizer) const {
  std::vector<std::vector<int32_t>> prompts;
  if (!tokens_path.empty()) {
    prompts = load_prompts(tokens_path, config);
  } else if (!prompt_ids.empty()) {
    std::string rest = prompt_ids;
    for (size_t at; (at = rest.find(';')) != std::string::npos; rest = rest.substr(at + 1))
      prompts.push_back(parse_token_ids(rest.substr(0, at), "--prompt-ids"));
    prompts.push_back(parse_token_ids(rest, "--prompt-ids"));
  } else {
    MK_CHECK(!model_dir.empty(), "--prompt needs --model DIR with a tokenizer.json; with --preset give --prompt-ids");
    tokenizer = Tokenizer::load(model_dir);
    prompts.push_back(tokenizer->encode(prompt_text));
  }
  MK_CHECK(batch == 0 || prompts.size() == 1 || int64_t(prompts.size()) == batch, "--batch {} but {} prompts", batch,
           prompts.size());
  check_prompt_ids(config, prompts);  // before the weights load
  return prompts;
}

StreamKind GenerateCommand::stream_kind(std::optional<Tokenizer>& tokenizer) const {
  if (stream == "none") return StreamKind::kNone;
  if (stream == "ids") return StreamKind::kIds;
  if (stream == "auto") return tokenizer ? StreamKind::kText : StreamKind::kIds;  // a tokenizer: the prompt was text
  if (!tokenizer) {
    MK_CHECK(!model_dir.empty(), "--stream text needs --model DIR with a tokenizer.json");
    tokenizer = Tokenizer::load(model_dir);
  }
  return StreamKind::kText;
}

int GenerateCommand::run() const {
  const std::string engine_name = resolve_decode_engine(engine);
  check_decode_engine(engine_name);  // before anything is loaded
  check_flags_apply(engine_name);
  MK_CHECK(trace_path.empty() || engine_name == "gpu", "--trace applies to --engine gpu");
  ModelOptions model;
  model.preset = preset;
  model.model_dir = model_dir;
  model.seed = weights_seed;
  const ModelConfig config = model.config();
  CommandFiles files;  // checked before any work: the output lands on no input, in a directory that exists
  model.add_inputs(files);
  files.given_input("--tokens", tokens_path);
  files.output("--output", output_path);
  files.output("--trace", trace_path);
  files.check();
  std::optional<Tokenizer> tokenizer;
  std::vector<std::vector<int32_t>> prompts = read_prompts(config, tokenizer);
  const StreamKind kind = stream_kind(tokenizer);
  int64_t longest = 0;
  for (const std::vector<int32_t>& prompt : prompts) longest = std::max<int64_t>(longest, int64_t(prompt.size()));

  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.steps_per_sync = steps_per_sync;
  options.eos_ids = eos_ids(config, tokenizer);
  DecodeSetup setup;
  setup.batch = batch > 0 ? batch : int64_t(prompts.size());
  setup.max_context = max_context > 0 ? max_context : default_max_context(config, longest, max_new_tokens);
  setup.sampling = sampling;
  setup.policy = parse_schedule_policy(policy);
  setup.num_sms = num_sms;
  setup.stall_timeout_s = stall_timeout_s;
  setup.skip_dependency_waits = skip_dependency_waits;
  check_decode_setup(config, setup);  // before the memory: a cache past the model's positions is named as such
  const double budget_bytes = memory_budget_gib > 0
                                  ? memory_budget_gib * double(int64_t(1) << 30)
                                  : engine_memory_bytes(engine_name, double(host_memory_bytes()));
  if (prefill_batch > 0) {
    options.prefill_batch = prefill_batch;
    check_memory_budget(
        engine_generation_memory(engine_name, config, setup.batch, longest - 1, setup.max_context, prefill_batch),
        budget_bytes, setup.batch, setup.max_context, /*prefill_batch_given=*/true);
  } else {
    options.prefill_batch =
        engine_prefill_batch(engine_name, config, setup.batch, longest - 1, setup.max_context, budget_bytes);
  }
  // Repeated only now: --batch copies of a prompt can take more memory than the budget allows.
  if (int64_t(prompts.size()) < setup.batch) prompts.resize(size_t(setup.batch), prompts[0]);

  const ModelWeights weights = model.weights(config);
  const std::unique_ptr<DecodeEngine> decoder = make_decoder(engine_name, weights, setup);
  print_header(config, *decoder, setup, longest, options.eos_ids);
  StepStream streamer(kind, prompts, tokenizer ? &*tokenizer : nullptr);
  const GenerationResult result =
      generate(*decoder, prompts, options,
               [&](int64_t step, const std::vector<int32_t>& made) { streamer.step(step, made); });
  streamer.finish();
  report(result, config, setup, options, bandwidth_gbs);
  print_sequences(result, tokenizer);
  if (!trace_path.empty()) trace_last_step(*decoder, result, trace_path);
  return 0;
}

void GenerateCommand::check_flags_apply(const std::string& engine_name) const {
  check_engine_flags(*command, engine_name, engine == "auto",
                     {{"--sms", {"cpu-vm"}},
                      {"--policy", {"cpu-vm"}},
                      {"--stall-timeout", {"gpu"}},
                      {"--skip-dependency-waits", {"gpu"}}});
  check_no_output_when_skipping_waits(skip_dependency_waits, output_path);
  if (command->count("--weights-seed") > 0 && !model_dir.empty())
    throw UsageError("--weights-seed has nothing to seed: --model gives the weights");
  if (sampling.temperature != 0) return;
  for (const char* flag : {"--seed", "--top-k", "--top-p"}) {
    if (command->count(flag) > 0)
      throw UsageError(fmt::format("{} applies to sampling, and --temperature 0 is greedy: give a temperature", flag));
  }
}

std::vector<int32_t> GenerateCommand::eos_ids(const ModelConfig& config,
                                              const std::optional<Tokenizer>& tokenizer) const {
  if (!eos.empty()) {
    const std::vector<int32_t> ids = parse_token_ids(eos, "--eos");
    return checked_eos_ids(config, {ids.begin(), ids.end()}, "--eos");
  }
  return default_eos_ids(config, model_dir, tokenizer ? &*tokenizer : nullptr);
}

void GenerateCommand::print_header(const ModelConfig& config, const DecodeEngine& decoder, const DecodeSetup& setup,
                                   int64_t longest, const std::vector<int32_t>& eos_ids) const {
  fmt::print("{}\n{}\n", describe(config), decoder.describe());
  fmt::print("batch {}, max context {}, longest prompt {}, {}; EOS {}\n", setup.batch, setup.max_context, longest,
             sampling.temperature == 0 ? std::string("greedy")
                                       : fmt::format("temperature {} top-k {} top-p {} seed {}", sampling.temperature,
                                                     sampling.top_k, sampling.top_p, sampling.seed),
             eos_ids.empty() ? std::string("none") : ids_text(eos_ids));
  if (skip_dependency_waits)
    fmt::print("--skip-dependency-waits: every pass skips its waits on other SMs; the tokens are not the model's\n");
}

void GenerateCommand::print_sequences(const GenerationResult& result, const std::optional<Tokenizer>& tokenizer) const {
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> prompt_lengths;
  for (const SequenceResult& sequence : result.sequences) {
    sequences.push_back(sequence.tokens);
    prompt_lengths.push_back(int32_t(sequence.prompt_length));
    if (tokenizer) fmt::print("text: {}\n", tokenizer->decode(sequence.tokens));
  }
  if (!output_path.empty()) {
    save_sequences(output_path, sequences, prompt_lengths);
    fmt::print("wrote {}\n", output_path);
  }
  for (const std::vector<int32_t>& sequence : sequences) fmt::print("tokens: {}\n", ids_text(sequence));
}

}  // namespace mk::cli
