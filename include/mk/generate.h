// Generation: the prompts prefilled into the KV cache, then one token per sequence per decode step until EOS, the
// token budget or the cache's end. A DecodeEngine runs the passes (the reference op by op, the cpu-vm from the
// verified prefill and decode schedules); generate() drives any of them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mk/cpu_vm.h"
#include "mk/gpu.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/weights.h"

namespace mk {

class Tokenizer;

// What every engine of one generation shares: its batch, its cache, how it samples.
struct DecodeSetup {
  int64_t batch = 1;
  int64_t max_context = 0;  // cache positions per sequence
  ref::SamplingParams sampling;
  // cpu-vm: how its schedules are built, and how it runs them
  SchedulePolicy policy = SchedulePolicy::kCostModel;
  int32_t num_sms = 132;
  CpuVmOptions vm;
  // gpu: a counter wait longer than this aborts the step with a report naming it (GpuOptions::stall_timeout_s)
  double stall_timeout_s = kDefaultStallTimeoutS;
  // gpu, a diagnostic: every pass with GpuOptions::skip_dependency_waits; the tokens are not the model's
  bool skip_dependency_waits = false;
};

// One engine per (model, batch, max context): its cache is allocated at construction, its decode schedule (where
// it has one) built and verified once and reused by every step.
class DecodeEngine {
 public:
  virtual ~DecodeEngine() = default;
  // The prefill pass over tokens (n x seq_len, the right-padded prompts of sequences [first_sequence,
  // first_sequence + n)): fills cache rows [0, seq_len) of those sequences. A pass of fewer sequences than the batch
  // goes through a cache of its own, seq_len positions a sequence, then copied into the batch's.
  virtual void prefill(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t first_sequence) = 0;
  // One decode step: sequence b feeds tokens[b] at positions[b] (its cache row); returns each sequence's next token.
  virtual std::vector<int32_t> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) = 0;
  // `count` steps, each sequence feeding the previous step's token at the next position (the first step as step());
  // every step's tokens, step after step. The caller keeps every position below the cache's end. The gpu engine runs
  // greedy steps without the host in between; this default calls step() for each.
  virtual std::vector<std::vector<int32_t>> steps(std::vector<int32_t> tokens, std::vector<int32_t> positions,
                                                  int64_t count);
  // The most steps one call to steps() saves waits for: 1 where it waits for every step anyway.
  virtual int64_t max_steps_per_sync() const { return 1; }
  // (batch, vocab) of the last step the engine ran (of a group, its last, even where generate() discards it)
  virtual const ref::Matrix& logits() const = 0;
  virtual const DecodeSetup& setup() const = 0;
  virtual std::string describe() const = 0;  // the engine and its decode step, for `mk generate`
  // One more decode step, traced: its Perfetto JSON written to `path`; returns the trace summary. Only the gpu
  // engine records traces.
  virtual std::string trace_step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                                 const std::filesystem::path& path);
};

// What a caller's interface calls the settings that a generation's messages say to change: mk generate's flags by
// default; the Python package passes its arguments' names. memory_budget and prefill_batch may be empty: the
// interface has no such setting, and the messages do not suggest it.
struct SettingNames {
  std::string max_context = "--max-context";
  std::string batch = "--batch";
  std::string memory_budget = "--memory-budget";
  std::string prefill_batch = "--prefill-batch";
  ref::SamplingNames sampling{.temperature = "--temperature", .top_k = "--top-k", .top_p = "--top-p"};
};

std::unique_ptr<DecodeEngine> make_reference_decoder(const ModelWeights& weights, const DecodeSetup& setup);
std::unique_ptr<DecodeEngine> make_cpu_vm_decoder(const ModelWeights& weights, const DecodeSetup& setup);
struct GenerationMemory;

// The megakernel: one KV cache on the device, a prefill launch per prompt length, and a decode step schedule built
// and verified once. Greedy sampling runs on the device; with a temperature, the step's logits are sampled on the
// host as the cpu engines sample them. Throws mk::Error with the reason on a build or machine without the GPU.
std::unique_ptr<DecodeEngine> make_gpu_decoder(const ModelWeights& weights, const DecodeSetup& setup);
// Throws mk::Error unless `engine` can generate here: "reference" and "cpu-vm" always can, "gpu" where query_gpu()
// finds a usable GPU (the message gives the reason where not).
void check_decode_engine(const std::string& engine);
// What "auto" means: "gpu" where query_gpu() finds a usable GPU, else "cpu-vm".
std::string resolve_decode_engine(const std::string& engine);
// The memory a generation takes where `engine` keeps it, and how much that place has: the GPU's memory for "gpu",
// else the host's.
GenerationMemory engine_generation_memory(const std::string& engine, const ModelConfig& config, int64_t batch,
                                          int64_t prefill_len, int64_t max_context, int64_t prefill_batch);
// prefill_batch_within for where `engine` keeps a generation; on the GPU with a headroom (kGpuPartHeadroomBytes).
int64_t engine_prefill_batch(const std::string& engine, const ModelConfig& config, int64_t batch, int64_t prefill_len,
                             int64_t max_context, double budget_bytes, const SettingNames& names = {});
double engine_memory_bytes(const std::string& engine, double host_bytes);
// "reference", "cpu-vm" or "gpu"; anything else as check_decode_engine. (In mk_gpu: link it to use this.)
std::unique_ptr<DecodeEngine> make_decoder(const std::string& engine, const ModelWeights& weights,
                                           const DecodeSetup& setup);

enum class StopReason : uint8_t { kEos, kMaxNewTokens, kCacheFull };
const char* stop_reason_text(StopReason reason);  // "EOS", "max new tokens", "the KV cache's end"

// The most decode steps one wait for the engine may cover (GenerationOptions::steps_per_sync).
constexpr int64_t kMaxStepsPerSync = 1024;

struct GenerationOptions {
  int64_t max_new_tokens = 16;
  // At most this many decode steps a wait for the engine, where the engine runs steps without the host
  // (DecodeEngine::max_steps_per_sync): the tokens of such a group reach the caller together, and its time is spread
  // evenly over its steps. 1: a wait every step; at most kMaxStepsPerSync.
  int64_t steps_per_sync = 1;
  std::vector<int32_t> eos_ids;  // a sequence stops once it makes one of these
  bool keep_logits = false;      // keep every step's logits in the result (tests)
  int32_t pad_id = 0;            // fills prefill rows past a shorter prompt; never read
  // Sequences a prefill pass, in passes of equal size but the last: a prefill's activations grow with its tokens
  // (every layer keeps its own), so a large batch of long prompts fits only in parts (prefill_batch_within). 0: the
  // whole batch in one pass.
  int64_t prefill_batch = 0;
};

struct SequenceResult {
  std::vector<int32_t> tokens;  // the prompt, then the generated ids
  int64_t prompt_length = 0;
  StopReason stop = StopReason::kMaxNewTokens;
};

struct GenerationResult {
  std::vector<SequenceResult> sequences;
  double prefill_s = 0;             // the prefill passes (0 when every prompt is one token)
  int64_t prefill_passes = 0;       // of up to GenerationOptions::prefill_batch sequences each
  std::vector<double> step_s;       // each decode step (a group's time spread over its steps: steps_per_sync)
  int64_t waits = 0;                // for the engine, over the decode steps (fewer than steps where grouped)
  std::vector<ref::Matrix> logits;  // (steps) of (batch, vocab), with GenerationOptions::keep_logits
};

// Called after each decode step with the step's new token of each sequence, -1 for sequences that had stopped (once
// its group of steps is back: GenerationOptions::steps_per_sync).
using StepCallback = std::function<void(int64_t step, const std::vector<int32_t>& new_tokens)>;

// Prefill takes every prompt but its last token (right-padded to the longest); each decode step then feeds one token
// per sequence at the sequence's own position, the first step the prompts' last tokens. A sequence that stopped
// keeps feeding its last token at its last position (rewriting the same cache row with the same values), its new
// tokens ignored: the batch is static, one schedule for every step. Up to steps_per_sync steps go to the engine at
// once (DecodeEngine::steps), the same steps as one at a time for the generating sequences; inside them a stopped
// sequence is fed its own ids, into cache rows past its end that nothing reads.
GenerationResult generate(DecodeEngine& engine, const std::vector<std::vector<int32_t>>& prompts,
                          const GenerationOptions& options, const StepCallback& on_step = {});
// What a decode engine's construction checks of its setup against the model (shape, cache, sampling), without
// building one: for callers that reckon the memory of a setup first (a cache past the model's positions is named as
// such, not as too large). The sampling's messages name its settings by `names`; an engine's own check, for callers
// that skip this one, names SamplingParams' fields.
void check_decode_setup(const ModelConfig& config, const DecodeSetup& setup, const SettingNames& names = {});
// What generate() and a decode engine's construction check of a generation, without building an engine: the setup
// against the model (shape, cache, sampling), the prompts against the setup, the options. Throws mk::Error naming the
// problem (and the setting to change by `names`). For callers that take a generation now and run it later (Python's
// Model.stream).
void check_generation(const ModelConfig& config, const std::vector<std::vector<int32_t>>& prompts,
                      const GenerationOptions& options, const DecodeSetup& setup, const SettingNames& names = {});

// The ids that end generation for a Hugging Face model directory: generation_config.json's eos_token_id (an int or
// a list), else config.json's; empty when neither says. Each file is read as config.json is (a regular file of
// bounded size, JSON without duplicate keys), each id must be a whole number in [0, 2^31), and at least one must lie
// in the vocabulary of `config`.
std::vector<int32_t> model_eos_ids(const ModelConfig& config, const std::filesystem::path& model_dir);

// The ids that end generation when the caller names none, for `mk generate` and the Python Model alike:
// model_eos_ids (none without a model_dir), else the tokenizer's (where tokenizer_config.json's eos_token comes in),
// held to the same rule that at least one lie in the vocabulary of `config`, the message naming the tokenizer's source.
// `tokenizer`: the caller's, or nullptr to load model_dir's where Tokenizer::in_model_dir finds one and the configs
// name no EOS, so that `mk generate` of ids, which reads no text, stops where the Python Model does.
std::vector<int32_t> default_eos_ids(const ModelConfig& config, const std::filesystem::path& model_dir,
                                     const Tokenizer* tokenizer);

// Throw mk::Error naming the first empty prompt or id outside the model's vocabulary, before any engine runs: a
// prompt's (by prompt and position, which the engines, seeing a padded batch, cannot name), or a user's EOS id's (which
// no token could match, so that generation would silently never stop at it). `eos_source` says where the EOS ids came
// from. The ids come as int64 from APIs whose integers are wider than a token id (Python's); checked, they fit int32.
void check_prompt_ids(const ModelConfig& config, const std::vector<std::vector<int32_t>>& prompts);
std::vector<std::vector<int32_t>> checked_prompt_ids(const ModelConfig& config,
                                                     const std::vector<std::vector<int64_t>>& prompts);
std::vector<int32_t> checked_eos_ids(const ModelConfig& config, const std::vector<int64_t>& eos_ids,
                                     const std::string& eos_source);

// The cache positions a generation needs: the longest prompt plus the new tokens, rounded up to whole KV blocks,
// capped at the model's max_position_embeddings (RoPE models).
int64_t default_max_context(const ModelConfig& config, int64_t longest_prompt, int64_t max_new_tokens);

// Memory of a generation as an engine allocates it (bf16 on the gpu, fp32 activations and cache on the cpu).
struct GenerationMemory {
  double weights = 0;  // on the gpu with a tied LM head's own copy (fold_norm_weights)
  double kv_cache = 0;
  double activations = 0;  // a prefill pass's and a decode step's buffers, the batch's cache aside
  double total() const { return weights + kv_cache + activations; }
};
// prefill_batch: sequences a prefill pass (0: all); a pass of fewer than the batch adds its own cache.
GenerationMemory generation_memory(const ModelConfig& config, int64_t batch, int64_t prefill_len, int64_t max_context,
                                   bool fp32_activations, int64_t prefill_batch = 0);
// Throws mk::Error, before anything is allocated, when `memory` exceeds budget_bytes, saying what to lower (the
// caller's prefill batch too where it gave one) by `names`.
void check_memory_budget(const GenerationMemory& memory, double budget_bytes, int64_t batch, int64_t max_context,
                         bool prefill_batch_given = false, const SettingNames& names = {});
// The most sequences a prefill pass may take, in the fewest passes of equal size, with the whole generation within
// budget_bytes - headroom_bytes (the batch where one pass fits); one a pass where even that misses it but fits the
// budget; throws as check_memory_budget when not even one sequence a pass fits the budget.
int64_t prefill_batch_within(const ModelConfig& config, int64_t batch, int64_t prefill_len, int64_t max_context,
                             bool fp32_activations, double budget_bytes, double headroom_bytes = 0,
                             const SettingNames& names = {});

}  // namespace mk
