// List scheduling over counter dependencies, forward or backward: the cost-model policy's placement of tasks on SMs.
#include "list_schedule.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>
#include <set>
#include <span>

namespace mk {

namespace {

// Rows of variable-length lists of indices, stored back to back.
struct Csr {
  std::vector<uint32_t> begin;  // (rows + 1)
  std::vector<uint32_t> items;  // (total items)
  std::span<const uint32_t> row(size_t r) const { return {items.data() + begin[r], items.data() + begin[r + 1]}; }
  size_t rows() const { return begin.size() - 1; }
};

// Per column in [0, columns), the rows that list it, in row order.
Csr transpose(const Csr& rows, size_t columns) {
  Csr t;
  t.begin.assign(columns + 1, 0);
  for (uint32_t c : rows.items) ++t.begin[c + 1];
  for (size_t c = 0; c < columns; ++c) t.begin[c + 1] += t.begin[c];
  t.items.resize(rows.items.size());
  std::vector<uint32_t> fill(t.begin.begin(), t.begin.end() - 1);
  for (size_t r = 0; r < rows.rows(); ++r)
    for (uint32_t c : rows.row(r)) t.items[fill[c]++] = uint32_t(r);
  return t;
}

// The dependencies as list scheduling sees them: a task may start once every group it consumes is complete, and a
// group is complete once all its producers have finished. Forward, the groups are the counters (a task consumes the
// counters it waits on and produces the one it signals); backward, the same edges point the other way.
struct GroupGraph {
  Csr consumed;                          // per task, the groups it needs
  Csr produced;                          // per task, the groups it helps complete
  Csr consumers;                         // per group, the tasks that need it
  std::vector<uint32_t> producer_count;  // (groups)
  bool graph_order_is_topological;       // forward: yes; backward: reverse graph order is
};

GroupGraph group_graph(const Dependencies& deps, ListDirection direction) {
  const size_t num_tasks = deps.counter_of_task.size();
  Csr waited;  // per task, the counters it waits on
  waited.begin.assign(num_tasks + 1, 0);
  waited.items.reserve(std::accumulate(deps.num_waits.begin(), deps.num_waits.end(), size_t(0)));
  for (size_t t = 0; t < num_tasks; ++t) {
    waited.begin[t + 1] = waited.begin[t] + deps.num_waits[t];
    for (uint32_t k = 0; k < deps.num_waits[t]; ++k) waited.items.push_back(deps.waits[deps.wait_begin[t] + k].counter);
  }
  Csr signalled;  // per task, the one counter it signals
  signalled.begin.resize(num_tasks + 1);
  for (size_t t = 0; t <= num_tasks; ++t) signalled.begin[t] = uint32_t(t);
  signalled.items = deps.counter_of_task;
  Csr waiters = transpose(waited, deps.num_counters);
  Csr signallers = transpose(signalled, deps.num_counters);

  GroupGraph g;
  g.graph_order_is_topological = direction == ListDirection::kForward;
  if (direction == ListDirection::kForward) {
    g.consumed = std::move(waited);
    g.produced = std::move(signalled);
    g.consumers = std::move(waiters);
    g.producer_count = deps.counter_target;
  } else {
    g.producer_count.resize(deps.num_counters);
    for (uint32_t c = 0; c < deps.num_counters; ++c) g.producer_count[c] = uint32_t(waiters.row(c).size());
    g.consumed = std::move(signalled);
    g.produced = std::move(waited);
    g.consumers = std::move(signallers);
  }
  return g;
}

// Each task's priority: the longest estimated path from its start to the end of the schedule ("bottom level"). One
// sweep against topological order suffices.
std::vector<double> bottom_levels(const std::vector<double>& cost, const GroupGraph& g) {
  const size_t n = cost.size();
  std::vector<double> bottom_level(n);
  std::vector<double> group_level(g.producer_count.size(), 0.0);
  for (size_t i = 0; i < n; ++i) {
    const size_t t = g.graph_order_is_topological ? n - 1 - i : i;
    double after = 0.0;
    for (uint32_t group : g.produced.row(t)) after = std::max(after, group_level[group]);
    bottom_level[t] = cost[t] + after;
    for (uint32_t group : g.consumed.row(t)) group_level[group] = std::max(group_level[group], bottom_level[t]);
  }
  return bottom_level;
}

// Earliest start first: of the tasks whose groups are complete, those ready by the time an SM frees up go by priority
// onto the SM freed first; when none is, the task ready soonest goes onto the SM freed last among those free by then
// (best fit). NOTE: placing the highest-priority task whatever its ready time left SMs idle while ready tasks waited,
// and lost to round-robin on uneven shapes once the model was calibrated. Returns each SM's tasks in placement order.
std::vector<std::vector<uint32_t>> place(const std::vector<double>& cost, const GroupGraph& g, int32_t num_sms) {
  const std::vector<double> bottom_level = bottom_levels(cost, g);
  const size_t num_groups = g.producer_count.size();
  std::vector<uint32_t> pending(cost.size(), 0);
  for (size_t t = 0; t < cost.size(); ++t)
    for (uint32_t group : g.consumed.row(t)) pending[t] += g.producer_count[group] > 0;
  std::vector<uint32_t> placed_in_group(num_groups, 0);
  std::vector<double> group_finish(num_groups, 0.0);
  // NOTE: the heaps hold their keys by value: comparing through an index into bottom_level cost a cache miss per
  // comparison on large graphs. Ties go to the task earlier in topological order, keeping graph order among equals.
  const auto tie_rank = [&](uint32_t t) { return g.graph_order_is_topological ? -int64_t(t) : int64_t(t); };
  using ByPriority = std::pair<double, int64_t>;    // (bottom level, tie rank)
  using ByReadyTime = std::pair<double, uint32_t>;  // (ready at, task)
  std::priority_queue<ByPriority> ready;
  std::priority_queue<ByReadyTime, std::vector<ByReadyTime>, std::greater<>> waiting;
  const auto task_of = [&](int64_t rank) { return uint32_t(g.graph_order_is_topological ? -rank : rank); };
  const auto ready_at = [&](uint32_t t) {
    double at = 0.0;
    for (uint32_t group : g.consumed.row(t)) at = std::max(at, group_finish[group]);
    return at;
  };
  const auto make_ready = [&] {
    ready.push({bottom_level[waiting.top().second], tie_rank(waiting.top().second)});
    waiting.pop();
  };
  for (uint32_t t = 0; t < cost.size(); ++t)
    if (pending[t] == 0) waiting.push({0.0, t});
  using SmSlot = std::pair<double, int32_t>;  // (free at, sm)
  std::set<SmSlot> sms;
  for (int32_t s = 0; s < num_sms; ++s) sms.insert({0.0, s});
  std::vector<std::vector<uint32_t>> lists(static_cast<size_t>(num_sms));
  while (!ready.empty() || !waiting.empty()) {
    while (!waiting.empty() && waiting.top().first <= sms.begin()->first) make_ready();
    auto slot = sms.begin();
    if (ready.empty()) {
      const double soonest = waiting.top().first;
      while (!waiting.empty() && waiting.top().first == soonest) make_ready();
      slot = std::prev(sms.upper_bound({soonest, std::numeric_limits<int32_t>::max()}));
    }
    const uint32_t t = task_of(ready.top().second);
    ready.pop();
    const auto [free_at, sm] = *slot;
    sms.erase(slot);
    const double finish = std::max(free_at, ready_at(t)) + cost[t];
    sms.insert({finish, sm});
    lists[size_t(sm)].push_back(t);
    for (uint32_t group : g.produced.row(t)) {
      group_finish[group] = std::max(group_finish[group], finish);
      if (++placed_in_group[group] < g.producer_count[group]) continue;
      for (uint32_t waiter : g.consumers.row(group))
        if (--pending[waiter] == 0) waiting.push({ready_at(waiter), waiter});
    }
  }
  return lists;
}

}  // namespace

std::vector<std::vector<uint32_t>> list_schedule(const std::vector<double>& cost, const Dependencies& deps,
                                                 int32_t num_sms, ListDirection direction) {
  std::vector<std::vector<uint32_t>> lists = place(cost, group_graph(deps, direction), num_sms);
  // Backward, an SM's placements run from the pass's end toward its start.
  if (direction == ListDirection::kBackward)
    for (auto& list : lists) std::reverse(list.begin(), list.end());
  return lists;
}

}  // namespace mk
