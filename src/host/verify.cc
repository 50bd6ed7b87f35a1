// The static schedule verifier: proves a schedule safe for its graph or names the instruction that is not.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/schedule.h"
#include "mk/writer_grid.h"
#include "in_order.h"

namespace mk {

namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

struct Position {
  uint32_t sm = kNone;
  uint32_t index = kNone;  // within the SM's list
};

std::string region_text(const Graph& graph, const Region& r) {
  return fmt::format("{} rows [{},{}) cols [{},{})", graph.buffers()[r.buffer].name(), r.row_begin, r.row_end,
                     r.col_begin, r.col_end);
}

// The fields of an instruction that differ from its task's, each with both values: a differing sequence or head of
// a task that is not attention leaves the task's description and the instruction's looking the same.
std::string differing_fields(const Instruction& in, const Task& t) {
  std::vector<std::string> fields;
  if (in.opcode != t.opcode)
    fields.push_back(fmt::format("opcode {} (the task's: {})", opcode_name(in.opcode), opcode_name(t.opcode)));
  struct Field {
    const char* name;
    int64_t instruction, task;
  };
  const Field integers[] = {{"layer", in.layer, t.layer},          {"row_begin", in.row_begin, t.row_begin},
                            {"row_end", in.row_end, t.row_end},    {"col_begin", in.col_begin, t.col_begin},
                            {"col_end", in.col_end, t.col_end},    {"sequence", in.sequence, t.sequence},
                            {"head", in.head, t.head}};
  for (const Field& field : integers)
    if (field.instruction != field.task)
      fields.push_back(fmt::format("{} {} (the task's: {})", field.name, field.instruction, field.task));
  return fmt::format("{}", fmt::join(fields, ", "));
}

bool intersects(const Region& a, const Region& b) {
  return a.buffer == b.buffer && a.row_begin < b.row_end && b.row_begin < a.row_end && a.col_begin < b.col_end &&
         b.col_begin < a.col_end;
}

// True if the rectangles cover `target` completely; fills `hole` with an uncovered point otherwise.
bool covers(const std::vector<Region>& rects, const Region& target, int32_t* hole_row, int32_t* hole_col) {
  // Fast path: every rectangle spans the target's columns, so only rows need covering.
  bool full_width = true;
  for (const Region& r : rects) full_width &= r.col_begin <= target.col_begin && r.col_end >= target.col_end;
  if (full_width) {
    std::vector<std::pair<int32_t, int32_t>> rows;
    rows.reserve(rects.size());
    for (const Region& r : rects) rows.emplace_back(r.row_begin, r.row_end);
    std::sort(rows.begin(), rows.end());
    int32_t covered_to = target.row_begin;
    for (auto [begin, end] : rows) {
      if (begin > covered_to) break;
      covered_to = std::max(covered_to, end);
    }
    if (covered_to >= target.row_end) return true;
    *hole_row = covered_to;
    *hole_col = target.col_begin;
    return false;
  }
  // General case: compress coordinates inside the target and mark cells.
  std::vector<int32_t> rows{target.row_begin, target.row_end}, cols{target.col_begin, target.col_end};
  for (const Region& r : rects) {
    for (int32_t v : {r.row_begin, r.row_end})
      if (v > target.row_begin && v < target.row_end) rows.push_back(v);
    for (int32_t v : {r.col_begin, r.col_end})
      if (v > target.col_begin && v < target.col_end) cols.push_back(v);
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::sort(cols.begin(), cols.end());
  cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
  std::vector<char> covered((rows.size() - 1) * (cols.size() - 1), 0);
  for (const Region& r : rects) {
    for (size_t i = 0; i + 1 < rows.size(); ++i) {
      if (rows[i] < r.row_begin || rows[i] >= r.row_end) continue;
      for (size_t j = 0; j + 1 < cols.size(); ++j)
        if (cols[j] >= r.col_begin && cols[j] < r.col_end) covered[i * (cols.size() - 1) + j] = 1;
    }
  }
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    for (size_t j = 0; j + 1 < cols.size(); ++j) {
      if (!covered[i * (cols.size() - 1) + j]) {
        *hole_row = rows[i];
        *hole_col = cols[j];
        return false;
      }
    }
  }
  return true;
}

// The verifier's jobs, in the order they run; each relies only on what the ones before it proved.
class Verifier {
 public:
  Verifier(const Graph& graph, const Schedule& schedule)
      : graph_(graph), schedule_(schedule), tasks_(graph.tasks()), buffers_(graph.buffers()),
        num_tasks_(graph.tasks().size()), num_counters_(schedule.num_counters) {}

  void run() {
    check_sm_ranges();
    check_instructions();
    check_combine_links(graph_, schedule_);
    check_counters();
    check_writes();
    check_reads();
    check_liveness();
  }

 private:
  std::string where(uint32_t sm, uint32_t index) const {
    const Instruction& in = schedule_.instructions[schedule_.sm_begin[sm] + index];
    const std::string what = in.task < num_tasks_ ? graph_.describe(tasks_[in.task]) : std::string("?");
    return fmt::format("SM {} instruction {} (task {}: {})", sm, index, in.task, what);
  }
  std::string where_task(uint32_t t) const { return where(position_[t].sm, position_[t].index); }
  const Instruction& instruction_of_task(uint32_t t) const {
    return schedule_.instructions[schedule_.sm_begin[position_[t].sm] + position_[t].index];
  }

  // NOTE: instructions are in SM order, tasks in graph order: each access to a task's entries is a cache miss on
  // large graphs unless it is prefetched a few instructions ahead.
  void prefetch_task_of(size_t instruction) const {
    constexpr size_t kPrefetchDistance = 16;
    if (instruction + kPrefetchDistance >= schedule_.instructions.size()) return;
    const uint32_t task = schedule_.instructions[instruction + kPrefetchDistance].task;
    if (task >= num_tasks_) return;
    __builtin_prefetch(&tasks_[task]);
    __builtin_prefetch(&position_[task]);
  }

  void check_sm_ranges() const;
  void check_instructions();
  void check_counters();
  void check_writes();
  void box_counters();
  void check_reads();
  bool covered(const Instruction& in, int read_index, const Region& read, int32_t* hole_row, int32_t* hole_col);
  void check_liveness() const;

  const Graph& graph_;
  const Schedule& schedule_;
  const std::vector<Task>& tasks_;
  const std::vector<Buffer>& buffers_;
  const size_t num_tasks_;
  const uint32_t num_counters_;
  std::vector<Position> position_;        // (num_tasks) where each task runs
  std::vector<uint32_t> signals_;         // (num_counters) signals per launch
  std::vector<uint32_t> counter_begin_;   // (num_counters + 1): counter c's tasks are counter_tasks_[begin[c], begin[c+1])
  std::vector<uint32_t> counter_tasks_;   // (num_tasks)
  std::vector<Region> write_of_;          // (num_tasks)
  std::vector<WriterGrid> grids_;         // (buffers)
  std::vector<Region> counter_box_;       // (num_counters) bounding box of the counter's writes
  std::vector<char> counter_exact_;       // (num_counters) its tasks tile the box exactly
  std::vector<uint32_t> visited_mark_;    // (num_counters) scratch of covered()
  std::vector<uint32_t> frontier_, more_;
  std::vector<Region> rects_;
};

// ---- structure: every task exactly once, instructions faithful to their tasks, indices in range ----

void Verifier::check_sm_ranges() const {
  const Schedule& s = schedule_;
  MK_CHECK(s.num_sms > 0 && s.sm_begin.size() == size_t(s.num_sms) + 1, "schedule: {} SM offsets for {} SMs",
           s.sm_begin.size(), s.num_sms);
  MK_CHECK(s.sm_begin.front() == 0 && s.sm_begin.back() == s.instructions.size(),
           "schedule: SM offsets do not span the {} instructions", s.instructions.size());
  MK_CHECK(s.instructions.size() == num_tasks_, "schedule has {} instructions, the graph {} tasks",
           s.instructions.size(), num_tasks_);
  // Every counter needs a task to signal it; checked before the per-counter tables are sized by the count.
  MK_CHECK(s.num_counters <= num_tasks_, "schedule: {} counters for {} tasks", s.num_counters, num_tasks_);
  for (uint32_t sm = 0; sm < uint32_t(s.num_sms); ++sm) {
    MK_CHECK(s.sm_begin[sm] <= s.sm_begin[sm + 1] && s.sm_begin[sm + 1] <= num_tasks_,
             "schedule: SM {}'s instructions [{}, {}) are not a range of the {} instructions", sm, s.sm_begin[sm],
             s.sm_begin[sm + 1], num_tasks_);
  }
}

void Verifier::check_instructions() {
  const Schedule& s = schedule_;
  position_.assign(num_tasks_, Position{});
  for (uint32_t sm = 0; sm < uint32_t(s.num_sms); ++sm) {
    for (uint32_t i = s.sm_begin[sm]; i < s.sm_begin[sm + 1]; ++i) {
      prefetch_task_of(i);
      const Instruction& in = s.instructions[i];
      const uint32_t index = i - s.sm_begin[sm];
      MK_CHECK(in.task < num_tasks_, "SM {} instruction {}: task index {} is out of range ({} tasks)", sm, index,
               in.task, num_tasks_);
      MK_CHECK(position_[in.task].sm == kNone, "{}: the task also appears as {}", where(sm, index),
               where_task(in.task));
      position_[in.task] = {sm, index};
      const Task& t = tasks_[in.task];
      const std::string differences = differing_fields(in, t);
      MK_CHECK(differences.empty(), "SM {} instruction {}: does not match task {} ({}): {}", sm, index, in.task,
               graph_.describe(t), differences);
      MK_CHECK(in.signal_counter < num_counters_, "{}: signals counter {} of {}", where(sm, index), in.signal_counter,
               num_counters_);
      MK_CHECK(uint64_t(in.wait_begin) + in.num_waits <= s.waits.size(),
               "{}: wait list [{}, +{}) lies outside the {} waits", where(sm, index), in.wait_begin, in.num_waits,
               s.waits.size());
      for (uint32_t k = 0; k < in.num_waits; ++k)
        MK_CHECK(s.waits[in.wait_begin + k].counter < num_counters_, "{}: waits on counter {} of {}", where(sm, index),
                 s.waits[in.wait_begin + k].counter, num_counters_);
    }
  }
}

// ---- counters: signals per launch, reachable targets, and each counter's tasks ----

void Verifier::check_counters() {
  const Schedule& s = schedule_;
  signals_.assign(num_counters_, 0);
  for (const Instruction& in : s.instructions) ++signals_[in.signal_counter];
  for (const Instruction& in : s.instructions) {
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = s.waits[in.wait_begin + k];
      MK_CHECK(w.target <= signals_[w.counter],
               "{}: waits for counter {} to reach {} per launch, but only {} tasks signal it: unreachable",
               where_task(in.task), w.counter, w.target, signals_[w.counter]);
    }
  }
  counter_begin_.assign(num_counters_ + 1, 0);
  for (const Instruction& in : s.instructions) ++counter_begin_[in.signal_counter + 1];
  for (uint32_t c = 0; c < num_counters_; ++c) counter_begin_[c + 1] += counter_begin_[c];
  counter_tasks_.resize(num_tasks_);
  std::vector<uint32_t> fill(counter_begin_.begin(), counter_begin_.end() - 1);
  for (const Instruction& in : s.instructions) counter_tasks_[fill[in.signal_counter]++] = in.task;
}

// ---- writes: inside their buffer, never overlapping, the output complete ----

void Verifier::check_writes() {
  write_of_.resize(num_tasks_);
  for (size_t t = 0; t < num_tasks_; ++t) {
    const Region w = graph_.regions(tasks_[t]).write;
    const Buffer& b = buffers_[w.buffer];
    MK_CHECK(!b.host_written, "{}: writes {}, which the host writes", where_task(uint32_t(t)), b.name());
    MK_CHECK(w.row_begin >= 0 && w.row_begin < w.row_end && w.row_end <= b.rows && w.col_begin >= 0 &&
                 w.col_begin < w.col_end && w.col_end <= b.cols,
             "{}: writes {} outside the buffer's ({}, {})", where_task(uint32_t(t)), region_text(graph_, w), b.rows,
             b.cols);
    write_of_[t] = w;
  }
  grids_ = build_writer_grids(graph_, [&](uint32_t first, uint32_t second, const Region& cell) {
    throw Error(fmt::format("{} and {} both write {}", where_task(first), where_task(second), region_text(graph_, cell)));
  });
  const uint32_t out = graph_.output_buffer();
  const Buffer& b = buffers_[out];
  const WriterGrid& grid = grids_[out];
  const bool spans = !grid.row_bounds.empty() && grid.row_bounds.front() == 0 && grid.row_bounds.back() == b.rows &&
                     grid.col_bounds.front() == 0 && grid.col_bounds.back() == b.cols;
  MK_CHECK(spans, "the output {} is not written completely: the writes span rows [{},{}) cols [{},{}) of ({}, {})",
           b.name(), grid.row_bounds.empty() ? 0 : grid.row_bounds.front(),
           grid.row_bounds.empty() ? 0 : grid.row_bounds.back(), grid.col_bounds.empty() ? 0 : grid.col_bounds.front(),
           grid.col_bounds.empty() ? 0 : grid.col_bounds.back(), b.rows, b.cols);
  for (size_t cell = 0; cell < grid.writer.size(); ++cell) {
    const size_t i = cell / grid.num_col_cells(), j = cell % grid.num_col_cells();
    MK_CHECK(grid.writer[cell] != WriterGrid::kNoWriter,
             "the output {} is not written completely: nothing writes rows [{},{}) cols [{},{})", b.name(),
             grid.row_bounds[i], grid.row_bounds[i + 1], grid.col_bounds[j], grid.col_bounds[j + 1]);
  }
  box_counters();
}

// NOTE: a counter whose tasks write one buffer and tile their bounding box exactly (writes never overlap, checked
// before) stands for that box: coverage then looks at one rectangle per counter instead of one per task.
void Verifier::box_counters() {
  counter_box_.resize(num_counters_);
  counter_exact_.assign(num_counters_, 0);
  for (uint32_t c = 0; c < num_counters_; ++c) {
    if (counter_begin_[c] == counter_begin_[c + 1]) continue;
    Region box = write_of_[counter_tasks_[counter_begin_[c]]];
    int64_t area = 0;
    bool one_buffer = true;
    for (uint32_t i = counter_begin_[c]; i < counter_begin_[c + 1]; ++i) {
      const Region& w = write_of_[counter_tasks_[i]];
      one_buffer &= w.buffer == box.buffer;
      box.row_begin = std::min(box.row_begin, w.row_begin);
      box.row_end = std::max(box.row_end, w.row_end);
      box.col_begin = std::min(box.col_begin, w.col_begin);
      box.col_end = std::max(box.col_end, w.col_end);
      area += w.area();
    }
    counter_box_[c] = box;
    counter_exact_[c] = one_buffer && area == box.area();
  }
}

// ---- reads: covered by the writes of tasks the reader waits for, directly or transitively ----

void Verifier::check_reads() {
  visited_mark_.assign(num_counters_, kNone);
  for (size_t i = 0; i < schedule_.instructions.size(); ++i) {
    prefetch_task_of(i);
    const Instruction& in = schedule_.instructions[i];
    const TaskRegions regions = graph_.regions(tasks_[in.task]);
    for (int r = 0; r < regions.num_reads; ++r) {
      const Region& read = regions.reads[r];
      if (buffers_[read.buffer].host_written) continue;
      int32_t hole_row = read.row_begin, hole_col = read.col_begin;
      if (covered(in, r, read, &hole_row, &hole_col)) continue;
      const uint32_t writer = grids_[read.buffer].writer_at(hole_row, hole_col);
      if (writer == kNone) {
        throw Error(fmt::format("{}: reads {}, but no task writes row {} col {}", where_task(in.task),
                                region_text(graph_, read), hole_row, hole_col));
      }
      throw Error(fmt::format("{}: reads {}, but row {} col {} is written by {} (counter {}), which it does not wait "
                              "for, directly or transitively",
                              where_task(in.task), region_text(graph_, read), hole_row, hole_col, where_task(writer),
                              instruction_of_task(writer).signal_counter));
    }
  }
}

// Whether the writes of the counters `in` waits for, directly or transitively, cover `read`; the first hole if not.
// A wait guarantees the completion of all the counter's tasks only when its target is the counter's full count.
bool Verifier::covered(const Instruction& in, int read_index, const Region& read, int32_t* hole_row,
                       int32_t* hole_col) {
  auto full_waits_of = [&](const Instruction& waiter, std::vector<uint32_t>& out) {
    for (uint32_t k = 0; k < waiter.num_waits; ++k) {
      const Wait& w = schedule_.waits[waiter.wait_begin + k];
      if (w.target == signals_[w.counter] && w.target > 0) out.push_back(w.counter);
    }
  };
  frontier_.clear();
  full_waits_of(in, frontier_);
  rects_.clear();
  // Direct waits first; then, level by level, the waits of tasks already known complete.
  const uint32_t mark = in.task * TaskRegions::kMaxReads + uint32_t(read_index);
  for (uint32_t c : frontier_) visited_mark_[c] = mark;
  size_t gathered = 0, expanded = 0;
  while (true) {
    for (; gathered < frontier_.size(); ++gathered) {
      const uint32_t c = frontier_[gathered];
      if (counter_exact_[c]) {
        if (intersects(counter_box_[c], read)) rects_.push_back(counter_box_[c]);
        continue;
      }
      for (uint32_t i = counter_begin_[c]; i < counter_begin_[c + 1]; ++i)
        if (intersects(write_of_[counter_tasks_[i]], read)) rects_.push_back(write_of_[counter_tasks_[i]]);
    }
    if (covers(rects_, read, hole_row, hole_col)) return true;
    if (expanded == frontier_.size()) return false;
    const size_t level_end = frontier_.size();
    for (; expanded < level_end; ++expanded) {
      const uint32_t c = frontier_[expanded];
      for (uint32_t j = counter_begin_[c]; j < counter_begin_[c + 1]; ++j) {
        more_.clear();
        full_waits_of(instruction_of_task(counter_tasks_[j]), more_);
        for (uint32_t m : more_) {
          if (visited_mark_[m] == mark) continue;
          visited_mark_[m] = mark;
          frontier_.push_back(m);
        }
      }
    }
  }
}

// ---- liveness: run every SM's list in order; all must finish ----

void Verifier::check_liveness() const {
  const Schedule& s = schedule_;
  const std::vector<uint32_t> done = run_in_order(s, [](uint32_t, uint32_t) {});
  std::vector<uint32_t> value(num_counters_, 0);
  for (uint32_t sm = 0; sm < uint32_t(s.num_sms); ++sm)
    for (uint32_t i = 0; i < done[sm]; ++i) ++value[s.instructions[s.sm_begin[sm] + i].signal_counter];
  for (uint32_t sm = 0; sm < uint32_t(s.num_sms); ++sm) {
    if (done[sm] == s.num_instructions(int32_t(sm))) continue;
    const Instruction& in = s.instructions[s.sm_begin[sm] + done[sm]];
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = s.waits[in.wait_begin + k];
      if (value[w.counter] < w.target) {
        throw Error(fmt::format("deadlock: {} waits forever on counter {} (reaches {} of {}) when every SM runs its "
                                "list in order",
                                where(sm, done[sm]), w.counter, value[w.counter], w.target));
      }
    }
  }
}

}  // namespace

void verify_schedule(const Graph& graph, const Schedule& schedule) { Verifier(graph, schedule).run(); }

}  // namespace mk
