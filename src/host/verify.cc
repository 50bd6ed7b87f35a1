// The static schedule verifier: proves a schedule safe for its graph or names the instruction that is not.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "mk/check.h"
#include "mk/schedule.h"
#include "in_order.h"
#include "writer_grid.h"

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

}  // namespace

void verify_schedule(const Graph& graph, const Schedule& schedule) {
  const std::vector<Task>& tasks = graph.tasks();
  const std::vector<Buffer>& buffers = graph.buffers();
  const size_t num_tasks = tasks.size();
  const uint32_t num_counters = schedule.num_counters;

  // ---- structure: every task exactly once, instructions faithful to their tasks, indices in range ----
  MK_CHECK(schedule.num_sms > 0 && schedule.sm_begin.size() == size_t(schedule.num_sms) + 1,
           "schedule: {} SM offsets for {} SMs", schedule.sm_begin.size(), schedule.num_sms);
  MK_CHECK(schedule.sm_begin.front() == 0 && schedule.sm_begin.back() == schedule.instructions.size(),
           "schedule: SM offsets do not span the {} instructions", schedule.instructions.size());
  MK_CHECK(schedule.instructions.size() == num_tasks, "schedule has {} instructions, the graph {} tasks",
           schedule.instructions.size(), num_tasks);
  for (uint32_t sm = 0; sm < uint32_t(schedule.num_sms); ++sm) {
    MK_CHECK(schedule.sm_begin[sm] <= schedule.sm_begin[sm + 1] && schedule.sm_begin[sm + 1] <= num_tasks,
             "schedule: SM {}'s instructions [{}, {}) are not a range of the {} instructions", sm,
             schedule.sm_begin[sm], schedule.sm_begin[sm + 1], num_tasks);
  }
  std::vector<Position> position(num_tasks);
  auto where = [&](uint32_t sm, uint32_t index) {
    const Instruction& in = schedule.instructions[schedule.sm_begin[sm] + index];
    const std::string what = in.task < num_tasks ? graph.describe(tasks[in.task]) : std::string("?");
    return fmt::format("SM {} instruction {} (task {}: {})", sm, index, in.task, what);
  };
  auto where_task = [&](uint32_t t) { return where(position[t].sm, position[t].index); };
  // NOTE: instructions are in SM order, tasks in graph order: each access to a task's entries is a cache miss on
  // large graphs unless it is prefetched a few instructions ahead.
  constexpr size_t kPrefetchDistance = 16;
  auto prefetch_task_of = [&](size_t instruction) {
    if (instruction >= schedule.instructions.size()) return;
    const uint32_t task = schedule.instructions[instruction].task;
    if (task >= num_tasks) return;
    __builtin_prefetch(&tasks[task]);
    __builtin_prefetch(&position[task]);
  };
  for (uint32_t sm = 0; sm < uint32_t(schedule.num_sms); ++sm) {
    for (uint32_t i = schedule.sm_begin[sm]; i < schedule.sm_begin[sm + 1]; ++i) {
      prefetch_task_of(i + kPrefetchDistance);
      const Instruction& in = schedule.instructions[i];
      const uint32_t index = i - schedule.sm_begin[sm];
      MK_CHECK(in.task < num_tasks, "SM {} instruction {}: task index {} is out of range ({} tasks)", sm, index,
               in.task, num_tasks);
      MK_CHECK(position[in.task].sm == kNone, "{}: the task also appears as {}", where(sm, index),
               where_task(in.task));
      position[in.task] = {sm, index};
      const Task& t = tasks[in.task];
      MK_CHECK(in.opcode == t.opcode && in.layer == t.layer && in.row_begin == t.row_begin && in.row_end == t.row_end &&
                   in.col_begin == t.col_begin && in.col_end == t.col_end && in.sequence == t.sequence &&
                   in.head == t.head,
               "SM {} instruction {}: does not match task {} ({}): opcode {} layer {} rows [{},{}) cols [{},{})", sm,
               index, in.task, graph.describe(t), opcode_name(in.opcode), in.layer, in.row_begin, in.row_end,
               in.col_begin, in.col_end);
      MK_CHECK(in.signal_counter < num_counters, "{}: signals counter {} of {}", where(sm, index), in.signal_counter,
               num_counters);
      MK_CHECK(uint64_t(in.wait_begin) + in.num_waits <= schedule.waits.size(),
               "{}: wait list [{}, +{}) lies outside the {} waits", where(sm, index), in.wait_begin, in.num_waits,
               schedule.waits.size());
      for (uint32_t k = 0; k < in.num_waits; ++k)
        MK_CHECK(schedule.waits[in.wait_begin + k].counter < num_counters, "{}: waits on counter {} of {}",
                 where(sm, index), schedule.waits[in.wait_begin + k].counter, num_counters);
    }
  }

  // ---- counters: signals per launch, and reachable targets ----
  std::vector<uint32_t> signals(num_counters, 0);
  for (const Instruction& in : schedule.instructions) ++signals[in.signal_counter];
  for (const Instruction& in : schedule.instructions) {
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = schedule.waits[in.wait_begin + k];
      MK_CHECK(w.target <= signals[w.counter],
               "{}: waits for counter {} to reach {} per launch, but only {} tasks signal it: unreachable",
               where_task(in.task), w.counter, w.target, signals[w.counter]);
    }
  }
  // counter -> its tasks (CSR)
  std::vector<uint32_t> counter_begin(num_counters + 1, 0);
  for (const Instruction& in : schedule.instructions) ++counter_begin[in.signal_counter + 1];
  for (uint32_t c = 0; c < num_counters; ++c) counter_begin[c + 1] += counter_begin[c];
  std::vector<uint32_t> counter_tasks(num_tasks);
  {
    std::vector<uint32_t> fill(counter_begin.begin(), counter_begin.end() - 1);
    for (const Instruction& in : schedule.instructions) counter_tasks[fill[in.signal_counter]++] = in.task;
  }

  // ---- writes: inside their buffer, never overlapping, the output complete ----
  std::vector<Region> write_of(num_tasks);
  for (size_t t = 0; t < num_tasks; ++t) {
    const Region w = graph.regions(tasks[t]).write;
    const Buffer& b = buffers[w.buffer];
    MK_CHECK(!b.host_written, "{}: writes {}, which the host writes", where_task(uint32_t(t)), b.name());
    MK_CHECK(w.row_begin >= 0 && w.row_begin < w.row_end && w.row_end <= b.rows && w.col_begin >= 0 &&
                 w.col_begin < w.col_end && w.col_end <= b.cols,
             "{}: writes {} outside the buffer's ({}, {})", where_task(uint32_t(t)), region_text(graph, w), b.rows,
             b.cols);
    write_of[t] = w;
  }
  const std::vector<WriterGrid> grids = build_writer_grids(graph, [&](uint32_t first, uint32_t second, const Region& cell) {
    throw Error(fmt::format("{} and {} both write {}", where_task(first), where_task(second), region_text(graph, cell)));
  });
  {
    const uint32_t out = graph.output_buffer();
    const Buffer& b = buffers[out];
    const WriterGrid& grid = grids[out];
    const bool spans = !grid.row_bounds.empty() && grid.row_bounds.front() == 0 && grid.row_bounds.back() == b.rows &&
                       grid.col_bounds.front() == 0 && grid.col_bounds.back() == b.cols;
    MK_CHECK(spans, "the output {} is not written completely: the writes span rows [{},{}) cols [{},{}) of ({}, {})",
             b.name(), spans ? 0 : (grid.row_bounds.empty() ? 0 : grid.row_bounds.front()),
             grid.row_bounds.empty() ? 0 : grid.row_bounds.back(), grid.col_bounds.empty() ? 0 : grid.col_bounds.front(),
             grid.col_bounds.empty() ? 0 : grid.col_bounds.back(), b.rows, b.cols);
    for (size_t cell = 0; cell < grid.writer.size(); ++cell) {
      MK_CHECK(grid.writer[cell] != WriterGrid::kNoWriter, "the output {} is not written completely: nothing writes rows [{},{}) cols [{},{})",
               b.name(), grid.row_bounds[cell / grid.num_col_cells()], grid.row_bounds[cell / grid.num_col_cells() + 1],
               grid.col_bounds[cell % grid.num_col_cells()], grid.col_bounds[cell % grid.num_col_cells() + 1]);
    }
  }

  // NOTE: a counter whose tasks write one buffer and tile their bounding box exactly (writes never overlap, checked
  // above) stands for that box: coverage then looks at one rectangle per counter instead of one per task.
  std::vector<Region> counter_box(num_counters);
  std::vector<char> counter_exact(num_counters, 0);
  for (uint32_t c = 0; c < num_counters; ++c) {
    if (counter_begin[c] == counter_begin[c + 1]) continue;
    Region box = write_of[counter_tasks[counter_begin[c]]];
    int64_t area = 0;
    bool one_buffer = true;
    for (uint32_t i = counter_begin[c]; i < counter_begin[c + 1]; ++i) {
      const Region& w = write_of[counter_tasks[i]];
      one_buffer &= w.buffer == box.buffer;
      box.row_begin = std::min(box.row_begin, w.row_begin);
      box.row_end = std::max(box.row_end, w.row_end);
      box.col_begin = std::min(box.col_begin, w.col_begin);
      box.col_end = std::max(box.col_end, w.col_end);
      area += w.area();
    }
    counter_box[c] = box;
    counter_exact[c] = one_buffer && area == box.area();
  }

  // ---- reads: covered by the writes of tasks the reader waits for, directly or transitively ----
  // A wait guarantees the completion of all the counter's tasks only when its target is the counter's full count.
  auto full_waits_of = [&](const Instruction& in, std::vector<uint32_t>& out) {
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = schedule.waits[in.wait_begin + k];
      if (w.target == signals[w.counter] && w.target > 0) out.push_back(w.counter);
    }
  };
  auto full_waits = [&](uint32_t t, std::vector<uint32_t>& out) {
    full_waits_of(schedule.instructions[schedule.sm_begin[position[t].sm] + position[t].index], out);
  };
  std::vector<uint32_t> frontier, more, visited_mark(num_counters, kNone);
  std::vector<Region> rects;
  for (size_t i = 0; i < schedule.instructions.size(); ++i) {
    prefetch_task_of(i + kPrefetchDistance);
    const Instruction& in = schedule.instructions[i];
    const uint32_t t = in.task;
    const TaskRegions regions = graph.regions(tasks[t]);
    for (int r = 0; r < regions.num_reads; ++r) {
      const Region& read = regions.reads[r];
      if (buffers[read.buffer].host_written) continue;
      frontier.clear();
      full_waits_of(in, frontier);
      rects.clear();
      // Direct waits first; then, level by level, the waits of tasks already known complete, which the reader
      // awaits transitively.
      const uint32_t mark = uint32_t(t) * TaskRegions::kMaxReads + uint32_t(r);
      for (uint32_t c : frontier) visited_mark[c] = mark;
      size_t gathered = 0, expanded = 0;
      bool covered = false;
      int32_t hole_row = read.row_begin, hole_col = read.col_begin;
      while (true) {
        for (; gathered < frontier.size(); ++gathered) {
          const uint32_t c = frontier[gathered];
          if (counter_exact[c]) {
            if (intersects(counter_box[c], read)) rects.push_back(counter_box[c]);
            continue;
          }
          for (uint32_t i = counter_begin[c]; i < counter_begin[c + 1]; ++i)
            if (intersects(write_of[counter_tasks[i]], read)) rects.push_back(write_of[counter_tasks[i]]);
        }
        covered = covers(rects, read, &hole_row, &hole_col);
        if (covered || expanded == frontier.size()) break;
        const size_t level_end = frontier.size();
        for (; expanded < level_end; ++expanded) {
          const uint32_t c = frontier[expanded];
          for (uint32_t j = counter_begin[c]; j < counter_begin[c + 1]; ++j) {
            more.clear();
            full_waits(counter_tasks[j], more);
            for (uint32_t m : more) {
              if (visited_mark[m] == mark) continue;
              visited_mark[m] = mark;
              frontier.push_back(m);
            }
          }
        }
      }
      if (!covered) {
        const uint32_t writer = grids[read.buffer].writer_at(hole_row, hole_col);
        if (writer == kNone) {
          throw Error(fmt::format("{}: reads {}, but no task writes row {} col {}", where_task(uint32_t(t)),
                                  region_text(graph, read), hole_row, hole_col));
        }
        const Instruction& w = schedule.instructions[schedule.sm_begin[position[writer].sm] + position[writer].index];
        throw Error(fmt::format("{}: reads {}, but row {} col {} is written by {} (counter {}), which it does not wait "
                                "for, directly or transitively",
                                where_task(uint32_t(t)), region_text(graph, read), hole_row, hole_col,
                                where_task(writer), w.signal_counter));
      }
    }
  }

  // ---- liveness: run every SM's list in order; all must finish ----
  const std::vector<uint32_t> done = run_in_order(schedule, [](uint32_t, uint32_t) {});
  std::vector<uint32_t> value(num_counters, 0);
  for (uint32_t sm = 0; sm < uint32_t(schedule.num_sms); ++sm)
    for (uint32_t i = 0; i < done[sm]; ++i) ++value[schedule.instructions[schedule.sm_begin[sm] + i].signal_counter];
  for (uint32_t sm = 0; sm < uint32_t(schedule.num_sms); ++sm) {
    if (done[sm] == schedule.num_instructions(int32_t(sm))) continue;
    const Instruction& in = schedule.instructions[schedule.sm_begin[sm] + done[sm]];
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = schedule.waits[in.wait_begin + k];
      if (value[w.counter] < w.target) {
        throw Error(fmt::format("deadlock: {} waits forever on counter {} (reaches {} of {}) when every SM runs its "
                                "list in order",
                                where(sm, done[sm]), w.counter, value[w.counter], w.target));
      }
    }
  }
}

}  // namespace mk
