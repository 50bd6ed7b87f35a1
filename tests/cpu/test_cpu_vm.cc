// Tests of the cpu-vm engine: it matches the reference bit for bit and exposes a dropped dependency.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mk/check.h"
#include "mk/cpu_vm.h"
#include "mk/random.h"
#include "mk/reference.h"
#include "test_models.h"

namespace mk {
namespace {

using ::testing::HasSubstr;

bool bitwise_equal(const ref::Matrix& a, const ref::Matrix& b) {
  return a.rows == b.rows && a.cols == b.cols &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) == 0;
}

TEST(CpuVm, MatchesReferenceBitwiseOnRandomShapesWithRandomDelays) {
  Random random(11);
  for (int trial = 0; trial < 12; ++trial) {
    const ModelConfig config = random_small_config(random);
    const RunShape shape = random_shape(random, 3, 200);
    const ModelWeights weights = random_weights(config, 100 + uint64_t(trial));
    const ref::ModelInput input = ref::random_input(config, shape, 200 + uint64_t(trial));
    const ref::Matrix expected = ref::forward(weights, input);
    const Graph graph(config, shape);
    const SchedulePolicy policy = trial % 2 ? SchedulePolicy::kRoundRobin : SchedulePolicy::kCostModel;
    const Schedule schedule = make_schedule(graph, derive_dependencies(graph), policy, int32_t(2 + trial % 9));
    CpuVmOptions options;
    options.max_delay_us = 200;
    options.delay_seed = uint64_t(trial);
    const CpuVmRun run = run_cpu_vm(graph, schedule, weights, input, options);
    EXPECT_TRUE(bitwise_equal(run.output(graph), expected))
        << describe(config) << " batch " << shape.batch << " seq " << shape.seq_len;
  }
}

TEST(CpuVm, SeedShapedModelMatchesReference) {
  // The seed's structure (no RoPE, embedding or LM head, MHA with head_dim 128) at a CI-friendly size.
  ModelConfig config = find_preset("seed").config;
  config.n_layers = 2;
  config.d_model = 256;
  config.n_heads = 2;
  config.n_kv_heads = 2;
  config.d_ff = 512;
  const RunShape shape{3, 200};
  const ModelWeights weights = random_weights(config, 5);
  const ref::ModelInput input = ref::random_input(config, shape, 6);
  const Graph graph(config, shape);
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 132);
  EXPECT_TRUE(bitwise_equal(run_cpu_vm(graph, schedule, weights, input).output(graph), ref::forward(weights, input)));
}

TEST(CpuVm, CountersAreNeverReset) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{2, 70};
  const ModelWeights weights = random_weights(config, 1);
  const ref::ModelInput input = ref::random_input(config, shape, 2);
  const Graph graph(config, shape);
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 6);
  CpuVmOptions options;
  options.launches = 3;  // epochs 1, 2, 3 wait for 1x, 2x, 3x each target
  EXPECT_TRUE(bitwise_equal(run_cpu_vm(graph, schedule, weights, input, options).output(graph),
                            ref::forward(weights, input)));
}

class PlantedBug : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = find_preset("tiny").config;
    weights_ = random_weights(config_, 3);
    input_ = ref::random_input(config_, shape_, 4);
    graph_ = std::make_unique<Graph>(config_, shape_);
    schedule_ = make_schedule(*graph_, derive_dependencies(*graph_), SchedulePolicy::kCostModel, 8);
    // Drop the only wait of the first layer-1 attention tile (queries and keys [0, 128) of sequence 0), and give the
    // tile an SM of its own: it then starts at once, long before its qkv rows exist. Deterministic: no timing.
    size_t victim = schedule_.instructions.size();
    for (size_t i = 0; i < schedule_.instructions.size(); ++i) {
      const Instruction& in = schedule_.instructions[i];
      if (in.opcode == Opcode::kAttention && in.layer == 1 && in.row_begin == 0 && in.num_waits == 1) victim = i;
    }
    ASSERT_LT(victim, schedule_.instructions.size());
    Instruction moved = schedule_.instructions[victim];
    victim_task_ = moved.task;
    dropped_counter_ = schedule_.waits[moved.wait_begin].counter;
    moved.num_waits = 0;
    schedule_.instructions.erase(schedule_.instructions.begin() + int64_t(victim));
    for (uint32_t& begin : schedule_.sm_begin)
      if (begin > victim) --begin;
    schedule_.instructions.push_back(moved);
    schedule_.sm_begin.push_back(uint32_t(schedule_.instructions.size()));
    schedule_.num_sms += 1;
    for (const Instruction& in : schedule_.instructions)
      if (in.signal_counter == dropped_counter_) writers_.push_back(in.task);
  }

  ModelConfig config_;
  RunShape shape_{2, 256};
  ModelWeights weights_;
  ref::ModelInput input_;
  std::unique_ptr<Graph> graph_;
  Schedule schedule_;
  uint32_t victim_task_ = UINT32_MAX;
  uint32_t dropped_counter_ = 0;
  std::vector<uint32_t> writers_;
};

TEST_F(PlantedBug, VerifierRejectsIt) {
  EXPECT_THAT([&] { verify_schedule(*graph_, schedule_); }, testing::ThrowsMessage<Error>(HasSubstr("does not wait for")));
  EXPECT_THAT([&] { run_cpu_vm(*graph_, schedule_, weights_, input_); },
              testing::ThrowsMessage<Error>(HasSubstr("does not wait for")));
}

TEST_F(PlantedBug, RaceDetectorExposesItWhateverTheTiming) {
  CpuVmOptions options;
  options.max_delay_us = 50;
  EXPECT_THAT([&] { run_cpu_vm_unverified(*graph_, schedule_, weights_, input_, options); },
              testing::ThrowsMessage<Error>(HasSubstr("race: reads qkv[1]")));
}

TEST_F(PlantedBug, OutputGoesWrongWhenTheWriterIsLate) {
  CpuVmOptions options;
  options.detect_races = false;
  options.slow_tasks = writers_;  // belt and braces: the writers start late as well
  options.slow_task_delay_ms = 200;
  const CpuVmRun run = run_cpu_vm_unverified(*graph_, schedule_, weights_, input_, options);
  // The victim read poisoned (NaN) keys, so its output and everything downstream differ from the reference.
  const ref::Matrix expected = ref::forward(weights_, input_);
  EXPECT_FALSE(bitwise_equal(run.output(*graph_), expected));
  size_t nans = 0;
  for (float v : run.output(*graph_).data) nans += std::isnan(v);
  EXPECT_GT(nans, 0u);
}

TEST(CpuVm, StallIsReportedNotHung) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{1, 64};
  const Graph graph(config, shape);
  Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 4);
  // A wait that can never be met.
  for (Instruction& in : schedule.instructions) {
    if (in.num_waits == 0) continue;
    schedule.waits.push_back({schedule.waits[in.wait_begin].counter, 999});
    in.wait_begin = uint32_t(schedule.waits.size() - 1);
    in.num_waits = 1;
    break;
  }
  CpuVmOptions options;
  options.stall_timeout_s = 0.2;
  options.detect_races = false;
  EXPECT_THAT([&] { run_cpu_vm_unverified(graph, schedule, random_weights(config, 1), ref::random_input(config, shape, 1), options); },
              testing::ThrowsMessage<Error>(HasSubstr("cpu-vm stall")));
}

}  // namespace
}  // namespace mk
