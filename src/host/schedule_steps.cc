// A schedule cut into one schedule per program step, for the per-op-launch ablation (`mk run --launch-per-op`).
#include <cstddef>
#include <vector>

#include "mk/check.h"
#include "mk/schedule.h"

namespace mk {

namespace {

// (num_tasks): the program step of each task. The graph makes a step's tasks one after another, so a step is a run
// of tasks of one (opcode, layer).
std::vector<uint32_t> step_of_tasks(const Graph& graph) {
  const std::vector<Task>& tasks = graph.tasks();
  std::vector<uint32_t> step(tasks.size());
  uint32_t current = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (i > 0 && (tasks[i].opcode != tasks[i - 1].opcode || tasks[i].layer != tasks[i - 1].layer)) ++current;
    step[i] = current;
  }
  return step;
}

}  // namespace

std::vector<Schedule> split_schedule_by_step(const Graph& graph, const Schedule& schedule) {
  const std::vector<uint32_t> step_of_task = step_of_tasks(graph);
  const size_t num_steps = step_of_task.empty() ? 0 : size_t(step_of_task.back()) + 1;
  std::vector<Schedule> steps(num_steps);
  for (Schedule& step : steps) {
    step.num_sms = schedule.num_sms;
    step.policy = schedule.policy;
    step.num_counters = schedule.num_counters;
    step.waits = schedule.waits;
  }
  for (int32_t sm = 0; sm < schedule.num_sms; ++sm) {
    for (Schedule& step : steps) step.sm_begin.push_back(uint32_t(step.instructions.size()));
    for (uint32_t i = schedule.sm_begin[size_t(sm)]; i < schedule.sm_begin[size_t(sm) + 1]; ++i) {
      const Instruction& in = schedule.instructions[i];
      MK_CHECK(in.task < step_of_task.size(), "internal error: instruction {} of SM {} names task {} of {}", i, sm,
               in.task, step_of_task.size());
      steps[step_of_task[in.task]].instructions.push_back(in);
    }
  }
  for (Schedule& step : steps) step.sm_begin.push_back(uint32_t(step.instructions.size()));
  return steps;
}

}  // namespace mk
