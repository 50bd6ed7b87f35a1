// The model written once: the steps of the forward pass, before, in and after the layers. The graph, the reference
// model, bisect and the whole-pass accounting all walk this one program.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <span>
#include <string>

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
// The program of each kind of pass; model_program() is the forward pass's.
const LayerProgram& program_of(PassKind pass);
inline const LayerProgram& model_program() { return program_of(PassKind::kForward); }

// Calls visit(op, layer) for each step the pass takes, in execution order.
template <typename Visit>
void for_each_step(const ModelConfig& config, PassKind pass, Visit&& visit) {
  MK_CHECK(config.n_layers < kNoLayer, "model '{}': {} layers are more than the {} one pass addresses", config.name,
           config.n_layers, kNoLayer - 1);
  const LayerProgram& program = program_of(pass);
  auto run = [&](std::span<const Step> steps, uint16_t layer) {
    for (const Step& step : steps)
      if (step.applies(config)) visit(op_descriptor(step.opcode), layer);
  };
  run(program.before_layers, kNoLayer);
  for (int64_t layer = 0; layer < config.n_layers; ++layer) run(program.per_layer, uint16_t(layer));
  run(program.after_layers, kNoLayer);
}
// The forward pass's steps.
template <typename Visit>
void for_each_step(const ModelConfig& config, Visit&& visit) {
  for_each_step(config, PassKind::kForward, std::forward<Visit>(visit));
}

// The buffer the pass ends in: the output of its last step (forward: logits, or hidden[n_layers] without an LM
// head; prefill: hidden[n_layers]; decode: sampled).
BufferRef output_of_pass(const ModelConfig& config, PassKind pass = PassKind::kForward);

// Computes a step's whole output on every core, in bands of rows, rounding each band to bf16 when asked: the
// reference model and bisect run their steps this way.
void run_whole_step(const OpDescriptor& op, const OpContext& ctx, const CpuTile& cpu, uint16_t layer,
                    ref::Matrix& out, bool round_to_bf16);

// Whole-pass accounting for `mk info`, `mk generate` and the benchmarks: the ops' own costs summed over the program
// of shape.pass.
struct ForwardCost {
  int64_t parameters = 0;
  double flops = 0;             // TaskWork's convention: matrix products, causal attention counted half
  std::map<std::string, double> flops_by_op;  // the same, per op (its name), summed over the layers
  // Weights read once, input read once, output and K/V written once; decode also reads the whole cache (at the
  // full max context)
  double min_bytes = 0;
  double weight_bytes = 0;      // every weight, bf16
  double weights_read = 0;      // the weights the pass's steps read (the embedding: only the tokens' rows)
  double activation_bytes = 0;  // every buffer of the pass as the gpu engine allocates it (the KV cache included)
  int64_t tasks = 0;            // of the graph
  // What each engine holds at its peak, from the shapes alone (computing it allocates nothing): what mk compares with
  // the host's or the device's memory before it starts a run.
  double reference_host_bytes = 0;  // weights, the input and one fp32 matrix per buffer kind
  double cpu_vm_host_bytes = 0;     // weights, the input, the schedule and every buffer in fp32
  double gpu_host_bytes = 0;        // weights, the input, the schedule and the fp32 output
  double gpu_device_bytes = 0;      // weights and every buffer as the gpu engine allocates them
};
ForwardCost forward_cost(const ModelConfig& config, const RunShape& shape);
// What `mk info --json` prints: the config (mk's JSON form), the shape and the forward cost as one object.
nlohmann::json forward_info_json(const ModelConfig& config, const RunShape& shape);

}  // namespace mk
