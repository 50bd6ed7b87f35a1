// The layer program of a LLaMA-family forward pass, and what walking it costs.
#include "mk/program.h"

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

double device_bytes_of(const BufferTable& table, BufferRef ref) {
  return device_bytes(table.buffers()[table.id(ref)]);
}

}  // namespace

const LayerProgram& model_program() {
  static const LayerProgram program{kBeforeLayers, kPerLayer, kAfterLayers};
  return program;
}

BufferRef output_of_pass(const ModelConfig& config) {
  BufferRef output{BufferKind::kHidden, 0};
  for_each_step(config, [&](const OpDescriptor& op, uint16_t layer) { output = op.output(layer); });
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

ForwardCost forward_cost(const ModelConfig& config, const RunShape& shape) {
  const BufferTable buffers(config, shape);
  const OpContext ctx{config, shape, buffers};
  ForwardCost cost;
  cost.parameters = parameter_count(config);
  cost.weight_bytes = 2.0 * double(cost.parameters);
  cost.activation_bytes = buffers.device_bytes();
  for_each_step(config, [&](const OpDescriptor& op, uint16_t layer) {
    cost.flops += op.work(ctx, whole_output(op, ctx, layer)).flops;
    const OpTraffic traffic = op.traffic(ctx);
    cost.min_bytes += traffic.weight_bytes + traffic.kept_bytes;
  });
  for (const Buffer& buffer : buffers.buffers())
    if (buffer.host_written) cost.min_bytes += device_bytes(buffer);
  cost.min_bytes += device_bytes_of(buffers, output_of_pass(config));
  return cost;
}

}  // namespace mk
