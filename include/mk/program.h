// The model written once: the steps of the forward pass, before, in and after the layers. The graph, the reference
// model, bisect and the whole-pass accounting all walk this one program.
#pragma once

#include <cstdint>
#include <span>

#include "mk/check.h"
#include "mk/ops.h"

namespace mk {

// One op at one place of the model, taken when `applies` holds for the model.
struct Step {
  Opcode opcode;
  bool (*applies)(const ModelConfig& config);
};

struct LayerProgram {
  std::span<const Step> before_layers;  // run with layer kNoLayer
  std::span<const Step> per_layer;      // run for layers 0 .. n_layers - 1
  std::span<const Step> after_layers;   // run with layer kNoLayer
};
const LayerProgram& model_program();

// Calls visit(op, layer) for each step the model takes, in execution order.
template <typename Visit>
void for_each_step(const ModelConfig& config, Visit&& visit) {
  MK_CHECK(config.n_layers < kNoLayer, "model '{}': {} layers are more than the {} one pass addresses", config.name,
           config.n_layers, kNoLayer - 1);
  const LayerProgram& program = model_program();
  auto run = [&](std::span<const Step> steps, uint16_t layer) {
    for (const Step& step : steps)
      if (step.applies(config)) visit(op_descriptor(step.opcode), layer);
  };
  run(program.before_layers, kNoLayer);
  for (int64_t layer = 0; layer < config.n_layers; ++layer) run(program.per_layer, uint16_t(layer));
  run(program.after_layers, kNoLayer);
}

// The buffer the pass ends in: the output of its last step (logits, or hidden[n_layers] without an LM head).
BufferRef output_of_pass(const ModelConfig& config);

// Computes a step's whole output on every core, in bands of rows, rounding each band to bf16 when asked: the
// reference model and bisect run their steps this way.
void run_whole_step(const OpDescriptor& op, const OpContext& ctx, const CpuTile& cpu, uint16_t layer,
                    ref::Matrix& out, bool round_to_bf16);

// Whole-pass accounting for `mk info` and the benchmarks: the ops' own costs summed over the program.
struct ForwardCost {
  int64_t parameters = 0;
  double flops = 0;             // TaskWork's convention: matrix products, causal attention counted half
  double min_bytes = 0;         // weights read once, input read once, output and K/V written once
  double weight_bytes = 0;      // every weight, bf16
  double activation_bytes = 0;  // every buffer of the pass as the gpu engine allocates it
};
ForwardCost forward_cost(const ModelConfig& config, const RunShape& shape);

}  // namespace mk
