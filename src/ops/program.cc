// The layer program of a LLaMA-family forward pass, and what walking it costs.
#include "mk/program.h"

#include <nlohmann/json.hpp>

#include "mk/graph.h"
#include "mk/parallel.h"
#include "mk/weights.h"

namespace mk {

namespace {

bool always(const ModelConfig&) { return true; }
bool with_embedding(const ModelConfig& c) { return c.has_embedding; }
bool with_lm_head(const ModelConfig& c) { return c.has_lm_head; }

// Without an embedding, hidden[0] is the input (the seed model); without an LM head, hidden[n_layers] the output.
constexpr Step kBeforeLayers[] = {{Opcode::kEmbed, with_embedding}};
constexpr Step kPerLayer[] = {
    {Opcode::kAttnNorm, always}, {Opcode::kQkv, always},     {Opcode::kAttention, always}, {Opcode::kOProj, always},
    {Opcode::kMlpNorm, always},  {Opcode::kGateUp, always},  {Opcode::kDown, always},
};
constexpr Step kAfterLayers[] = {{Opcode::kFinalNorm, with_lm_head}, {Opcode::kLmHead, with_lm_head}};

// Prefill: the forward pass's layers, each appending its K and V to the cache. No LM head: the last prompt token
// is the first decode step's input, whose logits give the first new token.
constexpr Step kPrefillLayer[] = {
    {Opcode::kAttnNorm, always}, {Opcode::kQkv, always},     {Opcode::kKvAppend, always}, {Opcode::kAttention, always},
    {Opcode::kOProj, always},    {Opcode::kMlpNorm, always}, {Opcode::kGateUp, always},   {Opcode::kDown, always},
};

// Decode: one token per sequence. Generation needs an embedding and an LM head (checked by the graph), so every step
// applies.
constexpr Step kDecodeBefore[] = {{Opcode::kEmbed, always}};
constexpr Step kDecodeLayer[] = {
    {Opcode::kDecodeQ, always},       {Opcode::kDecodeKv, always},     {Opcode::kDecodeAttention, always},
    {Opcode::kDecodeCombine, always}, {Opcode::kDecodeOProj, always},  {Opcode::kDecodeGateUp, always},
    {Opcode::kDecodeDown, always},
};
constexpr Step kDecodeAfter[] = {{Opcode::kDecodeLmHead, always}, {Opcode::kSample, always}};

double device_bytes_of(const BufferTable& table, BufferRef ref) {
  return device_bytes(table.buffers()[table.id(ref)]);
}

}  // namespace

const LayerProgram& program_of(PassKind pass) {
  static const LayerProgram forward{kBeforeLayers, kPerLayer, kAfterLayers};
  static const LayerProgram prefill{kBeforeLayers, kPrefillLayer, {}};
  static const LayerProgram decode{kDecodeBefore, kDecodeLayer, kDecodeAfter};
  switch (pass) {
    case PassKind::kForward: return forward;
    case PassKind::kPrefill: return prefill;
    case PassKind::kDecode: return decode;
  }
  throw Error(fmt::format("internal error: pass kind {}", int(pass)));
}

BufferRef output_of_pass(const ModelConfig& config, PassKind pass) {
  BufferRef output{BufferKind::kHidden, 0};
  for_each_step(config, pass, [&](const OpDescriptor& op, uint16_t layer) { output = op.output(layer); });
  return output;
}

void run_whole_step(const OpDescriptor& op, const OpContext& ctx, const CpuTile& cpu, uint16_t layer,
                    ref::Matrix& out, bool round_to_bf16) {
  const Task whole = whole_output(op, ctx, layer);
  parallel_for(whole.row_end, [&](int64_t begin, int64_t end) {
    Task band = whole;
    band.row_begin = int32_t(begin);
    band.row_end = int32_t(end);
    op.run_cpu(cpu, band, out);
    if (round_to_bf16) ref::round_to_bf16(out, {begin, end});
  });
}

namespace {

// Host memory figures of the engines (see ForwardCost).
void add_memory(const ModelConfig& config, PassKind pass, const BufferTable& buffers, ForwardCost& cost) {
  double all_fp32 = 0, one_per_kind_fp32 = 0, input = 0;
  std::vector<bool> kind_seen(kNumBufferKinds, false);
  for (const Buffer& buffer : buffers.buffers()) {
    const double bytes = 4.0 * double(buffer.rows) * double(buffer.cols);
    all_fp32 += bytes;
    if (buffer.host_written) input += bytes;
    if (!kind_seen[size_t(buffer.kind)] && buffer.kind != BufferKind::kTokens) one_per_kind_fp32 += bytes;
    kind_seen[size_t(buffer.kind)] = true;
  }
  const Buffer& output = buffers.buffers()[buffers.id(output_of_pass(config, pass))];
  const double schedule = schedule_host_bytes(cost.tasks);
  cost.reference_host_bytes = cost.weight_bytes + input + one_per_kind_fp32;
  cost.cpu_vm_host_bytes = cost.weight_bytes + input + schedule + all_fp32;
  cost.gpu_host_bytes = cost.weight_bytes + input + schedule + 4.0 * double(output.rows) * double(output.cols);
  cost.gpu_device_bytes = cost.weight_bytes + folded_lm_head_copy_bytes(config) + cost.activation_bytes;
}

}  // namespace

ForwardCost forward_cost(const ModelConfig& config, const RunShape& shape) {
  ForwardCost cost;
  cost.tasks = count_tasks(config, shape);  // validates config and shape
  const BufferTable buffers(config, shape);
  const OpContext ctx{config, shape, buffers};
  cost.parameters = parameter_count(config);
  cost.weight_bytes = 2.0 * double(cost.parameters);
  cost.activation_bytes = buffers.device_bytes();
  add_memory(config, shape.pass, buffers, cost);
  for_each_step(config, shape.pass, [&](const OpDescriptor& op, uint16_t layer) {
    const double flops = op.work(ctx, whole_output(op, ctx, layer)).flops;
    cost.flops += flops;
    if (flops > 0) cost.flops_by_op[op.name] += flops;
    const OpTraffic traffic = op.traffic(ctx);
    cost.weights_read += traffic.weight_bytes;
    cost.min_bytes += traffic.weight_bytes + traffic.kept_bytes + traffic.cache_bytes;
  });
  for (const Buffer& buffer : buffers.buffers())
    if (buffer.host_written) cost.min_bytes += device_bytes(buffer);
  cost.min_bytes += device_bytes_of(buffers, output_of_pass(config, shape.pass));
  return cost;
}

nlohmann::json forward_info_json(const ModelConfig& config, const RunShape& shape) {
  const ForwardCost cost = forward_cost(config, shape);
  return {{"config", model_config_to_json(config)},
          {"batch", shape.batch},
          {"seq_len", shape.seq_len},
          {"tokens", shape.tokens()},
          {"parameters", cost.parameters},
          {"flops", cost.flops},
          {"flops_by_op", cost.flops_by_op},
          {"min_bytes", cost.min_bytes},
          {"weight_bytes", cost.weight_bytes},
          {"weights_read", cost.weights_read},
          {"activation_bytes", cost.activation_bytes},
          {"pass", pass_kind_name(shape.pass)},
          {"max_context", shape.max_context},
          {"tasks", cost.tasks},
          {"reference_host_bytes", cost.reference_host_bytes},
          {"cpu_vm_host_bytes", cost.cpu_vm_host_bytes},
          {"gpu_host_bytes", cost.gpu_host_bytes},
          {"gpu_device_bytes", cost.gpu_device_bytes}};
}

}  // namespace mk
