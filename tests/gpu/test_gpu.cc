// GPU tests of the megakernel: every op alone and the whole model against the reference, determinism, stall
// reports. Without a Hopper GPU they report themselves skipped.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mk/check.h"
#include "mk/compare.h"
#include "mk/cpu_vm.h"
#include "mk/gpu.h"
#include "mk/graph.h"
#include "mk/schedule.h"
#include "gpu_fixture.h"

namespace mk {
namespace {

using ::testing::HasSubstr;

// Every op alone on the GPU's own inputs, then the whole output under the tolerance policy.
void check_against_reference(const GpuInfo& info, const ModelConfig& config, const RunShape& shape, uint64_t seed) {
  SCOPED_TRACE(describe(config) + fmt::format(" batch {} seq {}", shape.batch, shape.seq_len));
  const ModelWeights weights = random_weights(config, seed);
  const ref::ModelInput input = ref::random_input(config, shape, seed + 1);
  const Graph graph(config, shape);
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, info.sm_count);
  GpuEngine gpu(graph, schedule, weights);
  gpu.set_input(input);
  gpu.run();
  CpuVmOptions vm_options;
  vm_options.detect_races = false;  // the schedule was verified; keep the large configs quick
  // Buffer by buffer on the model as the engine holds it, the norm weights folded into the matrices after them (its
  // norm buffers hold x / rms); the output below against the model as loaded.
  const ModelWeights folded = fold_norm_weights(weights);
  const CpuVmRun reference = run_cpu_vm(graph, schedule, folded, input, vm_options);
  const std::vector<BufferComparison> rows = bisect_buffers(graph, folded, input, gpu.buffers(), reference.buffers);
  for (const BufferComparison& row : rows) {
    EXPECT_TRUE(row.op_passed) << row.buffer << ": op alone rel L2 " << row.op_alone.rel_l2_error << ", max abs "
                               << row.op_alone.max_abs_error << ", NaN " << row.op_alone.nan_count << "\n"
                               << format_bisect(rows);
  }
  const TolerancePolicy policy = check_tolerance(gpu.output(), weights, input);
  EXPECT_TRUE(policy.passed) << policy.describe();
  std::printf("%s batch %lld seq %lld: %s\n", config.name.c_str(), (long long)shape.batch, (long long)shape.seq_len,
              policy.describe().c_str());
}

TEST_F(Gpu, EachOpAloneOverASweepOfShapes) {
  struct Case {
    ModelConfig config;
    RunShape shape;
  };
  const std::vector<Case> cases = {
      {find_preset("tiny").config, {2, 40}},
      {small_config(256, 512, 2, 2, 128, false, false), {1, 128}},      // seed-like MHA, head_dim 128, no RoPE
      {small_config(512, 1024, 8, 2, 64, true, true), {3, 200}},        // odd shapes: batch 3, seq 200, GQA 4:1
      {small_config(384, 320, 4, 1, 128, true, true), {2, 300}},        // GQA 4:1, d_ff not a multiple of 128
      {small_config(256, 768, 8, 1, 64, true, true, 1), {1, 1000}},     // GQA 8:1, long sequence
      {small_config(128, 256, 1, 1, 128, true, false, 3), {5, 17}},     // tiny sequences, one head
      {small_config(4096, 512, 32, 8, 128, true, true, 1), {1, 64}},    // rows too long for registers in RMSNorm
      {small_config(320, 640, 5, 1, 64, true, true), {2, 96}},          // last o_proj/down tile 64 columns wide
      {small_config(256, 512, 2, 2, 128, false, false, 1), {1, 4096}},  // the benchmark's longest sequence
      // 256-column qkv, o_proj and down tiles (9 row blocks x 16 or 24, K >= 2048), the last row block partial:
      // RoPE over a wide tile and residuals loaded in two halves
      {small_config(4096, 2048, 32, 8, 128, true, true, 1), {1, 1100}},
  };
  for (size_t i = 0; i < cases.size(); ++i) check_against_reference(info_, cases[i].config, cases[i].shape, 10 + i);
}

TEST_F(Gpu, TheOutputTileIsNotLoadedBeforeItsStoreHasReadIt) {
  // K = 256: whole qkv and gate_up tiles fit the stage ring, so the producer runs two or more uses of the output tile
  // ahead of the storer. On the H200's 132 SMs this schedule stalled when the producer waited on the tile's parity
  // (Q loaded onto a tile still being stored) instead of counting the stores (output_tile.cuh).
  check_against_reference(info_, find_preset("tiny").config, {18, 384}, 32);
}

TEST_F(Gpu, OneLaunchPerOpComputesWhatTheSingleLaunchComputes) {
  // The per-op-launch ablation (`mk run --launch-per-op`) times the same tiles: its output is the megakernel's, bit
  // for bit, and both passes of each kind agree.
  for (const auto& [config, shape] : {std::pair{find_preset("tiny").config, RunShape{2, 40}},
                                      std::pair{find_preset("seed").config, RunShape{2, 256}}}) {
    SCOPED_TRACE(config.name);
    const ModelWeights weights = random_weights(config, 5);
    const ref::ModelInput input = ref::random_input(config, shape, 6);
    const Graph graph(config, shape);
    const Schedule schedule =
        make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, info_.sm_count);
    GpuEngine gpu(graph, schedule, weights);
    gpu.set_input(input);
    gpu.run();
    const ref::Matrix single = gpu.output();
    const std::vector<float> per_op_ms = gpu.time_runs_per_step(2);
    ASSERT_EQ(per_op_ms.size(), 2u);
    const ref::Matrix per_op = gpu.output();
    ASSERT_EQ(single.data.size(), per_op.data.size());
    EXPECT_EQ(std::memcmp(single.data.data(), per_op.data.data(), single.data.size() * sizeof(float)), 0);
    bool finite = true;
    for (float v : per_op.data) finite &= std::isfinite(v);
    EXPECT_TRUE(finite);
  }
}

TEST_F(Gpu, SeedPreset) {
  const Preset& seed = find_preset("seed");
  check_against_reference(info_, seed.config, seed.shape, 3);
}

TEST_F(Gpu, Llama1bShapeWithTwoLayers) {
  ModelConfig config = find_preset("llama-3.2-1b").config;
  config.n_layers = 2;
  check_against_reference(info_, config, {2, 256}, 4);
}

TEST_F(Gpu, RoundRobinScheduleGivesTheSameBits) {
  const ModelConfig config = small_config(512, 1024, 8, 2, 64, true, true);
  const RunShape shape{3, 200};
  const ModelWeights weights = random_weights(config, 1);
  const ref::ModelInput input = ref::random_input(config, shape, 2);
  const Graph graph(config, shape);
  std::vector<ref::Matrix> outputs;
  for (SchedulePolicy policy : {SchedulePolicy::kCostModel, SchedulePolicy::kRoundRobin}) {
    GpuEngine gpu(graph, schedule_for(graph, policy), weights);
    gpu.set_input(input);
    gpu.run();
    outputs.push_back(gpu.output());
  }
  EXPECT_EQ(std::memcmp(outputs[0].data.data(), outputs[1].data.data(), outputs[0].data.size() * 4), 0);
}

TEST_F(Gpu, TwoHundredLaunchesAreBitwiseIdentical) {
  const Preset& seed = find_preset("seed");
  const ModelWeights weights = random_weights(seed.config, 7);
  const ref::ModelInput input = ref::random_input(seed.config, seed.shape, 8);
  const Graph graph(seed.config, seed.shape);
  GpuEngine gpu(graph, schedule_for(graph), weights);
  gpu.set_input(input);
  gpu.run();
  const ref::Matrix first = gpu.output();
  size_t nans = 0;
  for (float v : first.data) nans += !std::isfinite(v);
  ASSERT_EQ(nans, 0u);
  for (int launch = 1; launch < 200; ++launch) {
    gpu.run();
    const ref::Matrix again = gpu.output();
    ASSERT_EQ(std::memcmp(first.data.data(), again.data.data(), first.data.size() * 4), 0) << "launch " << launch;
  }
}

TEST_F(Gpu, MissingSignalIsReportedNamingTheWait) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{2, 64};
  const Graph graph(config, shape);
  Schedule schedule = schedule_for(graph);
  // The planted wait is on an lm_head tile: nothing waits for lm_head tiles, so it is the only wait that can stall
  // and the report must name it.
  const PlantedWait planted = plant_missing_signal(schedule, Opcode::kLmHead);
  ASSERT_TRUE(planted.planted);
  GpuEngine gpu(graph, schedule, random_weights(config, 1), {.stall_timeout_s = 0.5, .verify = false});
  gpu.set_input(ref::random_input(config, shape, 2));
  const std::string message = error_of_run(gpu);
  EXPECT_THAT(message, HasSubstr("megakernel stall: SM"));
  EXPECT_THAT(message, HasSubstr(fmt::format("(task {}: lm_head", planted.task)));
  EXPECT_THAT(message, HasSubstr(fmt::format("counter {},", planted.counter)));
  EXPECT_THAT([&] { gpu.run(); }, testing::ThrowsMessage<Error>(HasSubstr("unusable")));
}

// The diagnostic (GpuOptions::skip_dependency_waits) skips every wait on another SM's counter: the launch that would
// stall on the missing signal ends, and so do the launches after it.
TEST_F(Gpu, SkippedDependencyWaitsPassAMissingSignal) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{2, 64};
  const Graph graph(config, shape);
  Schedule schedule = schedule_for(graph);
  ASSERT_TRUE(plant_missing_signal(schedule, Opcode::kLmHead).planted);
  GpuEngine gpu(graph, schedule, random_weights(config, 1),
                {.stall_timeout_s = 0.5, .verify = false, .skip_dependency_waits = true});
  gpu.set_input(ref::random_input(config, shape, 2));
  for (int launch = 0; launch < 3; ++launch) EXPECT_NO_THROW(gpu.run()) << "launch " << launch;
}

TEST_F(Gpu, AFaultInTheKernelNamesTheErrorAndLeavesTheEngineUnusable) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{1, 64};
  const Graph graph(config, shape);
  Schedule schedule = schedule_for(graph);
  // An embedding task pointed 2^30 rows past its buffers: its loads fault, a sticky error of the CUDA context.
  for (Instruction& in : schedule.instructions) {
    if (in.opcode != Opcode::kEmbed) continue;
    in.row_begin = 1 << 30;
    in.row_end = in.row_begin + 1;
    break;
  }
  GpuEngine gpu(graph, schedule, random_weights(config, 1), {.stall_timeout_s = 1.0, .verify = false});
  gpu.set_input(ref::random_input(config, shape, 2));
  EXPECT_THAT([&] { gpu.run(); },
              testing::ThrowsMessage<Error>(HasSubstr("running the megakernel failed: cudaError")));
  EXPECT_THAT([&] { gpu.run(); }, testing::ThrowsMessage<Error>(HasSubstr("unusable")));
  EXPECT_THAT([&] { gpu.set_input(ref::random_input(config, shape, 3)); },
              testing::ThrowsMessage<Error>(HasSubstr("unusable")));
}

TEST_F(Gpu, RefusesWhatItCannotServe) {
  ModelConfig config = small_config(256, 512, 4, 2, 64, true, true);
  config.vocab_size = 1001;
  const Graph graph(config, {1, 64});
  EXPECT_THAT([&] { GpuEngine(graph, schedule_for(graph), random_weights(config, 1)); },
              testing::ThrowsMessage<Error>(HasSubstr("vocab_size 1001")));
  config.vocab_size = 1000;
  const Graph servable(config, {1, 64});
  for (const double timeout : {0.0, -1.0, std::nan(""), 1e12}) {
    const GpuOptions options{.stall_timeout_s = timeout};
    EXPECT_THAT([&] { GpuEngine(servable, schedule_for(servable), random_weights(config, 1), options); },
                testing::ThrowsMessage<Error>(HasSubstr("stall_timeout_s must be in")))
        << timeout;
  }
}

}  // namespace
}  // namespace mk
