// The forward pass as a graph of tile tasks: the program's steps tiled by their ops, the regions each task reads and
// writes, and the dependencies (counters and waits) derived from those regions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/buffers.h"
#include "mk/instruction.h"
#include "mk/model_config.h"
#include "mk/ops.h"

namespace mk {

// The tasks of one pass, counted without tiling (each op's num_tasks summed over the program).
int64_t count_tasks(const ModelConfig& config, const RunShape& shape);
// Host memory that building, scheduling and verifying a graph of `num_tasks` tasks takes at its peak (measured).
double schedule_host_bytes(int64_t num_tasks);

class Graph {
 public:
  // Throws mk::Error naming the constraint when the tiles of include/mk/tiles.h cannot serve the model or shape, when
  // the pass has more tasks than instructions address, or when scheduling it would not fit in this host's memory.
  Graph(const ModelConfig& config, const RunShape& shape);

  const ModelConfig& config() const { return config_; }
  const RunShape& shape() const { return shape_; }
  const BufferTable& buffer_table() const { return buffers_; }
  const std::vector<Buffer>& buffers() const { return buffers_.buffers(); }
  const std::vector<Task>& tasks() const { return tasks_; }  // in a topological order
  OpContext context() const { return {config_, shape_, buffers_}; }

  uint32_t buffer_id(BufferKind kind, int32_t layer = -1) const { return buffers_.id(kind, layer); }
  uint32_t output_buffer() const { return output_buffer_; }  // logits, or hidden[n_layers] without an LM head
  TaskRegions regions(const Task& task) const;
  TaskWork work(const Task& task) const;
  std::string describe(const Task& task) const;  // "qkv L3 rows [0,128) cols [256,384)"

 private:
  ModelConfig config_;
  RunShape shape_;
  BufferTable buffers_;
  std::vector<Task> tasks_;
  uint32_t output_buffer_ = 0;
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
