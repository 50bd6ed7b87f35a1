// Schedule construction (round-robin and cost-model list scheduling), the cost-model estimate and its explanation,
// and the schedule file format.
#include "mk/schedule.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "in_order.h"
#include "list_schedule.h"
#include "mk/check.h"
#include "mk/files.h"
#include "mk/limits.h"
#include "mk/tiles.h"

namespace mk {

namespace {

// NOTE: per-SM rates of an H200 (132 SMs) for a GEMM tile, with a fixed cost per instruction for fetch, waits and
// pipeline fill; ops whose tiles run otherwise say so in their TaskWork. Calibrated on the traced per-tile math and
// epilogue times of the sixth to eighth sessions (docs/perf.md, ninth session): GEMM tiles 5.2-6.6 TFLOP/s a SM and
// ~85 B/ns of operands; at 5000 FLOP/ns and 60 B/ns the model had them 1.4-1.5x too long, attention 1.5-2x too short
// and norms 2-3x too short, and packed one layer's 160 attention tiles at d_model 1280 onto 48 SMs, up to 5 each,
// so that o_proj tiles waited up to 28 us (eighth session, run 1's trace).
constexpr double kSmFlopsPerNs = 5500.0;
constexpr double kSmBytesPerNs = 90.0;
constexpr double kInstructionOverheadNs = 500.0;
// NOTE: bytes that no other task reads (decode's weights and KV cache) come from HBM, where every SM gets its share
// of the measured 4.2 TB/s when all stream at once: a decode GEMM runs at the bandwidth floor only when its tiles
// cover every SM, which is why decode tiles are narrow (tiles::kDecodeSpreadTasks).
constexpr double kHbmBytesPerNs = 4200.0;
constexpr double kHbmSms = 132.0;
// The fraction of the forward schedule's estimated makespan that the backward one must save to be chosen.
constexpr double kBackwardMinGain = 0.02;

Instruction make_instruction(const Task& task, uint32_t task_index, const Dependencies& deps) {
  Instruction instruction{};
  instruction.opcode = task.opcode;
  instruction.layer = task.layer;
  instruction.task = task_index;
  instruction.row_begin = task.row_begin;
  instruction.row_end = task.row_end;
  instruction.col_begin = task.col_begin;
  instruction.col_end = task.col_end;
  instruction.sequence = task.sequence;
  instruction.head = task.head;
  instruction.signal_counter = deps.counter_of_task[task_index];
  instruction.wait_begin = deps.wait_begin[task_index];
  instruction.num_waits = deps.num_waits[task_index];
  return instruction;
}

}  // namespace

SchedulePolicy parse_schedule_policy(const std::string& name) {
  if (name == "round-robin") return SchedulePolicy::kRoundRobin;
  if (name == "cost-model") return SchedulePolicy::kCostModel;
  throw Error(fmt::format("unknown schedule policy '{}' (known: round-robin, cost-model)", name));
}

const char* schedule_policy_name(SchedulePolicy policy) {
  return policy == SchedulePolicy::kRoundRobin ? "round-robin" : "cost-model";
}

double estimated_task_ns(const TaskWork& work) {
  const double streamed_ns = work.streamed_bytes / (kHbmBytesPerNs / kHbmSms);
  const double flops_per_ns = work.flops_per_ns > 0 ? work.flops_per_ns : kSmFlopsPerNs;
  const double bytes_per_ns = work.bytes_per_ns > 0 ? work.bytes_per_ns : kSmBytesPerNs;
  return std::max({work.flops / flops_per_ns, work.bytes / bytes_per_ns, streamed_ns}) + kInstructionOverheadNs +
         work.fixed_ns;
}

namespace {

void check_sm_count(int32_t num_sms) {
  MK_CHECK(num_sms > 0 && num_sms <= 4096, "SM count must be in [1, 4096], got {}", num_sms);
}

// (num_tasks) each task's estimated ns.
std::vector<double> estimated_costs(const Graph& graph) {
  const std::vector<Task>& tasks = graph.tasks();
  std::vector<double> cost(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) cost[t] = estimated_task_ns(graph.work(tasks[t]));
  return cost;
}

ScheduleEstimate estimate_with_costs(const Graph& graph, const Schedule& schedule, const std::vector<double>& cost);

// The schedule of per-SM task lists (each in execution order).
Schedule schedule_of_lists(const Graph& graph, const Dependencies& deps, SchedulePolicy policy,
                           const std::vector<std::vector<uint32_t>>& lists) {
  const std::vector<Task>& tasks = graph.tasks();
  Schedule schedule;
  schedule.num_sms = int32_t(lists.size());
  schedule.policy = policy;
  schedule.num_counters = deps.num_counters;
  schedule.waits = deps.waits;
  schedule.sm_begin.reserve(lists.size() + 1);
  schedule.instructions.reserve(tasks.size());
  for (const auto& list : lists) {
    schedule.sm_begin.push_back(uint32_t(schedule.instructions.size()));
    for (uint32_t t : list) schedule.instructions.push_back(make_instruction(tasks[t], t, deps));
  }
  schedule.sm_begin.push_back(uint32_t(schedule.instructions.size()));
  MK_CHECK(schedule.instructions.size() == tasks.size(),
           "internal error: the dependency graph has a cycle ({} of {} tasks placed)", schedule.instructions.size(),
           tasks.size());
  link_decode_combines(graph, schedule);
  return schedule;
}

}  // namespace

Schedule make_list_schedule(const Graph& graph, const Dependencies& deps, int32_t num_sms, ListDirection direction) {
  check_sm_count(num_sms);
  return schedule_of_lists(graph, deps, SchedulePolicy::kCostModel,
                           list_schedule(estimated_costs(graph), deps, num_sms, direction));
}

Schedule make_schedule(const Graph& graph, const Dependencies& deps, SchedulePolicy policy, int32_t num_sms) {
  check_sm_count(num_sms);
  if (policy == SchedulePolicy::kRoundRobin) {
    std::vector<std::vector<uint32_t>> lists(static_cast<size_t>(num_sms));  // task indices per SM, in order
    for (size_t t = 0; t < graph.tasks().size(); ++t) lists[t % size_t(num_sms)].push_back(uint32_t(t));
    return schedule_of_lists(graph, deps, policy, lists);
  }
  // NOTE: backward only where the model sees a tail worth a round's fraction: it misses L2 reuse and the producers'
  // early weight loads, which favour the forward order the tiles were tuned in, by more than 1%.
  // NOTE: one Schedule at a time (the lists are a tenth of its size): holding both raised `mk schedule`'s peak to
  // ~310 bytes a task; this way ~260 (schedule_host_bytes).
  const std::vector<double> cost = estimated_costs(graph);
  const std::vector<std::vector<uint32_t>> forward = list_schedule(cost, deps, num_sms, ListDirection::kForward);
  const double forward_ns =
      estimate_with_costs(graph, schedule_of_lists(graph, deps, policy, forward), cost).makespan_ns;
  Schedule backward =
      schedule_of_lists(graph, deps, policy, list_schedule(cost, deps, num_sms, ListDirection::kBackward));
  if (estimate_with_costs(graph, backward, cost).makespan_ns < (1.0 - kBackwardMinGain) * forward_ns) return backward;
  return schedule_of_lists(graph, deps, policy, forward);
}

uint32_t Schedule::wait_target(int32_t sm, uint32_t instruction, uint32_t counter) const {
  if (sm < 0 || size_t(sm) + 1 >= sm_begin.size() || instruction >= num_instructions(sm)) return 0;
  const Instruction& in = instructions[sm_begin[size_t(sm)] + instruction];
  for (uint32_t k = 0; k < in.num_waits && size_t(in.wait_begin) + k < waits.size(); ++k)
    if (waits[in.wait_begin + k].counter == counter) return waits[in.wait_begin + k].target;
  return 0;
}

double ScheduleEstimate::idle_fraction() const {
  double busy = 0;
  for (double b : busy_ns) busy += b;
  const double capacity = makespan_ns * double(busy_ns.size());
  return capacity > 0 ? 1.0 - busy / capacity : 0.0;
}

ScheduleEstimate estimate_schedule(const Graph& graph, const Schedule& schedule) {
  return estimate_with_costs(graph, schedule, estimated_costs(graph));
}

namespace {

// estimate_schedule, with the tasks' estimated ns (num_tasks) given.
ScheduleEstimate estimate_with_costs(const Graph& graph, const Schedule& schedule, const std::vector<double>& cost) {
  const std::vector<Task>& tasks = graph.tasks();
  const size_t num_sms = size_t(schedule.num_sms);

  ScheduleEstimate estimate;
  estimate.busy_ns.assign(num_sms, 0.0);
  estimate.finish_ns.assign(num_sms, 0.0);

  // Critical path: graph order is topological; a task's earliest finish follows its slowest waited counter.
  std::vector<double> earliest_finish(tasks.size(), 0.0);
  std::vector<double> counter_earliest(schedule.num_counters, 0.0);
  std::vector<uint32_t> counter_last_task(schedule.num_counters, UINT32_MAX);
  std::vector<uint32_t> predecessor(tasks.size(), UINT32_MAX);
  std::vector<const Instruction*> instruction_of_task(tasks.size(), nullptr);
  for (const Instruction& in : schedule.instructions) instruction_of_task[in.task] = &in;
  uint32_t last_task = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const Instruction& in = *instruction_of_task[t];
    double start = 0.0;
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const uint32_t c = schedule.waits[in.wait_begin + k].counter;
      if (counter_earliest[c] > start) {
        start = counter_earliest[c];
        predecessor[t] = counter_last_task[c];
      }
    }
    earliest_finish[t] = start + cost[t];
    if (earliest_finish[t] > counter_earliest[in.signal_counter]) {
      counter_earliest[in.signal_counter] = earliest_finish[t];
      counter_last_task[in.signal_counter] = uint32_t(t);
    }
    if (earliest_finish[t] > earliest_finish[last_task]) last_task = uint32_t(t);
  }
  estimate.critical_path_ns = tasks.empty() ? 0.0 : earliest_finish[last_task];
  for (uint32_t t = last_task; !tasks.empty() && t != UINT32_MAX; t = predecessor[t]) estimate.critical_path.push_back(t);
  std::reverse(estimate.critical_path.begin(), estimate.critical_path.end());

  // In-order execution per SM, each instruction starting when its SM is free and its counters are complete.
  std::vector<double> counter_done(schedule.num_counters, 0.0);
  const std::vector<uint32_t> done = run_in_order(schedule, [&](uint32_t sm, uint32_t index) {
    const Instruction& in = schedule.instructions[schedule.sm_begin[sm] + index];
    double start = estimate.finish_ns[sm];
    for (uint32_t k = 0; k < in.num_waits; ++k) start = std::max(start, counter_done[schedule.waits[in.wait_begin + k].counter]);
    estimate.busy_ns[sm] += cost[in.task];
    estimate.finish_ns[sm] = start + cost[in.task];
    counter_done[in.signal_counter] = std::max(counter_done[in.signal_counter], estimate.finish_ns[sm]);
  });
  for (size_t s = 0; s < num_sms; ++s) {
    MK_CHECK(done[s] == schedule.num_instructions(int32_t(s)), "schedule deadlocks: SM {} is stuck at instruction {}",
             s, done[s]);
    estimate.makespan_ns = std::max(estimate.makespan_ns, estimate.finish_ns[s]);
  }
  return estimate;
}

}  // namespace

std::string explain_schedule(const Graph& graph, const Schedule& schedule, const ScheduleEstimate& estimate) {
  std::string out;
  const auto& tasks = graph.tasks();
  out += fmt::format("schedule: policy {}, {} SMs, {} instructions, {} counters, {} waits\n",
                     schedule_policy_name(schedule.policy), schedule.num_sms, schedule.instructions.size(),
                     schedule.num_counters, schedule.waits.size());
  double total_busy = 0;
  for (double b : estimate.busy_ns) total_busy += b;
  out += fmt::format("estimated makespan {:.1f} us; critical path {:.1f} us; work {:.1f} us over {} SMs = {:.1f} us "
                     "at perfect balance; idle {:.1f}%\n",
                     estimate.makespan_ns / 1e3, estimate.critical_path_ns / 1e3, total_busy / 1e3, schedule.num_sms,
                     total_busy / 1e3 / schedule.num_sms, 100.0 * estimate.idle_fraction());

  std::map<Opcode, std::pair<size_t, double>> per_op;
  for (const Task& task : tasks) {
    auto& [count, ns] = per_op[task.opcode];
    ++count;
    ns += estimated_task_ns(graph.work(task));
  }
  out += "per op (estimated):\n";
  for (const auto& [opcode, entry] : per_op) {
    out += fmt::format("  {:<16} {:>7} tasks  {:>12.1f} us  ({:.1f}%)\n", opcode_name(opcode), entry.first,
                       entry.second / 1e3, 100.0 * entry.second / total_busy);
  }

  out += "critical path:";
  Opcode run_opcode = Opcode::kNop;
  uint16_t run_layer = kNoLayer;
  size_t run_length = 0;
  auto flush = [&] {
    if (run_length == 0) return;
    out += fmt::format(" {}{}{}", opcode_name(run_opcode), run_layer != kNoLayer ? fmt::format(" L{}", run_layer) : "",
                       run_length > 1 ? fmt::format(" x{}", run_length) : "");
  };
  for (uint32_t t : estimate.critical_path) {
    if (tasks[t].opcode != run_opcode || tasks[t].layer != run_layer) {
      flush();
      run_opcode = tasks[t].opcode;
      run_layer = tasks[t].layer;
      run_length = 0;
    }
    ++run_length;
  }
  flush();
  out += "\n";

  out += "per SM: instructions, busy, finish, idle before the makespan\n";
  for (int32_t s = 0; s < schedule.num_sms; ++s) {
    const double busy = estimate.busy_ns[size_t(s)];
    out += fmt::format("  SM {:>3}: {:>7} instr  busy {:>10.1f} us  finish {:>10.1f} us  idle {:>5.1f}%\n", s,
                       schedule.num_instructions(s), busy / 1e3, estimate.finish_ns[size_t(s)] / 1e3,
                       estimate.makespan_ns > 0 ? 100.0 * (1.0 - busy / estimate.makespan_ns) : 0.0);
  }
  return out;
}

// ---- file format ----

namespace {

constexpr char kScheduleMagic[8] = {'M', 'K', 'S', 'C', 'H', 'E', 'D', '3'};

// The tile sizes a schedule was built with: a file made for other tiles describes other tasks.
nlohmann::json tiles_json() {
  return {{"block_m", tiles::kBlockM},       {"block_n", tiles::kBlockN},   {"block_k", tiles::kBlockK},
          {"wide_block_n", tiles::kWideBlockN}, {"wide_gemm_round_tiles", tiles::kWideGemmRoundTiles},
          {"wide_gemm_long_k", tiles::kWideGemmLongK}, {"wide_gemm_long_k_tiles", tiles::kWideGemmLongKTiles},
          {"block_q", tiles::kBlockQ},       {"block_kv", tiles::kBlockKv}, {"block_rows", tiles::kBlockRows},
          {"group_m", tiles::kGroupM},       {"l2_resident_weight_bytes", tiles::kL2ResidentWeightBytes},
          {"decode_spread_tasks", tiles::kDecodeSpreadTasks}, {"decode_min_block_n", tiles::kDecodeMinBlockN},
          {"decode_max_block_n", tiles::kDecodeMaxBlockN},
          {"decode_kv_block", tiles::kDecodeKvBlock},         {"decode_partial_stats", tiles::kDecodePartialStats},
          {"decode_combine_rows", tiles::kDecodeCombineRows}};
}

template <typename T>
void write_array(std::ostream& file, const std::vector<T>& values) {
  file.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * sizeof(T)));
}

// The largest JSON header read: the model config and a few counts take about 1 KB.
constexpr uint64_t kMaxScheduleHeaderBytes = uint64_t(1) << 20;

// A count from the header, as a whole number in [0, limit]: a float, a negative or a 1e24 is refused by name.
int64_t header_count(const nlohmann::json& header, const char* field, int64_t limit) {
  const std::optional<int64_t> value = header.contains(field) ? json_to_int64(header.at(field)) : std::nullopt;
  MK_CHECK(value && *value >= 0 && *value <= limit, "'{}' must be a whole number in [0, {}], got {}", field, limit,
           header.contains(field) ? json_excerpt(header.at(field)) : "nothing");
  return *value;
}

// What the header says; counts checked against their limits, not yet against the file's size.
struct ScheduleHeader {
  LoadedSchedule loaded;
  int64_t num_instructions = 0, num_waits = 0;
};

ScheduleHeader parse_schedule_header(const std::string& text, const std::string& source) {
  const nlohmann::json header = parse_json(text, source + " (header)");
  MK_CHECK(header.is_object(), "expected a JSON object");
  MK_CHECK(header.contains("tiles") && header.at("tiles").is_object(), "missing object 'tiles'");
  const nlohmann::json& tiles = header.at("tiles");
  const nlohmann::json expected_tiles = tiles_json();
  for (const auto& [name, value] : expected_tiles.items()) {
    MK_CHECK(tiles.contains(name) && tiles.at(name) == value,
             "built with other tile sizes: {} {} in the file, {} in this build", name,
             tiles.contains(name) ? json_excerpt(tiles.at(name)) : "missing", value.dump());
  }
  MK_CHECK(header.contains("config"), "missing field 'config'");
  ScheduleHeader result;
  LoadedSchedule& loaded = result.loaded;
  loaded.config = model_config_from_json(header.at("config"), "its model config");
  loaded.shape = {header_count(header, "batch", kMaxTokens), header_count(header, "seq_len", kMaxTokens)};
  // Files from before prefill and decode hold forward passes.
  const nlohmann::json pass = header.value("pass", nlohmann::json(pass_kind_name(PassKind::kForward)));
  MK_CHECK(pass.is_string(), "'pass' must be a string, got {}", json_excerpt(pass));
  for (PassKind kind : {PassKind::kForward, PassKind::kPrefill, PassKind::kDecode})
    if (pass == pass_kind_name(kind)) loaded.shape.pass = kind;
  MK_CHECK(pass == pass_kind_name(loaded.shape.pass), "unknown pass {}", json_excerpt(pass));
  loaded.shape.max_context = header.contains("max_context") ? header_count(header, "max_context", kMaxTokens) : 0;
  if (header.contains("decode_spread"))  // files from before it hold the default
    loaded.shape.decode_spread = header_count(header, "decode_spread", kMaxDecodeSpread);
  loaded.shape.validate();
  loaded.schedule.num_sms = int32_t(header_count(header, "num_sms", 4096));
  MK_CHECK(loaded.schedule.num_sms > 0, "bad SM count 0");
  MK_CHECK(header.contains("policy") && header.at("policy").is_string(), "missing string field 'policy'");
  loaded.schedule.policy = parse_schedule_policy(printable(header.at("policy").get<std::string>()));
  constexpr int64_t kMax32 = int64_t(UINT32_MAX);
  loaded.schedule.num_counters = uint32_t(header_count(header, "num_counters", kMax32));
  result.num_instructions = header_count(header, "num_instructions", kMax32);
  result.num_waits = header_count(header, "num_waits", kMax32);
  return result;
}

// A schedule for another shape, model or task count is refused before its arrays are read.
void check_schedule_fits(const std::string& source, const LoadedSchedule& loaded, uint64_t num_instructions,
                         const Graph& graph) {
  MK_CHECK(loaded.shape == graph.shape(), "{}: built for {}, not {}", source, describe(loaded.shape),
           describe(graph.shape()));
  const std::string difference = first_difference(loaded.config, graph.config());
  MK_CHECK(difference.empty(), "{}: built for another model: {} (file vs model)", source, printable(difference));
  MK_CHECK(num_instructions == graph.tasks().size(), "{}: holds {} instructions, the graph has {} tasks", source,
           num_instructions, graph.tasks().size());
}

}  // namespace

void save_schedule(const std::filesystem::path& path, const Graph& graph, const Schedule& schedule) {
  const nlohmann::json header = {
      {"config", model_config_to_json(graph.config())},
      {"batch", graph.shape().batch},
      {"seq_len", graph.shape().seq_len},
      {"pass", pass_kind_name(graph.shape().pass)},
      {"max_context", graph.shape().max_context},
      {"decode_spread", graph.shape().decode_spread},
      {"tiles", tiles_json()},
      {"num_sms", schedule.num_sms},
      {"policy", schedule_policy_name(schedule.policy)},
      {"num_counters", schedule.num_counters},
      {"num_instructions", schedule.instructions.size()},
      {"num_waits", schedule.waits.size()},
  };
  const std::string text = header.dump();
  write_file(path, [&](std::ostream& file) {
    file.write(kScheduleMagic, sizeof(kScheduleMagic));
    const uint64_t length = text.size();
    file.write(reinterpret_cast<const char*>(&length), sizeof(length));
    file.write(text.data(), std::streamsize(text.size()));
    write_array(file, schedule.sm_begin);
    write_array(file, schedule.instructions);
    write_array(file, schedule.waits);
  });
}

namespace {

LoadedSchedule load_schedule_file(const std::filesystem::path& path, const Graph* graph) {
  const InputFile file(path);  // refuses a FIFO or /dev/zero instead of reading it forever
  const std::string source = path.string();
  char prefix[16] = {};
  MK_CHECK(file.size() >= 16, "{}: not a schedule file of this version (bad magic)", source);
  file.read_at(0, {reinterpret_cast<uint8_t*>(prefix), sizeof(prefix)});
  MK_CHECK(std::memcmp(prefix, kScheduleMagic, 8) == 0, "{}: not a schedule file of this version (bad magic)", source);
  uint64_t length;
  std::memcpy(&length, prefix + 8, 8);
  MK_CHECK(length <= file.size() - 16, "{}: truncated schedule header", source);
  MK_CHECK(length <= kMaxScheduleHeaderBytes, "{}: schedule header of {} bytes is larger than the {} allowed", source,
           length, kMaxScheduleHeaderBytes);
  std::string text(length, '\0');
  file.read_at(16, {reinterpret_cast<uint8_t*>(text.data()), text.size()});
  ScheduleHeader header;
  try {
    header = parse_schedule_header(text, source);
  } catch (const nlohmann::json::exception& error) {
    throw Error(fmt::format("{}: bad schedule header: {}", source, printable(error.what())));
  } catch (const Error& error) {
    throw Error(fmt::format("{}: bad schedule header: {}", source, error.what()));
  }
  LoadedSchedule& loaded = header.loaded;
  Schedule& s = loaded.schedule;
  // Every count is below 2^32, so none of these products overflows; the file's size bounds what is allocated.
  const uint64_t expected = 16 + length + (uint64_t(s.num_sms) + 1) * sizeof(uint32_t) +
                            uint64_t(header.num_instructions) * sizeof(Instruction) +
                            uint64_t(header.num_waits) * sizeof(Wait);
  MK_CHECK(file.size() == expected, "{}: file has {} bytes, its header promises {}", source, file.size(), expected);
  // Each counter is signalled by some task: more counters than instructions would only make the verifier and the
  // engines allocate for nothing (a 5 KB file could ask for 16 GB).
  MK_CHECK(s.num_counters <= uint64_t(header.num_instructions), "{}: {} counters for {} instructions", source,
           s.num_counters, header.num_instructions);
  if (graph != nullptr) check_schedule_fits(source, loaded, uint64_t(header.num_instructions), *graph);
  uint64_t offset = 16 + length;
  auto read_into = [&](auto& values, size_t count) {
    values.resize(count);
    const size_t bytes = count * sizeof(values[0]);
    file.read_at(offset, {reinterpret_cast<uint8_t*>(values.data()), bytes});
    offset += bytes;
  };
  read_into(s.sm_begin, size_t(s.num_sms) + 1);
  read_into(s.instructions, size_t(header.num_instructions));
  read_into(s.waits, size_t(header.num_waits));
  return loaded;
}

}  // namespace

LoadedSchedule load_schedule(const std::filesystem::path& path) { return load_schedule_file(path, nullptr); }

LoadedSchedule load_schedule(const std::filesystem::path& path, const Graph& graph) {
  return load_schedule_file(path, &graph);
}

}  // namespace mk
