// The gpu decoder: one KV cache on the device, shared by a prefill engine (built for each prompt length) and the
// decode engine, whose step schedule is built and verified once and launched every step.
#include <fmt/format.h>

#include "../generate/decode_inputs.h"
#include "device_memory.h"
#include "mk/generate.h"
#include "mk/gpu.h"
#include "mk/files.h"
#include "mk/graph.h"
#include "mk/trace.h"

namespace mk {

namespace {

using namespace decode_inputs;

// The GpuEngine each schedule goes to verifies it (GpuOptions::verify).
Schedule schedule_of(const Graph& graph, const DecodeSetup& setup, int32_t sm_count) {
  return make_schedule(graph, derive_dependencies(graph), setup.policy, sm_count);
}

// The decode step's shape on this GPU: a phase's tiles one round of its SMs (H100 PCIe: 114, not the H200's 132).
RunShape gpu_decode_shape(const DecodeSetup& setup, int32_t sm_count) {
  RunShape shape = decode_shape(setup);
  shape.decode_spread = sm_count;
  return shape;
}

// Every layer's cache, stacked as the pass's buffer table stacks kv_cache.
void* allocate_cache(gpu::DeviceArena& arena, const Graph& graph) {
  const int64_t elements = graph.buffer_table().kind_elements(BufferKind::kKvCache);
  return arena.allocate_bytes(size_t(elements) * sizeof(bf16), "allocating the KV cache");
}

class GpuDecoder final : public DecodeEngine {
 public:
  GpuDecoder(const ModelWeights& weights, const DecodeSetup& setup)
      : weights_(weights),
        setup_(checked(weights.config, setup)),
        sm_count_(query_gpu().sm_count),
        decode_graph_(weights.config, gpu_decode_shape(setup, sm_count_)),
        decode_schedule_(schedule_of(decode_graph_, setup_, sm_count_)),
        cache_(allocate_cache(cache_arena_, decode_graph_)),
        decode_(decode_graph_, decode_schedule_, weights, options()) {}

  void prefill(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t first_sequence) override {
    const ref::ModelInput input = prefill_input(setup_, tokens, seq_len, first_sequence);
    const Graph graph(weights_.config, input.shape);
    const Schedule schedule = schedule_of(graph, setup_, sm_count_);
    GpuOptions prefill_options = options();
    prefill_options.weights_of = &decode_;  // its RoPE table covers the whole cache
    gpu::DeviceArena part_arena;  // a part of the batch: its own cache, freed once copied
    const bool part = !whole_batch(setup_, input.shape);
    if (part) prefill_options.kv_cache = allocate_cache(part_arena, graph);
    {
      GpuEngine engine(graph, schedule, weights_, prefill_options);
      engine.set_input(input);
      engine.run();
    }
    if (part) copy_part_cache(prefill_options.kv_cache, input.shape, first_sequence);
  }

  std::vector<int32_t> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) override {
    const ref::ModelInput input = decode_input(tokens, positions);
    decode_.set_input(input);
    logits_stale_ = true;
    if (setup_.sampling.temperature == 0.0f) return decode_.run_steps_and_read_sampled(1);
    decode_.run();
    // With a temperature: drawn on the host from the step's logits, exactly as the cpu engines draw.
    const ref::Matrix& all = logits();
    std::vector<int32_t> ids;
    for (int64_t b = 0; b < setup_.batch; ++b) {
      const float uniform = ref::sampling_uniform(setup_.sampling.seed, b, positions[size_t(b)]);
      ids.push_back(ref::sample_token(all.row(b), all.cols, setup_.sampling, uniform));
    }
    return ids;
  }

  std::vector<std::vector<int32_t>> steps(std::vector<int32_t> tokens, std::vector<int32_t> positions,
                                          int64_t count) override {
    if (count == 1) return DecodeEngine::steps(std::move(tokens), std::move(positions), count);
    MK_CHECK(count <= max_steps_per_sync(), "internal error: {} steps in one wait, the engine runs at most {}", count,
             max_steps_per_sync());
    for (const int32_t position : positions)
      MK_CHECK(position + count <= setup_.max_context,
               "internal error: {} steps from position {} pass the KV cache's {} positions", count, position,
               setup_.max_context);
    decode_.set_input(decode_input(tokens, positions));
    logits_stale_ = true;
    const std::vector<int32_t> ids = decode_.run_steps_and_read_sampled(int(count));
    const int64_t batch = setup_.batch;
    std::vector<std::vector<int32_t>> made;
    for (int64_t i = 0; i < count; ++i) made.emplace_back(ids.begin() + i * batch, ids.begin() + (i + 1) * batch);
    return made;
  }

  // Greedy steps follow one another on the device (the sampled ids are there); a temperature samples on the host.
  int64_t max_steps_per_sync() const override { return setup_.sampling.temperature == 0.0f ? kMaxStepsPerSync : 1; }

  const ref::Matrix& logits() const override {
    if (logits_stale_) {
      logits_ = decode_.buffer({BufferKind::kLogits});
      logits_stale_ = false;
    }
    return logits_;
  }
  std::string trace_step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                         const std::filesystem::path& path) override {
    decode_.set_input(decode_input(tokens, positions));
    const Trace trace = decode_.run_traced();
    logits_stale_ = true;
    write_file(path, trace_to_chrome_json(decode_graph_, trace));
    return format_trace_summary(decode_graph_, summarize_trace(decode_graph_, decode_schedule_, trace), trace);
  }
  const DecodeSetup& setup() const override { return setup_; }
  std::string describe() const override {
    return fmt::format("gpu: decode step of {} instructions on {} SMs ({}), built and verified once",
                       decode_schedule_.instructions.size(), decode_schedule_.num_sms,
                       schedule_policy_name(decode_schedule_.policy));
  }

 private:
  // A step's input, of the decode graph's shape (its spread is this GPU's SM count, not step_input's default).
  ref::ModelInput decode_input(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) const {
    ref::ModelInput input = step_input(setup_, tokens, positions);
    input.shape = decode_graph_.shape();
    return input;
  }

  // A prefill part's cache (layers of (n seq_len, 2 kv_dim), of `shape`) into rows [0, seq_len) of sequences
  // [first_sequence, first_sequence + n) of the batch's (layers of (batch max_context, 2 kv_dim)).
  void copy_part_cache(const void* part, const RunShape& shape, int64_t first_sequence) const {
    const size_t row_bytes = size_t(2 * weights_.config.kv_dim()) * sizeof(bf16);
    const size_t part_layer = size_t(shape.batch * shape.seq_len) * row_bytes;
    const size_t cache_layer = size_t(setup_.batch * setup_.max_context) * row_bytes;
    for (int64_t layer = 0; layer < weights_.config.n_layers; ++layer) {
      const char* from = static_cast<const char*>(part) + size_t(layer) * part_layer;
      char* to = static_cast<char*>(cache_) + size_t(layer) * cache_layer +
                 size_t(first_sequence * setup_.max_context) * row_bytes;
      gpu::check_cuda(cudaMemcpy2D(to, size_t(setup_.max_context) * row_bytes, from, size_t(shape.seq_len) * row_bytes,
                                   size_t(shape.seq_len) * row_bytes, size_t(shape.batch), cudaMemcpyDeviceToDevice),
                      "copying a prefill part's KV cache rows");
    }
  }

  GpuOptions options() const {
    GpuOptions options;
    options.kv_cache = cache_;
    options.stall_timeout_s = setup_.stall_timeout_s;
    options.skip_dependency_waits = setup_.skip_dependency_waits;
    return options;
  }

  const ModelWeights& weights_;
  const DecodeSetup setup_;
  const int32_t sm_count_;
  const Graph decode_graph_;
  const Schedule decode_schedule_;
  gpu::DeviceArena cache_arena_;  // before the engines that use the cache: freed after them
  void* const cache_;
  GpuEngine decode_;
  mutable ref::Matrix logits_;  // (batch, vocab) of the last step, downloaded when asked for
  mutable bool logits_stale_ = false;
};

}  // namespace

std::unique_ptr<DecodeEngine> make_gpu_decoder(const ModelWeights& weights, const DecodeSetup& setup) {
  const GpuInfo info = query_gpu();
  MK_CHECK(info.usable, "gpu engine: {}", info.reason);
  return std::make_unique<GpuDecoder>(weights, setup);
}

}  // namespace mk
