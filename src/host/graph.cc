// Graph: the program's steps tiled into tasks by their ops, task regions and costs, and dependency derivation.
#include "mk/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "mk/check.h"
#include "mk/kv_cache.h"
#include "mk/limits.h"
#include "mk/program.h"

namespace mk {

namespace {

// The config and shape, once they are known to be within what the engines address (ModelConfig::validate bounds
// every width and layer count); returns the config, so that the graph's members are built only from one that passed.
const ModelConfig& addressable(const ModelConfig& c, const RunShape& shape) {
  c.validate();
  check_pass_shape(c, shape);  // validates the shape too
  return c;
}

}  // namespace

// NOTE: `mk schedule` peaks at 250-260 bytes per task (seed 64 x 1024, llama-3.2-1b 16 x 2048, measured as peak
// RSS over tasks; 170-230 before the cost-model policy also scheduled backward); twice that leaves room for
// --explain and the engines' own tables.
constexpr double kScheduleBytesPerTask = 520.0;

double schedule_host_bytes(int64_t num_tasks) { return kScheduleBytesPerTask * double(num_tasks); }

int64_t count_tasks(const ModelConfig& config, const RunShape& shape) {
  const BufferTable buffers(addressable(config, shape), shape);
  const OpContext ctx{config, shape, buffers};
  int64_t count = 0;
  for_each_step(config, shape.pass, [&](const OpDescriptor& op, uint16_t) {
    count = checked_add(count, op.num_tasks(ctx), "the task count");
  });
  return count;
}

Graph::Graph(const ModelConfig& config, const RunShape& shape)
    : config_(addressable(config, shape)), shape_(shape), buffers_(config_, shape_) {
  const OpContext ctx = context();
  std::vector<bool> checked(size_t(Opcode::kNumOpcodes), false);
  for_each_step(config_, shape_.pass, [&](const OpDescriptor& op, uint16_t) {
    if (!checked[size_t(op.opcode)]) op.check(ctx);
    checked[size_t(op.opcode)] = true;
  });
  // Sized before anything is tiled: instructions name tasks with 32 bits, and a pass this host cannot schedule and
  // verify is refused here rather than at some allocation along the way.
  const int64_t num_tasks = count_tasks(config_, shape_);
  MK_CHECK(num_tasks < (int64_t(1) << 32),
           "model '{}' at {}: {} tasks are more than a schedule addresses (fewer than 2^32)", config_.name,
           mk::describe(shape_), num_tasks);
  check_memory(schedule_host_bytes(num_tasks), double(host_memory_bytes()),
               fmt::format("scheduling {} tasks ({})", num_tasks, mk::describe(shape_)), "host memory");
  tasks_.reserve(size_t(num_tasks));
  // Tasks in a topological order: step after step, layer after layer.
  for_each_step(config_, shape_.pass, [&](const OpDescriptor& op, uint16_t layer) { op.tile(ctx, layer, tasks_); });
  output_buffer_ = buffers_.id(output_of_pass(config_, shape_.pass));
}

TaskRegions Graph::regions(const Task& t) const {
  const OpDescriptor& op = op_descriptor(t.opcode);
  TaskRegions regions;
  regions.write = {buffers_.id(op.output(t.layer)), t.row_begin, t.row_end, t.col_begin, t.col_end};
  op.reads(context(), t, regions);
  return regions;
}

TaskWork Graph::work(const Task& t) const { return op_descriptor(t.opcode).work(context(), t); }

std::string Graph::describe(const Task& t) const {
  const std::string layer = t.layer == kNoLayer ? "" : fmt::format(" L{}", t.layer);
  const std::string where = t.sequence >= 0 ? fmt::format(" seq {} head {}", t.sequence, t.head) : "";
  return fmt::format("{}{}{} rows [{},{}) cols [{},{})", opcode_name(t.opcode), layer, where, t.row_begin, t.row_end,
                     t.col_begin, t.col_end);
}

namespace {

// One band per counter: the rectangle of one buffer its tasks write.
struct Band {
  int32_t row_begin, row_end, col_begin, col_end;
  uint32_t counter;
};
using BandsOfBuffer = std::vector<std::vector<Band>>;  // (buffers): each buffer's bands, sorted by rows

// Counters: the tasks of one op and layer that write the same rows share one. Fills the counter fields of `deps`.
BandsOfBuffer assign_counters(const Graph& graph, Dependencies& deps) {
  struct CounterKey {
    Opcode opcode;
    uint16_t layer;
    int32_t row_begin;
    int32_t row_end;
    bool operator==(const CounterKey&) const = default;
  };
  struct CounterKeyHash {
    size_t operator()(const CounterKey& k) const {
      return (size_t(k.opcode) * 0x9e3779b97f4a7c15ull) ^ (size_t(k.layer) << 40) ^ (size_t(k.row_begin) << 20) ^
             size_t(k.row_end);
    }
  };
  const std::vector<Task>& tasks = graph.tasks();
  deps.counter_of_task.resize(tasks.size());
  std::unordered_map<CounterKey, uint32_t, CounterKeyHash> counter_of_key;
  BandsOfBuffer bands_of_buffer(graph.buffers().size());
  std::vector<std::pair<uint32_t, uint32_t>> band_of_counter;  // (buffer, index in its band list)
  CounterKey previous_key{Opcode::kNop, 0, 0, 0};
  uint32_t previous_counter = std::numeric_limits<uint32_t>::max();
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    const CounterKey key{t.opcode, t.layer, t.row_begin, t.row_end};
    uint32_t counter;
    if (i > 0 && key == previous_key) {
      counter = previous_counter;  // NOTE: tasks of a counter are generated consecutively; skip the hash lookup
    } else {
      auto [it, inserted] = counter_of_key.try_emplace(key, deps.num_counters);
      if (inserted) {
        ++deps.num_counters;
        deps.counter_target.push_back(0);
        const Region write = graph.regions(t).write;
        band_of_counter.emplace_back(write.buffer, uint32_t(bands_of_buffer[write.buffer].size()));
        bands_of_buffer[write.buffer].push_back({write.row_begin, write.row_end, write.col_begin, write.col_end, it->second});
      }
      counter = it->second;
    }
    deps.counter_of_task[i] = counter;
    ++deps.counter_target[counter];
    Band& band = bands_of_buffer[band_of_counter[counter].first][band_of_counter[counter].second];
    band.col_begin = std::min(band.col_begin, t.col_begin);
    band.col_end = std::max(band.col_end, t.col_end);
    previous_key = key;
    previous_counter = counter;
  }
  for (auto& bands : bands_of_buffer) {
    std::sort(bands.begin(), bands.end(), [](const Band& a, const Band& b) { return a.row_begin < b.row_begin; });
    for (size_t i = 1; i < bands.size(); ++i)
      MK_CHECK(bands[i].row_begin >= bands[i - 1].row_end, "internal error: counters of one buffer overlap in rows");
  }
  return bands_of_buffer;
}

// The counters whose bands intersect a region the task reads, sorted, each once.
void counters_read_by(const TaskRegions& regions, const BandsOfBuffer& bands_of_buffer, std::vector<uint32_t>& out) {
  out.clear();
  for (int r = 0; r < regions.num_reads; ++r) {
    const Region& read = regions.reads[r];
    const std::vector<Band>& bands = bands_of_buffer[read.buffer];
    auto band = std::upper_bound(bands.begin(), bands.end(), read.row_begin,
                                 [](int32_t row, const Band& b) { return row < b.row_end; });
    for (; band != bands.end() && band->row_begin < read.row_end; ++band) {
      if (band->col_begin < read.col_end && read.col_begin < band->col_end) out.push_back(band->counter);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

// Waits: every counter a task reads from. Fills the wait fields of `deps`.
void assign_waits(const Graph& graph, const BandsOfBuffer& bands_of_buffer, Dependencies& deps) {
  const std::vector<Task>& tasks = graph.tasks();
  deps.wait_begin.resize(tasks.size());
  deps.num_waits.resize(tasks.size());
  std::vector<uint32_t> counters;
  std::vector<uint32_t> previous_counters;
  // Identical wait lists are stored once: tasks of one row block of a GEMM share theirs even when, grouped for L2
  // reuse, they are not neighbours. Keyed by a hash of the list; equal hashes are compared in full.
  std::unordered_multimap<uint64_t, uint32_t> list_by_hash;  // hash -> wait_begin
  auto hash_of = [](const std::vector<uint32_t>& list) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t v : list) h = (h ^ v) * 0x100000001b3ull;
    return h ^ (uint64_t(list.size()) << 56);  // lists of different lengths never compare equal
  };
  auto find_list = [&](uint64_t hash) -> int64_t {
    auto [begin, end] = list_by_hash.equal_range(hash);
    for (auto it = begin; it != end; ++it) {
      bool same = true;
      for (size_t k = 0; k < counters.size() && same; ++k) same = deps.waits[it->second + k].counter == counters[k];
      if (same) return it->second;
    }
    return -1;
  };
  for (size_t i = 0; i < tasks.size(); ++i) {
    counters_read_by(graph.regions(tasks[i]), bands_of_buffer, counters);
    deps.num_waits[i] = uint32_t(counters.size());
    if (i > 0 && counters == previous_counters) {
      deps.wait_begin[i] = deps.wait_begin[i - 1];
      continue;
    }
    const uint64_t hash = hash_of(counters);
    const int64_t existing = find_list(hash);
    if (existing >= 0) {
      deps.wait_begin[i] = uint32_t(existing);
    } else {
      deps.wait_begin[i] = uint32_t(deps.waits.size());
      for (uint32_t counter : counters) deps.waits.push_back({counter, deps.counter_target[counter]});
      list_by_hash.emplace(hash, deps.wait_begin[i]);
    }
    previous_counters = counters;
  }
}

}  // namespace

Dependencies derive_dependencies(const Graph& graph) {
  Dependencies deps;
  const BandsOfBuffer bands_of_buffer = assign_counters(graph, deps);
  assign_waits(graph, bands_of_buffer, deps);
  return deps;
}

}  // namespace mk
