// Tests of the graph, dependency derivation, schedulers, the static verifier and the schedule file format.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "mk/check.h"
#include "mk/graph.h"
#include "mk/random.h"
#include "mk/schedule.h"
#include "mk/tiles.h"
#include "test_models.h"

namespace mk {
namespace {

using ::testing::HasSubstr;

Schedule build(const Graph& graph, SchedulePolicy policy, int32_t num_sms) {
  return make_schedule(graph, derive_dependencies(graph), policy, num_sms);
}

std::string verify_error(const Graph& graph, const Schedule& schedule) {
  try {
    verify_schedule(graph, schedule);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Index into schedule.instructions of the attention task for (layer 0, sequence, head 0, the last query block), and
// the qkv counter among its waits that covers the keys of the first query block.
struct PlantedBug {
  size_t instruction = 0;
  uint32_t dropped_counter = 0;
};

PlantedBug drop_attention_wait(const Graph& graph, Schedule& schedule) {
  for (size_t i = 0; i < schedule.instructions.size(); ++i) {
    Instruction& in = schedule.instructions[i];
    if (in.opcode != Opcode::kAttention || in.layer != 0 || in.head != 0 || in.num_waits < 2) continue;
    // Move this instruction's waits to a private copy without the first one (the qkv rows of the first block).
    const uint32_t dropped = schedule.waits[in.wait_begin].counter;
    const uint32_t begin = uint32_t(schedule.waits.size());
    for (uint32_t k = 1; k < in.num_waits; ++k) schedule.waits.push_back(schedule.waits[in.wait_begin + k]);
    in.wait_begin = begin;
    in.num_waits -= 1;
    (void)graph;
    return {i, dropped};
  }
  ADD_FAILURE() << "no attention instruction with two waits";
  return {};
}

TEST(Graph, EveryPresetSchedulesAndVerifies) {
  for (const Preset& preset : presets()) {
    RunShape shape = preset.shape;
    if (preset.config.name == "llama-3.1-8b") shape = {2, 256};  // keep the test quick
    const Graph graph(preset.config, shape);
    for (SchedulePolicy policy : {SchedulePolicy::kRoundRobin, SchedulePolicy::kCostModel}) {
      for (int32_t sms : {1, 7, 132}) {
        const Schedule schedule = build(graph, policy, sms);
        EXPECT_EQ(verify_error(graph, schedule), "") << preset.config.name << " " << schedule_policy_name(policy) << " "
                                                     << sms;
      }
    }
  }
}

TEST(Graph, RandomSmallShapesVerify) {
  Random random(7);
  for (int trial = 0; trial < 40; ++trial) {
    const ModelConfig config = random_small_config(random);
    const RunShape shape = random_shape(random, 5, 300);
    const Graph graph(config, shape);
    const int32_t sms = int32_t(1 + random.next_u64() % 40);
    for (SchedulePolicy policy : {SchedulePolicy::kRoundRobin, SchedulePolicy::kCostModel}) {
      EXPECT_EQ(verify_error(graph, build(graph, policy, sms)), "")
          << describe(config) << " batch " << shape.batch << " seq " << shape.seq_len;
    }
  }
}

TEST(Graph, AttentionWaitsOnlyForItsOwnSequence) {
  // Fine-grained waits: attention of sequence b depends on qkv rows of sequence b only, so the first query block
  // of a sequence waits for fewer counters than the last one.
  const ModelConfig config = find_preset("seed").config;
  const Graph graph(config, {2, 512});
  const Dependencies deps = derive_dependencies(graph);
  std::vector<uint32_t> waits_per_block;
  for (size_t t = 0; t < graph.tasks().size(); ++t) {
    const Task& task = graph.tasks()[t];
    if (task.opcode == Opcode::kAttention && task.layer == 0 && task.sequence == 1 && task.head == 0)
      waits_per_block.push_back(deps.num_waits[t]);
  }
  ASSERT_EQ(waits_per_block.size(), 4u);
  EXPECT_EQ(waits_per_block.front(), 1u);  // keys [0, 128) of sequence 1: one qkv row block
  EXPECT_EQ(waits_per_block.back(), 4u);   // keys [0, 512): four row blocks, none of sequence 0
}

TEST(Scheduler, EveryEntryRefusesAnSmCountOutOfRange) {
  const Graph graph(find_preset("tiny").config, {1, 16});
  const Dependencies deps = derive_dependencies(graph);
  for (const int32_t sms : {0, 4097}) {
    const auto refused = testing::ThrowsMessage<Error>(HasSubstr(fmt::format("got {}", sms)));
    EXPECT_THAT([&] { make_schedule(graph, deps, SchedulePolicy::kCostModel, sms); }, refused);
    EXPECT_THAT([&] { make_schedule(graph, deps, SchedulePolicy::kRoundRobin, sms); }, refused);
    EXPECT_THAT([&] { make_list_schedule(graph, deps, sms, ListDirection::kBackward); }, refused);
  }
}

// The gpu engine names the stalled launch of a group from a stalled wait's target (epoch x the wait's target).
TEST(Scheduler, WaitTargetFindsAnInstructionsWaitOnACounter) {
  const Graph graph(find_preset("tiny").config, {2, 16});
  const Schedule schedule = build(graph, SchedulePolicy::kCostModel, 4);
  int checked = 0;
  for (int32_t sm = 0; sm < schedule.num_sms; ++sm) {
    for (uint32_t i = 0; i < schedule.num_instructions(sm); ++i) {
      const Instruction& in = schedule.instructions[schedule.sm_begin[size_t(sm)] + i];
      for (uint32_t k = 0; k < in.num_waits; ++k) {
        const Wait& wait = schedule.waits[in.wait_begin + k];
        EXPECT_EQ(schedule.wait_target(sm, i, wait.counter), wait.target) << "SM " << sm << " instruction " << i;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(schedule.wait_target(0, 0, schedule.num_counters), 0u) << "a counter the instruction does not wait on";
  EXPECT_EQ(schedule.wait_target(0, uint32_t(schedule.num_instructions(0)), 0), 0u) << "past the SM's list";
  EXPECT_EQ(schedule.wait_target(schedule.num_sms, 0, 0), 0u) << "past the last SM";
  EXPECT_EQ(schedule.wait_target(-1, 0, 0), 0u);
}

TEST(Graph, UnsupportedShapesNameTheConstraint) {
  ModelConfig config = find_preset("tiny").config;
  config.head_dim = 96;
  EXPECT_THAT([&] { Graph(config, {1, 16}); }, testing::ThrowsMessage<Error>(HasSubstr("head_dim 96")));
  config = find_preset("tiny").config;
  config.d_ff = 500;
  EXPECT_THAT([&] { Graph(config, {1, 16}); }, testing::ThrowsMessage<Error>(HasSubstr("intermediate_size (500)")));
  config = find_preset("tiny").config;
  EXPECT_THAT([&] { Graph(config, {1, config.max_position_embeddings + 1}); },
              testing::ThrowsMessage<Error>(HasSubstr("max_position_embeddings")));
}

TEST(Verifier, RejectsADroppedDependencyNamingTheInstruction) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {2, 300});
  Schedule schedule = build(graph, SchedulePolicy::kCostModel, 16);
  const PlantedBug bug = drop_attention_wait(graph, schedule);
  const std::string error = verify_error(graph, schedule);
  const Instruction& in = schedule.instructions[bug.instruction];
  EXPECT_THAT(error, HasSubstr(fmt::format("(task {}: attention", in.task)));
  EXPECT_THAT(error, HasSubstr("which it does not wait for"));
}

TEST(Verifier, AcceptsAWaitImpliedTransitively) {
  // o_proj reads hidden[l] for its residual; it also waits on attention, which transitively waits on the norm,
  // which waits on hidden[l]'s writers. Dropping the direct wait keeps the schedule safe.
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {1, 128});
  Schedule schedule = build(graph, SchedulePolicy::kRoundRobin, 4);
  bool dropped = false;
  for (Instruction& in : schedule.instructions) {
    if (in.opcode != Opcode::kOProj || in.layer != 1 || in.num_waits < 2) continue;
    std::vector<Wait> kept;
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const Wait& w = schedule.waits[in.wait_begin + k];
      bool is_down = false;
      for (const Instruction& other : schedule.instructions)
        is_down |= other.signal_counter == w.counter && other.opcode == Opcode::kDown;
      if (!is_down) kept.push_back(w);
    }
    ASSERT_LT(kept.size(), in.num_waits);
    in.wait_begin = uint32_t(schedule.waits.size());
    in.num_waits = uint32_t(kept.size());
    schedule.waits.insert(schedule.waits.end(), kept.begin(), kept.end());
    dropped = true;
  }
  ASSERT_TRUE(dropped);
  EXPECT_EQ(verify_error(graph, schedule), "");
}

TEST(Verifier, RejectsDeadlockAndUnreachableTargets) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {1, 64});
  {
    // One SM running a consumer before its producers waits forever.
    Schedule schedule = build(graph, SchedulePolicy::kRoundRobin, 1);
    auto consumer = std::find_if(schedule.instructions.begin(), schedule.instructions.end(),
                                 [](const Instruction& in) { return in.num_waits > 0; });
    ASSERT_NE(consumer, schedule.instructions.end());
    std::rotate(schedule.instructions.begin(), consumer, consumer + 1);
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("deadlock: SM 0 instruction 0"));
  }
  {
    Schedule schedule = build(graph, SchedulePolicy::kRoundRobin, 3);
    for (Instruction& in : schedule.instructions) {
      if (in.num_waits == 0) continue;
      schedule.waits.push_back({schedule.waits[in.wait_begin].counter, 1000});
      in.wait_begin = uint32_t(schedule.waits.size() - 1);
      in.num_waits = 1;
      break;
    }
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("unreachable"));
  }
}

TEST(Verifier, RejectsStructuralDamage) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {1, 64});
  const Schedule good = build(graph, SchedulePolicy::kCostModel, 5);
  {
    Schedule schedule = good;
    schedule.instructions[3].task = schedule.instructions[2].task;
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("also appears"));
  }
  {
    Schedule schedule = good;
    schedule.instructions[4].col_end += 1;
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("does not match task"));
  }
  {
    Schedule schedule = good;
    schedule.instructions[1].signal_counter = schedule.num_counters + 5;
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("signals counter"));
  }
  {
    Schedule schedule = good;
    schedule.instructions.pop_back();
    schedule.sm_begin.back() -= 1;
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("instructions, the graph"));
  }
}

TEST(Verifier, MismatchNamesTheDifferingFields) {
  // The message printed the task's description and the instruction's, which a sequence or head (not in the latter)
  // left identical.
  const Graph graph(find_preset("tiny").config, {1, 64});
  const Schedule good = build(graph, SchedulePolicy::kCostModel, 5);
  const auto first = [&](bool attention) {
    return size_t(std::find_if(good.instructions.begin(), good.instructions.end(),
                               [&](const Instruction& in) { return (in.sequence >= 0) == attention; }) -
                  good.instructions.begin());
  };
  {
    Schedule schedule = good;
    schedule.instructions[first(false)].sequence = 7;
    EXPECT_THAT(verify_error(graph, schedule), HasSubstr("): sequence 7 (the task's: -1)"));
  }
  {
    Schedule schedule = good;
    Instruction& attention = schedule.instructions.at(first(true));
    const int32_t head = attention.head;
    attention.head += 1;
    attention.row_end += 2;
    EXPECT_THAT(verify_error(graph, schedule),
                HasSubstr(fmt::format("row_end {} (the task's: {}), head {} (the task's: {})", attention.row_end,
                                      attention.row_end - 2, head + 1, head)));
  }
}

TEST(ScheduleFile, RoundTripsAndRejectsCorruption) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {2, 100});
  const Schedule schedule = build(graph, SchedulePolicy::kCostModel, 9);
  const auto path = std::filesystem::temp_directory_path() / "mk_test_schedule.bin";
  save_schedule(path, graph, schedule);
  const LoadedSchedule loaded = load_schedule(path);
  EXPECT_EQ(loaded.shape.batch, 2);
  EXPECT_EQ(loaded.shape.seq_len, 100);
  EXPECT_EQ(loaded.config.d_model, config.d_model);
  ASSERT_EQ(loaded.schedule.instructions.size(), schedule.instructions.size());
  EXPECT_EQ(std::memcmp(loaded.schedule.instructions.data(), schedule.instructions.data(),
                        schedule.instructions.size() * sizeof(Instruction)),
            0);
  EXPECT_EQ(verify_error(Graph(loaded.config, loaded.shape), loaded.schedule), "");

  // Flip the opcode of one instruction in the file: the verifier names it.
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t instructions_at = bytes.size() - schedule.waits.size() * sizeof(Wait) -
                                 schedule.instructions.size() * sizeof(Instruction);
  const size_t victim = 17;
  bytes[instructions_at + victim * sizeof(Instruction)] ^= 0x3;
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  const LoadedSchedule corrupted = load_schedule(path);
  EXPECT_THAT(verify_error(graph, corrupted.schedule), HasSubstr("does not match task"));

  // Truncation and a bad magic are refused at load time.
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size() - 10));
  }
  EXPECT_THAT([&] { load_schedule(path); }, testing::ThrowsMessage<Error>(HasSubstr("header promises")));
  bytes[0] = 'X';
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  EXPECT_THAT([&] { load_schedule(path); }, testing::ThrowsMessage<Error>(HasSubstr("bad magic")));
  std::filesystem::remove(path);
}

TEST(ScheduleFile, RefusesAFileBuiltWithOtherTiles) {
  const Graph graph(find_preset("tiny").config, {1, 64});
  const Schedule schedule = build(graph, SchedulePolicy::kCostModel, 4);
  const auto path = std::filesystem::temp_directory_path() / "mk_test_schedule_tiles.bin";
  save_schedule(path, graph, schedule);
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Rewrite the JSON header with qkv and lm_head tiles 256 columns wide, as schedules were built before tiles.h.
  uint64_t length;
  std::memcpy(&length, bytes.data() + 8, 8);
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 16, bytes.begin() + 16 + int64_t(length));
  ASSERT_EQ(header.at("tiles").at("block_n"), tiles::kBlockN);
  header["tiles"]["block_n"] = 256;
  const std::string text = header.dump();
  const uint64_t new_length = text.size();
  std::vector<char> rewritten(bytes.begin(), bytes.begin() + 8);
  rewritten.insert(rewritten.end(), reinterpret_cast<const char*>(&new_length),
                   reinterpret_cast<const char*>(&new_length) + 8);
  rewritten.insert(rewritten.end(), text.begin(), text.end());
  rewritten.insert(rewritten.end(), bytes.begin() + 16 + int64_t(length), bytes.end());
  {
    std::ofstream out(path, std::ios::binary);
    out.write(rewritten.data(), std::streamsize(rewritten.size()));
  }
  EXPECT_THAT([&] { load_schedule(path); },
              testing::ThrowsMessage<Error>(HasSubstr("built with other tile sizes: block_n 256 in the file, 128")));
  std::filesystem::remove(path);
}

TEST(Scheduler, CostModelBeatsRoundRobin) {
  // Where the seed's shape divides evenly both policies fill the SMs alike; uneven shapes and SM counts are where
  // balancing by estimated time pays.
  const ModelConfig seed = find_preset("seed").config;
  for (auto [shape, sms] : {std::pair{RunShape{5, 300}, 132}, std::pair{RunShape{8, 256}, 100},
                            std::pair{RunShape{8, 1024}, 132}}) {
    const Graph graph(seed, shape);
    const double round_robin = estimate_schedule(graph, build(graph, SchedulePolicy::kRoundRobin, sms)).makespan_ns;
    const ScheduleEstimate cost = estimate_schedule(graph, build(graph, SchedulePolicy::kCostModel, sms));
    EXPECT_LT(cost.makespan_ns, 0.99 * round_robin) << "batch " << shape.batch << " seq " << shape.seq_len;
    EXPECT_GE(cost.makespan_ns, cost.critical_path_ns);
  }
  const Graph graph(seed, {8, 256});
  const Schedule schedule = build(graph, SchedulePolicy::kCostModel, 132);
  const std::string text = explain_schedule(graph, schedule, estimate_schedule(graph, schedule));
  EXPECT_THAT(text, HasSubstr("SM 131:"));
  EXPECT_THAT(text, HasSubstr("critical path:"));
}

TEST(Scheduler, BothListDirectionsVerifyOnRandomPasses) {
  Random random(11);
  for (int trial = 0; trial < 30; ++trial) {
    ModelConfig config = random_small_config(random);
    config.has_embedding = config.has_lm_head = true;  // generation needs both
    const RunShape forward = random_shape(random, 5, 300);
    const int64_t context = 128 * int64_t(1 + random.next_u64() % 3);
    for (const RunShape& shape : {forward, RunShape{forward.batch, 1, PassKind::kDecode, context},
                                  RunShape{forward.batch, 37, PassKind::kPrefill, context}}) {
      const Graph graph(config, shape);
      const Dependencies deps = derive_dependencies(graph);
      const int32_t sms = int32_t(1 + random.next_u64() % 40);
      for (ListDirection direction : {ListDirection::kForward, ListDirection::kBackward})
        EXPECT_EQ(verify_error(graph, make_list_schedule(graph, deps, sms, direction)), "")
            << describe(config) << " " << describe(shape) << " on " << sms << " SMs, "
            << (direction == ListDirection::kForward ? "forward" : "backward");
    }
  }
}

TEST(Scheduler, BackwardListSchedulingPacksTheLastOpsRound) {
  // One layer of d_model 1280: 160 down tiles of ~30 us on 132 SMs. Forward, 28 of them form a second round with the
  // other SMs idle; backward, 28 run early among gate_up's tiles and the last 132 end together.
  ModelConfig config = find_preset("seed").config;
  config.n_layers = 1;
  config.d_model = 1280;
  config.n_heads = config.n_kv_heads = 10;
  config.d_ff = 5120;
  const Graph graph(config, {8, 256});
  const Dependencies deps = derive_dependencies(graph);
  const ScheduleEstimate forward =
      estimate_schedule(graph, make_list_schedule(graph, deps, 132, ListDirection::kForward));
  const ScheduleEstimate backward =
      estimate_schedule(graph, make_list_schedule(graph, deps, 132, ListDirection::kBackward));
  EXPECT_LT(backward.makespan_ns, 0.95 * forward.makespan_ns);
  EXPECT_LT(backward.idle_fraction(), 0.5 * forward.idle_fraction()) << "forward idle " << forward.idle_fraction();
  EXPECT_EQ(estimate_schedule(graph, build(graph, SchedulePolicy::kCostModel, 132)).makespan_ns, backward.makespan_ns)
      << "the cost-model policy keeps the faster direction";
  // Where the model sees no tail (the seed), the policy keeps the forward order the tiles were tuned in.
  const Graph seed(find_preset("seed").config, {8, 256});
  const Dependencies seed_deps = derive_dependencies(seed);
  EXPECT_EQ(estimate_schedule(seed, build(seed, SchedulePolicy::kCostModel, 132)).makespan_ns,
            estimate_schedule(seed, make_list_schedule(seed, seed_deps, 132, ListDirection::kForward)).makespan_ns);
}

TEST(ScheduleSteps, EachStepHoldsOneOpOfOneLayerWaitingOnlyOnEarlierSteps) {
  for (const char* preset : {"tiny", "seed"}) {
    SCOPED_TRACE(preset);
    const ModelConfig config = find_preset(preset).config;
    const Graph graph(config, {2, 200});
    const Schedule whole = build(graph, SchedulePolicy::kCostModel, 7);
    const std::vector<Schedule> steps = split_schedule_by_step(graph, whole);
    // The program's steps in order: the graph's runs of tasks of one (opcode, layer).
    std::vector<std::pair<Opcode, uint16_t>> program;
    for (const Task& t : graph.tasks())
      if (program.empty() || program.back() != std::make_pair(t.opcode, t.layer)) program.emplace_back(t.opcode, t.layer);
    ASSERT_EQ(steps.size(), program.size());
    // The counter each task signals, by step: a step may wait only on counters of the steps before it.
    std::vector<size_t> step_of_counter(whole.num_counters, steps.size());
    for (size_t k = 0; k < steps.size(); ++k)
      for (const Instruction& in : steps[k].instructions) step_of_counter[in.signal_counter] = k;
    for (int32_t sm = 0; sm < whole.num_sms; ++sm) {
      std::vector<uint32_t> rejoined;  // the SM's tasks, step after step
      for (size_t k = 0; k < steps.size(); ++k) {
        ASSERT_EQ(steps[k].sm_begin.size(), size_t(whole.num_sms) + 1);
        for (uint32_t i = steps[k].sm_begin[size_t(sm)]; i < steps[k].sm_begin[size_t(sm) + 1]; ++i) {
          const Instruction& in = steps[k].instructions[i];
          EXPECT_EQ(std::make_pair(in.opcode, in.layer), program[k]) << "SM " << sm << " step " << k;
          for (uint32_t w = in.wait_begin; w < in.wait_begin + in.num_waits; ++w)
            EXPECT_LT(step_of_counter[whole.waits[w].counter], k) << "SM " << sm << " step " << k;
          rejoined.push_back(in.task);
        }
      }
      // Each SM keeps its own tasks; within a step, in its order (steps come in program order on every SM).
      std::vector<uint32_t> own;
      for (uint32_t i = whole.sm_begin[size_t(sm)]; i < whole.sm_begin[size_t(sm) + 1]; ++i)
        own.push_back(whole.instructions[i].task);
      std::vector<uint32_t> own_by_step = own;
      std::stable_sort(own_by_step.begin(), own_by_step.end(), [&](uint32_t a, uint32_t b) {
        const Task& ta = graph.tasks()[a];
        const Task& tb = graph.tasks()[b];
        return std::find(program.begin(), program.end(), std::make_pair(ta.opcode, ta.layer)) <
               std::find(program.begin(), program.end(), std::make_pair(tb.opcode, tb.layer));
      });
      EXPECT_EQ(rejoined, own_by_step) << "SM " << sm;
    }
  }
}

}  // namespace
}  // namespace mk
