// The schedule: per-SM instruction lists with their counter waits, the policies that build it, the cost-model
// estimate behind `mk schedule --explain`, the static verifier, and the schedule file format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mk/graph.h"
#include "mk/instruction.h"

namespace mk {

enum class SchedulePolicy {
  kRoundRobin,  // the seed's: tasks dealt to SMs in graph order
  kCostModel,   // list scheduling by estimated time: earliest start first, then the longest remaining path; the
                // SM that fits best when nothing is ready yet; forward or backward, whichever the model finds faster
};

enum class ListDirection {
  // Places tasks from the start: SMs are packed tight early, and the last op's tiles end where they fall (one layer of
  // d_model 1280: 160 down tiles of ~30 us on 132 SMs leave 28 of them in a second round, most SMs idle).
  kForward,
  // Places the reversed graph from the end, then reads each SM's list back to front: the last ops' rounds are packed
  // tight and the ragged edge falls at the start, where tiles wait on nothing and run early anyway.
  kBackward,
};
SchedulePolicy parse_schedule_policy(const std::string& name);  // "round-robin" | "cost-model"
const char* schedule_policy_name(SchedulePolicy policy);

struct Schedule {
  int32_t num_sms = 0;
  SchedulePolicy policy = SchedulePolicy::kCostModel;
  uint32_t num_counters = 0;
  std::vector<uint32_t> sm_begin;         // (num_sms + 1): SM s runs instructions[sm_begin[s], sm_begin[s + 1])
  std::vector<Instruction> instructions;  // (num_tasks)
  std::vector<Wait> waits;                // (total waits): the lists Instruction::wait_begin/num_waits point into

  size_t num_instructions(int32_t sm) const { return sm_begin[size_t(sm) + 1] - sm_begin[size_t(sm)]; }
  // The target (signals a launch) of the wait on `counter` of SM sm's instruction `instruction` (its place in the
  // SM's list), or 0 where there is none: a stalled wait's reported target over it is its launch's epoch.
  uint32_t wait_target(int32_t sm, uint32_t instruction, uint32_t counter) const;
};

// Estimated time of one task on one SM, from its FLOPs and bytes and its op's rates and fixed time (TaskWork; see
// schedule.cc for the default rates).
double estimated_task_ns(const TaskWork& work);

Schedule make_schedule(const Graph& graph, const Dependencies& deps, SchedulePolicy policy, int32_t num_sms);
// The cost-model policy's list schedule in one direction.
Schedule make_list_schedule(const Graph& graph, const Dependencies& deps, int32_t num_sms, ListDirection direction);

// What the cost model predicts when every SM runs its list in order.
struct ScheduleEstimate {
  double makespan_ns = 0;
  double critical_path_ns = 0;          // longest dependency chain, whatever the SM count
  std::vector<double> busy_ns;          // (num_sms)
  std::vector<double> finish_ns;        // (num_sms) when each SM runs out of work
  std::vector<uint32_t> critical_path;  // task indices along the longest chain, first to last
  double idle_fraction() const;         // of num_sms * makespan
};
ScheduleEstimate estimate_schedule(const Graph& graph, const Schedule& schedule);
std::string explain_schedule(const Graph& graph, const Schedule& schedule, const ScheduleEstimate& estimate);

// Proves the schedule safe for the graph, or throws mk::Error naming the offending SM and instruction:
// - every task of the graph appears exactly once, with the task's opcode and coordinates;
// - counter ids and wait lists are in range, and every wait target is reachable (no more than the counter's
//   signals per launch);
// - no two tasks write overlapping regions, and the output buffer is written completely;
// - every region a task reads is written completely by tasks it waits for, directly or transitively;
// - running every SM's list in order cannot deadlock (this also rules out cycles);
// - decode combines are linked right (check_combine_links).
void verify_schedule(const Graph& graph, const Schedule& schedule);

// Links each decode combine to the attention tasks whose partials it merges (the flags in include/mk/instruction.h):
// on the GPU the last of them to finish runs it. Schedules of other passes are left as they are. make_schedule links
// every schedule it builds; the GPU runs no unlinked decode combine.
void link_decode_combines(const Graph& graph, Schedule& schedule);
// Throws mk::Error naming the instruction unless every link is whole and right: every decode combine is linked (the GPU
// runs no other); a linked attention task names a linked combine of its layer, sequence and kv head, and that
// combine's counter; every linked combine has all the kv split's attention tasks of its group linked to it, their
// writes inside its read; no other instruction has a flag. Part of verify_schedule.
void check_combine_links(const Graph& graph, const Schedule& schedule);

// The per-op-launch ablation: one schedule per program step (an op of one layer), holding each SM's instructions of
// that step in their order, to be launched one after another (`mk run --launch-per-op`). Waits and counters stay the
// whole schedule's: a step waits only on earlier steps, which the launches before it completed. Decode combines stay
// linked: the attention step's launch runs them, the combine step's skips them (their combine_instruction still
// indexes the whole schedule, which only traced launches read, and per-step launches are never traced).
std::vector<Schedule> split_schedule_by_step(const Graph& graph, const Schedule& schedule);

// Binary schedule file: a magic, the model, shape and tile sizes it was built for (JSON), then the arrays.
void save_schedule(const std::filesystem::path& path, const Graph& graph, const Schedule& schedule);
struct LoadedSchedule {
  ModelConfig config;
  RunShape shape;
  Schedule schedule;
};
// Refuses a file built with other tile sizes than include/mk/tiles.h's; checks structure only: verify against the
// Graph of `config` and `shape` next. Reads nothing but a regular file, and allocates only after the header's counts
// agree with the file's size (and counters number no more than instructions).
LoadedSchedule load_schedule(const std::filesystem::path& path);
// The same, for `graph`: a file built for another shape or model, or with another task count, is refused before its
// arrays are read.
LoadedSchedule load_schedule(const std::filesystem::path& path, const Graph& graph);

}  // namespace mk
