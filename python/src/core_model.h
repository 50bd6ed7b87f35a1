// The model behind megakernel.Model: weights, the tokenizer beside them, and the engines built so far, in plain C++
// (the nanobind glue in module.cc only converts arrays and strings).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mk/files.h"
#include "mk/generate.h"
#include "mk/gpu.h"
#include "mk/graph.h"
#include "mk/model_config.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/tokenizer.h"
#include "mk/weights.h"

namespace mk::python {

enum class EngineKind { kReference, kCpuVm, kGpu };
// "auto" is the gpu engine where a usable GPU exists, else the reference (as `mk run`); else "gpu", "cpu-vm" or
// "reference", or an mk::Error listing them.
EngineKind resolve_engine(const std::string& name);
const char* engine_name(EngineKind kind);

// The model's input, checked against the model: token ids (batch, seq_len) with an embedding, hidden states
// (batch, seq_len, d_model) without. Every problem is an mk::Error in mk's words.
RunShape input_shape(const ModelConfig& config, const std::vector<int64_t>& dims);
// ids (batch * seq_len) of type Id, int32_t or int64_t, checked against the vocabulary before narrowing.
template <typename Id>
ref::ModelInput token_input(const ModelConfig& config, const RunShape& shape, const Id* ids);
// hidden (batch * seq, d_model) fp32, rounded to bf16 as `mk run --input` does.
ref::ModelInput hidden_input(const ModelConfig& config, const RunShape& shape, const float* hidden);
int64_t output_cols(const ModelConfig& config);  // vocab_size with an LM head, d_model without

// One generation as megakernel.Model.generate asks for it.
struct GenerateRequest {
  std::string engine = "auto";  // auto: the cpu-vm until the gpu engine can generate (as `mk generate`)
  std::vector<std::vector<int64_t>> prompts;  // Python's ids, checked against the vocabulary by generate()
  std::optional<std::vector<int64_t>> eos_ids;  // the caller's, checked likewise; none: the model's (eos_ids())
  GenerationOptions options;  // its eos_ids are set by generate()
  ref::SamplingParams sampling;
  int64_t max_context = 0;  // 0: the longest prompt plus max_new_tokens, in whole KV blocks
};

class CoreModel {
 public:
  // config.json or mk_config.json and the safetensors of `dir`, and tokenizer.json when it is there.
  static std::unique_ptr<CoreModel> from_dir(const std::filesystem::path& dir);
  // A preset with random weights of `seed` (as `mk run --preset NAME --seed SEED`), shape overrides applied.
  static std::unique_ptr<CoreModel> from_preset(const std::string& name, uint64_t seed,
                                                const ShapeOverrides& overrides);

  const ModelConfig& config() const { return weights_.config; }
  const RunShape& default_shape() const { return default_shape_; }  // the preset's, or 1 x 128 (as `mk info`)
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  const std::string& source() const { return source_; }
  // The ids that end generation: generation_config.json's or config.json's eos_token_id, else the tokenizer's.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // What loading found suspicious (tensors the config leaves unused), for Python to warn with; "" when nothing.
  const std::string& load_warning() const { return load_warning_; }

  // One forward pass from host memory: (batch * seq_len, output_cols) fp32.
  ref::Matrix forward(EngineKind kind, const ref::ModelInput& input);
  // One forward pass of the gpu engine on device memory: `input` in the engine's layout (int32 ids, or bf16 hidden
  // states), `output` (batch * seq_len, output_cols) bf16; the caller has checked the token ids.
  void forward_device(const RunShape& shape, const void* input, void* output);
  // One traced pass of the gpu engine or the cpu-vm: writes the Chrome trace JSON to `path`, returns the summary.
  std::string trace(EngineKind kind, const ref::ModelInput& input, const std::filesystem::path& path);
  // Prefill, then decode steps until EOS, the token budget or the cache's end; on_step after each step. The decoder
  // of the last call is kept for the next one with the same engine, batch, cache size and sampling.
  GenerationResult generate(const GenerateRequest& request, const StepCallback& on_step);
  // Every check generate() makes of a request (the engine, the model, the prompts and EOS ids against the vocabulary,
  // the sampling, the token budget, the cache and its memory) without building or running an engine: for Python's
  // stream(), which checks its arguments when called but generates only when iterated.
  void check_generate(const GenerateRequest& request) const { plan_generation(request); }
  // Drops every cached engine (and the gpu engine's device memory).
  void clear_engines();

 private:
  struct Engine {
    std::unique_ptr<Graph> graph;  // the gpu engine refers to it
    Schedule schedule;
    std::unique_ptr<GpuEngine> gpu;
  };
  // A request checked and settled into what generate() runs.
  struct GenerationPlan {
    std::string engine;  // "gpu", "cpu-vm" or "reference": "auto" resolved
    std::vector<std::vector<int32_t>> prompts;
    GenerationOptions options;
    DecodeSetup setup;
  };
  CoreModel(ModelWeights weights, RunShape default_shape, std::string source);
  // Reads only what loading set, so it needs no lock.
  GenerationPlan plan_generation(const GenerateRequest& request) const;
  // The engine of kind and shape, built on first use. Only one gpu engine is kept: each holds its own copy of the
  // weights on the device, so a new shape replaces the last one instead of doubling the memory.
  Engine& engine(EngineKind kind, const RunShape& shape);
  // body on the engine's GpuEngine; an engine that fails is dropped (a stall leaves it unusable), so that the next
  // call builds a new one.
  void on_gpu(Engine& engine, const std::function<void(GpuEngine&)>& body);

  ModelWeights weights_;
  RunShape default_shape_;
  std::string source_;
  std::optional<Tokenizer> tokenizer_;
  std::mutex mutex_;  // one pass at a time: the engines are not reentrant, and the GIL is released while they run
  std::map<std::tuple<EngineKind, int64_t, int64_t>, std::unique_ptr<Engine>> engines_;
  std::vector<int32_t> eos_ids_;
  std::vector<NamedPath> inputs_;  // the model directory's files, which trace() must not overwrite
  std::string load_warning_;
  std::string decoder_key_;  // what the cached decoder was built for
  std::unique_ptr<DecodeEngine> decoder_;
};

}  // namespace mk::python
