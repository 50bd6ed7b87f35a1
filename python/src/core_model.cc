// The model behind megakernel.Model: loading, input checks, the engine cache and the passes.
#include "core_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "mk/check.h"
#include "mk/cpu_vm.h"
#include "mk/limits.h"
#include "mk/trace.h"

namespace mk::python {

namespace {

constexpr int32_t kCpuVmSms = 132;  // `mk run`'s default: the H100/H200 SM count

// The settings a generation's messages say to change, as Model.generate names them, not by mk generate's flags. It
// has no batch (its prompts are the batch), memory budget (the machine's memory is) or prefill batch (the budget
// chooses it).
const SettingNames kPythonNames{.max_context = "max_context",
                                .batch = "the number of prompts",
                                .memory_budget = "",
                                .prefill_batch = "",
                                .sampling = {.temperature = "temperature", .top_k = "top_k", .top_p = "top_p"}};

}  // namespace

EngineKind resolve_engine(const std::string& name) {
  if (name == "auto") return query_gpu().usable ? EngineKind::kGpu : EngineKind::kReference;
  if (name == "gpu") return EngineKind::kGpu;
  if (name == "cpu-vm") return EngineKind::kCpuVm;
  if (name == "reference") return EngineKind::kReference;
  throw Error(fmt::format("unknown engine '{}' (available: auto, gpu, cpu-vm, reference)", name));
}

const char* engine_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::kGpu:
      return "gpu";
    case EngineKind::kCpuVm:
      return "cpu-vm";
    case EngineKind::kReference:
      break;
  }
  return "reference";
}

RunShape input_shape(const ModelConfig& config, const std::vector<int64_t>& dims) {
  if (config.has_embedding) {
    MK_CHECK(dims.size() == 2, "model '{}' takes token ids of shape (batch, seq_len), got shape ({})", config.name,
             fmt::join(dims, ", "));
  } else {
    MK_CHECK(dims.size() == 3 && dims[2] == config.d_model,
             "model '{}' has no embedding: it takes hidden states of shape (batch, seq_len, {}), got shape ({})",
             config.name, config.d_model, fmt::join(dims, ", "));
  }
  MK_CHECK(dims[0] > 0 && dims[1] > 0, "batch ({}) and sequence length ({}) must be positive", dims[0], dims[1]);
  return {dims[0], dims[1]};
}

template <typename Id>
ref::ModelInput token_input(const ModelConfig& config, const RunShape& shape, const Id* ids) {
  ref::ModelInput input;
  input.shape = shape;
  input.tokens.resize(size_t(shape.tokens()));
  for (size_t i = 0; i < input.tokens.size(); ++i) {
    // Checked before narrowing, so that an int64 id of 2^32 + 5 is not taken for 5.
    MK_CHECK(ids[i] >= 0 && int64_t(ids[i]) < config.vocab_size,
             "token id {} at position {} is outside the vocabulary [0, {})", int64_t(ids[i]), i, config.vocab_size);
    input.tokens[i] = int32_t(ids[i]);
  }
  ref::validate_input(config, input);
  return input;
}
template ref::ModelInput token_input<int32_t>(const ModelConfig&, const RunShape&, const int32_t*);
template ref::ModelInput token_input<int64_t>(const ModelConfig&, const RunShape&, const int64_t*);

ref::ModelInput hidden_input(const ModelConfig& config, const RunShape& shape, const float* hidden) {
  ref::ModelInput input;
  input.shape = shape;
  input.hidden = ref::Matrix(shape.tokens(), config.d_model);
  for (size_t i = 0; i < input.hidden.data.size(); ++i) input.hidden.data[i] = round_to_bf16(hidden[i]);
  ref::validate_input(config, input);
  return input;
}

int64_t output_cols(const ModelConfig& config) { return config.has_lm_head ? config.vocab_size : config.d_model; }

CoreModel::CoreModel(ModelWeights weights, RunShape default_shape, std::string source)
    : weights_(std::move(weights)), default_shape_(default_shape), source_(std::move(source)) {}

std::unique_ptr<CoreModel> CoreModel::from_dir(const std::filesystem::path& dir) {
  MK_CHECK(std::filesystem::is_directory(dir), "{}: no such model directory", dir.string());
  const ModelConfig config = load_model_dir_config(dir);
  // The tokenizer first: a bad tokenizer file is named in a moment, not after the weights' load.
  std::optional<Tokenizer> tokenizer;
  if (Tokenizer::in_model_dir(dir)) tokenizer.emplace(Tokenizer::load(dir));
  std::unique_ptr<CoreModel> model(new CoreModel(load_weights(dir, config), {1, 128}, dir.string()));
  model->tokenizer_ = std::move(tokenizer);
  model->eos_ids_ = default_eos_ids(config, dir, model->tokenizer_ ? &*model->tokenizer_ : nullptr);
  model->load_warning_ = unused_tensors_warning(dir, model->weights_);
  for (const std::filesystem::path& file : model_dir_files(dir))
    model->inputs_.push_back({fmt::format("model file {}", file.filename().string()), file});
  return model;
}

std::unique_ptr<CoreModel> CoreModel::from_preset(const std::string& name, uint64_t seed,
                                                  const ShapeOverrides& overrides) {
  const ModelConfig config = preset_config(name, overrides);
  return std::unique_ptr<CoreModel>(
      new CoreModel(random_weights(config, seed), find_preset(name).shape, fmt::format("preset {}", name)));
}

CoreModel::Engine& CoreModel::engine(EngineKind kind, const RunShape& shape) {
  const auto key = std::make_tuple(kind, shape.batch, shape.seq_len);
  if (auto found = engines_.find(key); found != engines_.end()) return *found->second;
  if (kind == EngineKind::kGpu) std::erase_if(engines_, [](const auto& entry) { return entry.second->gpu != nullptr; });
  auto engine = std::make_unique<Engine>();
  engine->graph = std::make_unique<Graph>(config(), shape);
  int32_t num_sms = kCpuVmSms;
  if (kind == EngineKind::kGpu) {
    const GpuInfo gpu = query_gpu();
    MK_CHECK(gpu.usable, "gpu engine: {}", gpu.reason);
    num_sms = gpu.sm_count;
  }
  const Graph& graph = *engine->graph;
  engine->schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, num_sms);
  verify_schedule(graph, engine->schedule);
  if (kind == EngineKind::kGpu) {
    engine->gpu = std::make_unique<GpuEngine>(graph, engine->schedule, weights_, GpuOptions{.verify = false});
  }
  return *engines_.emplace(key, std::move(engine)).first->second;
}

void CoreModel::on_gpu(Engine& engine, const std::function<void(GpuEngine&)>& body) {
  try {
    body(*engine.gpu);
  } catch (...) {
    std::erase_if(engines_, [&](const auto& entry) { return entry.second.get() == &engine; });
    throw;
  }
}

ref::Matrix CoreModel::forward(EngineKind kind, const ref::ModelInput& input) {
  const std::lock_guard lock(mutex_);
  ref::validate_input(config(), input);
  if (kind == EngineKind::kReference) return ref::forward(weights_, input);
  Engine& e = engine(kind, input.shape);
  if (kind == EngineKind::kCpuVm) {
    return std::move(
        run_cpu_vm_unverified(*e.graph, e.schedule, weights_, input, {}).buffers[e.graph->output_buffer()]);
  }
  ref::Matrix output;
  on_gpu(e, [&](GpuEngine& gpu) {
    gpu.set_input(input);
    gpu.run();
    output = gpu.output();
  });
  return output;
}

void CoreModel::forward_device(const RunShape& shape, const void* input, void* output) {
  const std::lock_guard lock(mutex_);
  on_gpu(engine(EngineKind::kGpu, shape), [&](GpuEngine& gpu) {
    gpu.set_input_device(input);
    gpu.run();
    gpu.copy_output_to_device(output);
  });
}

std::string CoreModel::trace(EngineKind kind, const ref::ModelInput& input, const std::filesystem::path& path) {
  const std::lock_guard lock(mutex_);
  MK_CHECK(kind != EngineKind::kReference, "trace: the reference engine runs no schedule; use gpu or cpu-vm");
  // Checked before the pass, as mk checks its outputs: a trace written over the weights destroyed them.
  const NamedPath output{"trace path", path};
  check_output_path(output);
  check_distinct({output}, inputs_);
  ref::validate_input(config(), input);
  Engine& e = engine(kind, input.shape);
  Trace trace;
  if (kind == EngineKind::kGpu) {
    on_gpu(e, [&](GpuEngine& gpu) {
      gpu.set_input(input);
      gpu.run();  // warm-up: module load and first-touch costs stay out of the trace
      trace = gpu.run_traced();
    });
  } else {
    CpuVmOptions options;
    options.record_trace = true;
    options.detect_races = false;  // the detector's bookkeeping would dominate the timeline
    trace = run_cpu_vm_unverified(*e.graph, e.schedule, weights_, input, options).trace;
  }
  write_file(path, trace_to_chrome_json(*e.graph, trace));
  return format_trace_summary(*e.graph, summarize_trace(*e.graph, e.schedule, trace), trace);
}

CoreModel::GenerationPlan CoreModel::plan_generation(const GenerateRequest& request) const {
  GenerationPlan plan;
  plan.engine = resolve_decode_engine(request.engine);
  check_decode_engine(plan.engine);
  const ModelConfig& c = config();
  MK_CHECK(c.has_embedding && c.has_lm_head, "model '{}' cannot generate: it has no {}", c.name,
           c.has_embedding ? "LM head" : "embedding");
  MK_CHECK(!request.prompts.empty(), "generate: no prompts");
  plan.prompts = checked_prompt_ids(c, request.prompts);
  plan.options = request.options;
  plan.options.eos_ids = request.eos_ids ? checked_eos_ids(c, *request.eos_ids, "eos_ids") : eos_ids_;
  int64_t longest = 0;
  for (const std::vector<int32_t>& prompt : plan.prompts) longest = std::max<int64_t>(longest, int64_t(prompt.size()));
  DecodeSetup& setup = plan.setup;
  setup.batch = int64_t(request.prompts.size());
  setup.max_context =
      request.max_context > 0 ? request.max_context : default_max_context(c, longest, request.options.max_new_tokens);
  setup.sampling = request.sampling;
  // Before the memory is reckoned: a cache past the model's positions is named as such, not as too large.
  check_generation(c, plan.prompts, plan.options, setup, kPythonNames);
  // Each call: its prompts set the prefill's length, so how many sequences a prefill pass takes.
  plan.options.prefill_batch =
      engine_prefill_batch(plan.engine, c, setup.batch, longest - 1, setup.max_context,
                           engine_memory_bytes(plan.engine, double(host_memory_bytes())), kPythonNames);
  return plan;
}

GenerationResult CoreModel::generate(const GenerateRequest& request, const StepCallback& on_step) {
  const std::lock_guard lock(mutex_);
  const GenerationPlan plan = plan_generation(request);
  const DecodeSetup& setup = plan.setup;
  const std::string key =
      fmt::format("{} {} {} {} {} {} {}", plan.engine, setup.batch, setup.max_context, setup.sampling.temperature,
                  setup.sampling.top_k, setup.sampling.top_p, setup.sampling.seed);
  if (decoder_ == nullptr || key != decoder_key_) {
    decoder_.reset();  // its cache goes before the next one is allocated
    decoder_ = make_decoder(plan.engine, weights_, setup);
    decoder_key_ = key;
  }
  return mk::generate(*decoder_, plan.prompts, plan.options, on_step);
}

void CoreModel::clear_engines() {
  const std::lock_guard lock(mutex_);
  engines_.clear();
  decoder_.reset();
}

}  // namespace mk::python
