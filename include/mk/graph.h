// The forward pass as a graph of tile tasks: buffers, tasks, the regions each task reads and writes, and the
// dependencies (counters and waits) derived from those regions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/instruction.h"
#include "mk/model_config.h"

namespace mk {

// Tile sizes. The GPU megakernel is compiled for one TileConfig; the host builds schedules for any.
struct TileConfig {
  int32_t block_m = 128;  // token rows per GEMM tile
  int32_t block_n = 128;       // output columns per GEMM tile
  int32_t block_n_wide = 128;  // output columns per qkv and lm_head tile (the megakernel stages 128-column outputs)
  int32_t block_k = 64;   // K step of the GPU GEMM: K dimensions must be multiples of it
  int32_t block_q = 128;  // queries per attention tile
  // NOTE: row-wise tasks (embedding, norms) move bytes, not FLOPs: 32 rows spread a norm over 4x more SMs than a
  // GEMM row block and shorten the norm -> GEMM hop on the critical path.
  int32_t block_rows = 32;  // token rows per embedding and norm task
  // NOTE: a GEMM whose weights do not fit in L2 emits its tiles in groups of group_m row blocks, column by column
  // within a group, so that the ~132 tiles in flight share weight tiles through L2 instead of each streaming its own
  // from HBM (measured: 1 layer of d_model 4096, 2.17 -> 1.64 ms). Smaller GEMMs go row block by row block, which
  // finishes rows earliest for the next op (measured: the seed preset, 1.288 -> 1.276 ms).
  int32_t group_m = 8;
  int64_t l2_resident_weight_bytes = int64_t(24) << 20;  // half the H200's 50 MB L2 (60 MB reported) for weights

  bool operator==(const TileConfig&) const = default;
};

enum class BufferKind : uint8_t {
  kTokens,      // (T, 1) int32 token ids, written by the host
  kHidden,      // hidden[l]: (T, d_model) residual stream entering layer l; hidden[n_layers] leaves the last layer
  kAttnNorm,    // (T, d_model)
  kQkv,         // (T, q_dim + 2 kv_dim): q | k | v, RoPE applied to q and k
  kAttn,        // (T, q_dim) attention output, heads side by side
  kHiddenMid,   // (T, d_model) residual stream after attention
  kMlpNorm,     // (T, d_model)
  kAct,         // (T, d_ff) silu(gate) * up
  kFinalNorm,   // (T, d_model)
  kLogits,      // (T, vocab_size)
};

struct Buffer {
  BufferKind kind;
  int32_t layer;        // -1 for buffers outside the layers
  int64_t rows;
  int64_t cols;
  bool host_written;    // written by the host before the launch, not by any task
  std::string name() const;
};

// A rectangle of a buffer: rows [row_begin, row_end) x cols [col_begin, col_end).
struct Region {
  uint32_t buffer;
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int64_t area() const { return int64_t(row_end - row_begin) * (col_end - col_begin); }
};

// Ops outside the layers (their `layer` field means nothing).
inline bool is_after_layers(Opcode opcode) { return opcode == Opcode::kFinalNorm || opcode == Opcode::kLmHead; }

// The tile coordinates of a task; the same fields an Instruction carries.
struct Task {
  Opcode opcode;
  uint16_t layer;
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int32_t sequence;  // kAttention only
  int32_t head;      // kAttention only
};

struct TaskRegions {
  static constexpr int kMaxReads = 3;
  Region write;
  Region reads[kMaxReads];
  int num_reads = 0;
};

// Work of one task, for the cost model.
struct TaskWork {
  double flops = 0;
  double bytes = 0;  // bytes the task moves between global memory (or L2) and the SM
};

class Graph {
 public:
  // Throws mk::Error naming the constraint when the tiling cannot serve the model or shape.
  Graph(const ModelConfig& config, const RunShape& shape, const TileConfig& tiles = {});

  const ModelConfig& config() const { return config_; }
  const RunShape& shape() const { return shape_; }
  const TileConfig& tiles() const { return tiles_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  const std::vector<Task>& tasks() const { return tasks_; }  // in a topological order

  uint32_t buffer_id(BufferKind kind, int32_t layer = -1) const;
  uint32_t output_buffer() const;  // logits, or hidden[n_layers] without an LM head
  TaskRegions regions(const Task& task) const;
  TaskWork work(const Task& task) const;
  std::string describe(const Task& task) const;  // "qkv L3 rows [0,128) cols [256,384)"

 private:
  ModelConfig config_;
  RunShape shape_;
  TileConfig tiles_;
  std::vector<Buffer> buffers_;
  std::vector<Task> tasks_;
  uint32_t first_layer_buffer_ = 0;  // per-layer buffers start here, kPerLayerBuffers per layer
};

// Which counter each task signals, and the waits each task needs before it may start. Derived from regions only:
// tasks of one op that write the same rows share a counter, and a task waits on every counter whose tasks write
// something it reads.
struct Dependencies {
  uint32_t num_counters = 0;
  std::vector<uint32_t> counter_of_task;  // (num_tasks)
  std::vector<uint32_t> counter_target;   // (num_counters) tasks that signal the counter in one launch
  std::vector<Wait> waits;                // (distinct wait lists, concatenated); tasks with identical lists share one
  std::vector<uint32_t> wait_begin;       // (num_tasks) start of the task's list in `waits`
  std::vector<uint32_t> num_waits;        // (num_tasks)
};

Dependencies derive_dependencies(const Graph& graph);

}  // namespace mk
