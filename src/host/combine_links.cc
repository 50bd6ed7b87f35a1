// Decode combines linked to their attention tasks, so that on the GPU the last attention task of a group runs its
// combine (include/mk/instruction.h), and the check that the links are whole and right.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "mk/check.h"
#include "mk/kv_cache.h"
#include "mk/schedule.h"

namespace mk {

namespace {

// An attention group: the layer, sequence and kv head of a combine task and of the attention tasks it merges.
using Group = std::tuple<uint16_t, int32_t, int32_t>;

Group group_of(const Instruction& in) { return {in.layer, in.sequence, in.head}; }

std::string where(const Graph& graph, const Schedule& schedule, uint32_t i) {
  const Instruction& in = schedule.instructions[i];
  const std::string task = in.task < graph.tasks().size() ? graph.describe(graph.tasks()[in.task]) : "?";
  const auto after = std::upper_bound(schedule.sm_begin.begin(), schedule.sm_begin.end(), i);
  if (after == schedule.sm_begin.begin()) return fmt::format("instruction {} (task {}: {})", i, in.task, task);
  const uint32_t sm = uint32_t(after - schedule.sm_begin.begin()) - 1;
  return fmt::format("SM {} instruction {} (task {}: {})", sm, i - schedule.sm_begin[sm], in.task, task);
}

// The layer and sequence of the decode attention tasks that alone signal each counter; kMixed where others do, and
// kUnsignalled (matching no combine either) where nothing does.
constexpr Group kMixed{kNoLayer, -1, -1};
constexpr Group kUnsignalled{kNoLayer, -2, -2};
std::vector<Group> attention_of_counters(const Schedule& schedule) {
  std::vector<Group> of(schedule.num_counters, kUnsignalled);
  for (const Instruction& in : schedule.instructions) {
    if (in.signal_counter >= of.size()) continue;
    Group& group = of[in.signal_counter];
    const Group mine = in.opcode == Opcode::kDecodeAttention ? Group{in.layer, in.sequence, -1} : kMixed;
    group = group == kUnsignalled || group == mine ? mine : kMixed;
  }
  return of;
}

// A linked combine runs on the GPU once its group's attention tasks are done, whatever it waits for: the verifier's
// proofs through its waits hold only where they wait for attention tasks of its own layer and sequence, whose inputs
// its group's tasks waited for as well. (A combine that waited for another combine, say, would lend the readers of
// its counter a completion that the GPU does not give them.)
void check_combine_waits(const Graph& graph, const Schedule& schedule, const std::vector<Group>& attention_of,
                         uint32_t i) {
  const Instruction& in = schedule.instructions[i];
  for (uint32_t k = 0; k < in.num_waits; ++k) {
    const uint64_t at = uint64_t(in.wait_begin) + k;
    MK_CHECK(at < schedule.waits.size(), "{}: wait list [{}, +{}) lies outside the {} waits", where(graph, schedule, i),
             in.wait_begin, in.num_waits, schedule.waits.size());
    const uint32_t counter = schedule.waits[at].counter;
    const bool own = counter < attention_of.size() && attention_of[counter] == Group{in.layer, in.sequence, -1};
    MK_CHECK(own, "{}: a linked combine waits on counter {}, which not only its sequence's attention tasks signal (the "
             "GPU runs it without waiting)", where(graph, schedule, i), counter);
  }
}

bool inside(const Region& inner, const Region& outer) {
  return inner.buffer == outer.buffer && inner.row_begin >= outer.row_begin && inner.row_end <= outer.row_end &&
         inner.col_begin >= outer.col_begin && inner.col_end <= outer.col_end;
}

// The checks of one linked attention instruction, `attention`, against the combine it names.
void check_attention_link(const Graph& graph, const Schedule& schedule, uint32_t attention) {
  const Instruction& in = schedule.instructions[attention];
  const std::string at = where(graph, schedule, attention);
  MK_CHECK(in.combine_instruction < schedule.instructions.size(), "{}: links combine instruction {} of {}", at,
           in.combine_instruction, schedule.instructions.size());
  const Instruction& combine = schedule.instructions[in.combine_instruction];
  MK_CHECK(combine.task < graph.tasks().size(), "{}: links an instruction of task {} of {}", at, combine.task,
           graph.tasks().size());
  const std::string target = where(graph, schedule, in.combine_instruction);
  MK_CHECK(combine.opcode == Opcode::kDecodeCombine, "{}: links {}, which is not a decode combine", at, target);
  MK_CHECK(group_of(combine) == group_of(in), "{}: links {}, the combine of another layer, sequence or kv head", at,
           target);
  // The GPU runs the combine from the attention instruction's own fields: they must give the combine's rows and
  // columns, and its counter.
  const int64_t width = graph.config().group_size() * graph.config().head_dim;
  MK_CHECK(combine.row_begin == in.sequence && combine.row_end == in.sequence + 1 &&
               combine.col_begin == in.head * width && combine.col_end == (in.head + 1) * width,
           "{}: links {}, whose rows and columns are not its sequence's and kv head's", at, target);
  MK_CHECK(in.combine_counter == combine.signal_counter, "{}: links counter {}, but {} signals counter {}", at,
           in.combine_counter, target, combine.signal_counter);
  const TaskRegions attention_regions = graph.regions(graph.tasks()[in.task]);
  const TaskRegions combine_regions = graph.regions(graph.tasks()[combine.task]);
  MK_CHECK(combine_regions.num_reads > 0 && inside(attention_regions.write, combine_regions.reads[0]),
           "{}: links {}, which does not read what it writes", at, target);
}

}  // namespace

void link_decode_combines(const Graph& graph, Schedule& schedule) {
  if (graph.shape().pass != PassKind::kDecode) return;
  std::vector<Instruction>& instructions = schedule.instructions;
  std::map<Group, uint32_t> combine_of;
  for (uint32_t i = 0; i < instructions.size(); ++i)
    if (instructions[i].opcode == Opcode::kDecodeCombine) combine_of[group_of(instructions[i])] = i;
  for (Instruction& in : instructions) {
    if (in.opcode != Opcode::kDecodeAttention) continue;
    const auto found = combine_of.find(group_of(in));
    MK_CHECK(found != combine_of.end(), "internal error: no decode combine for {}",
             graph.describe(graph.tasks()[in.task]));
    Instruction& combine = instructions[found->second];
    in.flags = kAttentionRunsCombine;
    in.combine_instruction = found->second;
    in.combine_counter = combine.signal_counter;
    combine.flags = kCombineRunByLastAttention;
  }
}

void check_combine_links(const Graph& graph, const Schedule& schedule) {
  const std::vector<Instruction>& instructions = schedule.instructions;
  const std::vector<Task>& tasks = graph.tasks();
  for (uint32_t i = 0; i < instructions.size(); ++i) {
    const Instruction& in = instructions[i];
    // The GPU derives a linked task's ticket and its combine's rows from these fields: they must be its task's.
    const bool faithful = in.task < tasks.size() && tasks[in.task].opcode == in.opcode &&
                          tasks[in.task].layer == in.layer && tasks[in.task].sequence == in.sequence &&
                          tasks[in.task].head == in.head;
    MK_CHECK(in.flags == 0 || faithful, "{}: a linked instruction whose fields are not its task's",
             where(graph, schedule, i));
    const uint8_t allowed = in.opcode == Opcode::kDecodeCombine     ? kCombineRunByLastAttention
                            : in.opcode == Opcode::kDecodeAttention ? kAttentionRunsCombine
                                                                    : 0;
    MK_CHECK((in.flags & ~allowed) == 0, "{}: flags {:#x}, which its opcode cannot have", where(graph, schedule, i),
             in.flags);
    MK_CHECK(in.opcode != Opcode::kDecodeCombine || in.flags == kCombineRunByLastAttention,
             "{}: a decode combine not linked to its attention tasks (the GPU runs combines only in the last of them)",
             where(graph, schedule, i));
  }
  const std::vector<Group> attention_of = attention_of_counters(schedule);
  std::vector<uint32_t> links(instructions.size(), 0);
  for (uint32_t i = 0; i < instructions.size(); ++i) {
    if (instructions[i].flags & kCombineRunByLastAttention) check_combine_waits(graph, schedule, attention_of, i);
    if ((instructions[i].flags & kAttentionRunsCombine) == 0) continue;
    check_attention_link(graph, schedule, i);
    ++links[instructions[i].combine_instruction];
  }
  // The GPU takes the group's last ticket as the splits' count: every task of the group must take one.
  const int64_t splits = graph.shape().pass == PassKind::kDecode ? kv_split(graph.config(), graph.shape()).splits : 0;
  for (uint32_t i = 0; i < instructions.size(); ++i) {
    if ((instructions[i].flags & kCombineRunByLastAttention) == 0) continue;
    MK_CHECK(links[i] == splits, "{}: runs in its last attention task, but {} of the {} tasks of its group link it",
             where(graph, schedule, i), links[i], splits);
  }
}

}  // namespace mk
