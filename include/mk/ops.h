// Ops as units: one descriptor per op says what the op is (name, opcode), how it tiles its output, what a tile
// reads, what it costs and how the CPU computes it. The graph, the verifier, the cpu-vm, the reference model and
// bisect all work through these descriptors (src/ops/ops.cc); none of them switches over opcodes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mk/buffers.h"
#include "mk/instruction.h"
#include "mk/model_config.h"
#include "mk/reference.h"

namespace mk {

// One tile task: a rectangle of its op's output buffer (rows are token rows of the (batch * seq_len) token matrix,
// cols columns of that buffer), computed by one SM. The same fields an Instruction carries.
struct Task {
  Opcode opcode;
  uint16_t layer;    // kNoLayer for ops before or after the layers
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int32_t sequence;  // attention: the task's sequence; -1 otherwise
  int32_t head;      // attention: the task's query head; -1 otherwise
};

// What a task writes (its rectangle of the op's output) and reads (activations only: weights are not buffers).
struct TaskRegions {
  static constexpr int kMaxReads = 4;
  Region write;
  Region reads[kMaxReads];
  int num_reads = 0;
  void read(const Region& region) { reads[num_reads++] = region; }
};

// Work of one task, for the cost model and the FLOP count.
struct TaskWork {
  // Matrix-product FLOPs (2 per multiply-add), causal attention counted half: the seed benchmark's convention.
  // Norms, RoPE and softmax are not counted.
  double flops = 0;
  double bytes = 0;  // bytes the task moves between global memory (or L2) and the SM
  // Of those, the bytes no other task reads, which come from HBM at its share of the bandwidth: decode's weights
  // and KV cache. The rest is assumed shared through L2.
  double streamed_bytes = 0;
  // The cost model's rates for this task where a GEMM tile's do not fit it (0: a GEMM tile's), and a fixed time on
  // top of every instruction's overhead (src/host/schedule.cc, calibrated from traces).
  double flops_per_ns = 0;
  double bytes_per_ns = 0;
  double fixed_ns = 0;
};

// The least any implementation must move for one step (one op in one layer), for the minimum-bytes figure.
struct OpTraffic {
  double weight_bytes = 0;  // weights the step reads, each once
  double kept_bytes = 0;    // results that outlive the pass besides its output (the K/V a cache would hold)
  double cache_bytes = 0;   // decode: K and V read from the cache, at the full max context
};

// What an op's descriptor sees of the pass.
struct OpContext {
  const ModelConfig& config;
  const RunShape& shape;
  const BufferTable& buffers;
  int64_t cols(BufferRef ref) const { return buffers.buffers()[buffers.id(ref)].cols; }
};

// What a CPU tile function computes from besides its output: weights and RoPE table, the pass's input (token ids;
// decode: positions and sampling; input.shape is the pass's), and the pass's other buffers, read only. Each engine
// says where each buffer lives (the reference keeps one per kind).
struct CpuTile {
  const ModelConfig& config;
  const ref::ModelOperands& operands;
  const ref::ModelInput& input;
  const BufferTable& table;
  std::vector<const ref::Matrix*> buffers;  // (table.buffers().size()): where each buffer is read from
  const ref::Matrix& in(BufferRef ref) const { return *buffers[table.id(ref)]; }
};

// The descriptor of one op: every function is required (src/ops/ops.cc checks it at compile time).
struct OpDescriptor {
  Opcode opcode;
  const char* name;
  // The buffer the op writes in `layer` (kNoLayer outside the layers); each task writes its own rectangle of it.
  BufferRef (*output)(uint16_t layer);
  // Throws mk::Error naming the constraint when the tiles of include/mk/tiles.h cannot serve the model or shape.
  void (*check)(const OpContext& ctx);
  // Appends the op's tasks for `layer`, in the order they should run.
  void (*tile)(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks);
  // How many tasks `tile` appends for one layer, computed without tiling: the graph sizes itself (and refuses a pass
  // too large to hold) before it allocates anything.
  int64_t (*num_tasks)(const OpContext& ctx);
  // Adds the regions a task of the graph reads to `regions`.
  void (*reads)(const OpContext& ctx, const Task& task, TaskRegions& regions);
  // Work of a task; additive: the work of any rectangle of the output is the sum over the tiles that cover it.
  TaskWork (*work)(const OpContext& ctx, const Task& task);
  OpTraffic (*traffic)(const OpContext& ctx);
  // Computes out[rows, cols] of the task's rectangle, for any rectangle of whole rows and (for ops that work on
  // heads) whole heads: every element comes out the same whatever the rectangle, so engines that tile differently
  // agree bit for bit.
  void (*run_cpu)(const CpuTile& cpu, const Task& task, ref::Matrix& out);
  // The device handler is not bound here: the megakernel keeps one handler per opcode in src/cuda/device/ops/ and
  // dispatches over the same Opcode list (include/mk/instruction.h). Descriptor and handler meet at the opcode.
};

const OpDescriptor& op_descriptor(Opcode opcode);  // throws mk::Error for kNop and values outside the enum
std::span<const OpDescriptor> op_descriptors();      // every op, in opcode order
const char* opcode_name(Opcode opcode);              // "nop", or "invalid" outside the enum

// The whole output of an op in `layer` as one task: what the reference and bisect compute.
Task whole_output(const OpDescriptor& op, const OpContext& ctx, uint16_t layer);

}  // namespace mk
