// GPU tests of generation: prefill and decode steps on the megakernel reproduce the logits of forward passes over
// the same tokens (the tolerance policy), greedy sampling on the device picks the argmax of its own logits, and bad
// setups are refused. Without a Hopper GPU they report themselves skipped.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpu_fixture.h"
#include "mk/compare.h"
#include "mk/generate.h"
#include "mk/random.h"
#include "../cpu/test_models.h"
#include "../cpu/test_util.h"

namespace mk {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Row `row` of `from` appended to `to` (rows grow by one).
void append_row(ref::Matrix& to, const ref::Matrix& from, int64_t row) {
  to.data.insert(to.data.end(), from.row(row), from.row(row) + from.cols);
  to.rows += 1;
  to.cols = from.cols;
}

// Random weights and ragged random prompts of a generation test, and the setup that holds them.
struct GenerationCase {
  ModelWeights weights;
  std::vector<std::vector<int32_t>> prompts;
  DecodeSetup setup;
};

GenerationCase generation_case(const ModelConfig& config, const std::vector<int64_t>& prompt_lengths,
                               int64_t max_context, uint64_t seed) {
  GenerationCase c{random_weights(config, seed), {}, {}};
  for (size_t b = 0; b < prompt_lengths.size(); ++b)
    c.prompts.push_back(random_prompt(config, prompt_lengths[b], seed + 1 + b));
  c.setup.batch = int64_t(c.prompts.size());
  c.setup.max_context = max_context;
  return c;
}

// Generates on the GPU from ragged prompts, then checks every step's logits against forward passes over each
// sequence's own tokens (the prompt and the tokens it was fed), and each new token against its step's argmax.
void check_gpu_generation(const ModelConfig& config, const std::vector<int64_t>& prompt_lengths, int64_t new_tokens,
                          int64_t max_context, uint64_t seed, int64_t prefill_batch = 0) {
  SCOPED_TRACE(fmt::format("{} batch {} max context {} prefill batch {}", config.name, prompt_lengths.size(),
                           max_context, prefill_batch));
  const GenerationCase c = generation_case(config, prompt_lengths, max_context, seed);
  const ModelWeights& weights = c.weights;
  const std::vector<std::vector<int32_t>>& prompts = c.prompts;
  const DecodeSetup& setup = c.setup;
  GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.keep_logits = true;
  options.prefill_batch = prefill_batch;
  const std::unique_ptr<DecodeEngine> gpu = make_gpu_decoder(weights, setup);
  const GenerationResult result = generate(*gpu, prompts, options);
  ASSERT_EQ(result.logits.size(), size_t(new_tokens));
  const int64_t batch = int64_t(prompts.size()), per_pass = prefill_batch > 0 ? prefill_batch : batch;
  const bool prefills = *std::max_element(prompt_lengths.begin(), prompt_lengths.end()) > 1;
  EXPECT_EQ(result.prefill_passes, prefills ? (batch + per_pass - 1) / per_pass : 0);

  ref::Matrix engine, fp32, bf16;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const SequenceResult& sequence = result.sequences[b];
    ASSERT_EQ(sequence.tokens.size(), size_t(sequence.prompt_length + new_tokens));
    // Step t fed token prompt_length - 1 + t; the last new token was never fed.
    ref::ModelInput input;
    input.shape = {1, sequence.prompt_length + new_tokens - 1};
    input.tokens.assign(sequence.tokens.begin(), sequence.tokens.end() - 1);
    const ref::Matrix exact = ref::forward(weights, input);
    const ref::Matrix rounded = ref::forward(weights, input, {.round_activations_to_bf16 = true});
    for (int64_t t = 0; t < new_tokens; ++t) {
      const ref::Matrix& step = result.logits[size_t(t)];
      const float* row = step.row(int64_t(b));
      const int64_t argmax = std::max_element(row, row + step.cols) - row;
      EXPECT_EQ(sequence.tokens[size_t(sequence.prompt_length + t)], argmax) << "sequence " << b << " step " << t;
      append_row(engine, step, int64_t(b));
      append_row(fp32, exact, sequence.prompt_length - 1 + t);
      append_row(bf16, rounded, sequence.prompt_length - 1 + t);
    }
  }
  const TolerancePolicy policy = tolerance_of(engine, fp32, bf16);
  EXPECT_TRUE(policy.passed) << policy.describe();
  std::printf("%s batch %zu: %s\n", config.name.c_str(), prompts.size(), policy.describe().c_str());
}

TEST_F(Gpu, GenerationReproducesTheForwardPassOnRaggedBatches) {
  // GQA 2:1, head_dim 64; steps cross the first KV block (128 keys), and the cache has empty blocks past them.
  check_gpu_generation(small_config(256, 512, 4, 2, 64, true, true), {100, 37}, 40, 512, 21);
  // GQA 4:1, head_dim 128, batch 6: tensor-core passes of 6 of the mma's 16 rows, K split over 2-4 warps.
  check_gpu_generation(small_config(512, 1024, 8, 2, 128, true, true), {20, 3, 17, 1, 9, 30}, 12, 256, 22);
  // Batch 11: on wgmma (above kMaxMmaBatch), 11 of a stage's 32 batch rows.
  check_gpu_generation(small_config(256, 512, 4, 2, 64, true, true), {9, 2, 14, 5, 1, 7, 3, 12, 6, 4, 10}, 6, 128, 26);
  // Batch 18: more rows than one mma's M, on wgmma (megakernel_decode_wgmma), 18 of a stage's 32 rows.
  check_gpu_generation(small_config(256, 512, 4, 2, 64, true, true),
                       {9, 2, 14, 5, 1, 7, 3, 12, 6, 4, 10, 8, 11, 13, 2, 6, 15, 1}, 4, 128, 27);
  // Batch 6 of 8 kv heads at context 512: 48 (sequence, kv head) pairs take 2 splits of the 4 blocks, so a long
  // sequence's split computes blocks 0 and 2 in turn (and a short one's split meets an empty block).
  check_gpu_generation(small_config(512, 1024, 8, 8, 64, true, true), {300, 9, 270, 130, 290, 7}, 4, 512, 31);
  // GQA 8:1: all 8 query-head rows of decode attention's mmas; a partial second block and a short first one.
  check_gpu_generation(small_config(512, 1024, 8, 1, 64, true, true), {140, 20}, 8, 256, 32);
  // The prefill in parts of 2, 2 and 1 sequences, each through a cache of its own copied into the batch's.
  check_gpu_generation(small_config(256, 512, 4, 2, 64, true, true), {100, 37, 5, 64, 1}, 6, 256, 28, 2);
  // Multi-head without RoPE, one layer.
  check_gpu_generation(small_config(256, 768, 2, 2, 128, false, true, 1), {5}, 20, 128, 23);
}

// Prompt lengths of `count` sequences, each `short_length` but the (index, length) pairs in `long_ones`: long prompts
// reach the later KV blocks, short ones keep the CPU reference's forward passes cheap.
std::vector<int64_t> mostly_short_prompts(size_t count, int64_t short_length,
                                          const std::vector<std::pair<size_t, int64_t>>& long_ones) {
  std::vector<int64_t> lengths(count, short_length);
  for (const auto& [index, length] : long_ones) lengths.at(index) = length;
  return lengths;
}

// Decode attention keeps later KV blocks loading while one is computed (4 buffers at head_dim 64, 2 at 128): tasks
// of several blocks, the newest key in a prestaged block or in one staged in the loop, and empty blocks.
TEST_F(Gpu, DecodeAttentionStagesBlocksAhead) {
  // 9 sequences x 8 kv heads = 72 pairs: one split of all 4 blocks; positions past 384 put the newest key in block 3,
  // the one a 4-buffer task stages in its loop.
  check_gpu_generation(small_config(512, 1024, 8, 8, 64, true, true), {450, 400, 60, 390, 200, 440, 10, 420, 300}, 4,
                       512, 34);
  // head_dim 128, 34 sequences x 4 kv heads = 136 pairs: one split of both blocks, the second staged in the loop.
  std::vector<int64_t> prompts;
  for (int64_t b = 0; b < 34; ++b) prompts.push_back(100 + (b * 37) % 150);
  check_gpu_generation(small_config(512, 1024, 4, 4, 128, true, true), prompts, 4, 256, 35);
  // More blocks than buffers, so that a buffer is reused for block j + buffers - 1 once block j - 1 is done: head_dim
  // 64, 72 pairs: one split of 6 blocks (max context 768), up to 6 of them holding keys; head_dim 128, 68 pairs: one
  // split of 4 blocks (max context 512), up to 4 holding keys. Most prompts are short: the CPU reference is the cost.
  check_gpu_generation(small_config(512, 1024, 8, 8, 64, true, true), {700, 50, 650, 300, 10, 690, 200, 120, 520}, 3,
                       768, 36);
  check_gpu_generation(small_config(512, 1024, 4, 4, 128, true, true),
                       mostly_short_prompts(17, 20, {{0, 460}, {7, 300}, {16, 410}}), 3, 512, 37);
  // Tiles of several blocks by halves of the warps (run_blocks_in_halves; decode and wide kernels, head_dim 64), at
  // GQA 4:1 and 8:1. 33 sequences x 2 kv heads = 66 pairs: 2 splits of 4 blocks, so that half 1 stages block 3 in its
  // loop; 17 sequences x 1 kv head: 7 splits of 2 blocks (blocks s and s + 7), split 0's both holding keys for the
  // 950-token prompt, every other split's second block past the cache (empty).
  check_gpu_generation(small_config(512, 1024, 8, 2, 64, true, true),
                       mostly_short_prompts(33, 20, {{0, 900}, {5, 520}, {11, 400}, {32, 700}}), 3, 1024, 38);
  check_gpu_generation(small_config(512, 1024, 8, 1, 64, true, true),
                       mostly_short_prompts(17, 12, {{3, 950}, {16, 300}}), 3, 1024, 39);
}

TEST_F(Gpu, TensorCoreDecodeTilesAtTheirEdges) {
  // d_ff 8704: gate_up tiles of 128 pairs, 16 units of two groups, so warps take two jobs each; vocab 8440: LM head
  // tiles of 64 columns, the last one 56 (7 groups: one warp idle); a batch of 3: the smallest tensor-core pass.
  ModelConfig config = small_config(256, 8704, 4, 2, 64, true, true, 1);
  config.vocab_size = 8440;
  check_gpu_generation(config, {12, 5, 30}, 6, 128, 29);
}

TEST_F(Gpu, DecodeLmHeadTilesOfUnequalWidths) {
  // vocab 15992: one round of 132 LM head tiles (balanced_decode_columns), 76 of 128 columns, 55 of 112 and a last
  // of 104. Batch 1: the CUDA cores, 7 pairs a warp at 112; batch 3: the tensor cores, 7 units of two groups at 112
  // (one warp idle), and at 104 a last unit of one real group.
  ModelConfig config = small_config(256, 512, 4, 2, 64, true, true, 1);
  config.vocab_size = 15992;
  check_gpu_generation(config, {9}, 6, 128, 38);
  check_gpu_generation(config, {12, 5, 30}, 6, 128, 39);
}

TEST_F(Gpu, GreedySampleOverSeveralPasses) {
  // vocab 98312: the sample's row goes through its two 64 KB buffers in four passes (three of 32768 logits and one of
  // 8), each new token checked against the argmax of its step's downloaded logits; batch 1 (CUDA-core GEMMs) and 3.
  ModelConfig config = small_config(256, 512, 4, 2, 64, true, true, 1);
  config.vocab_size = 98312;
  check_gpu_generation(config, {9}, 6, 128, 40);
  check_gpu_generation(config, {12, 5, 30}, 6, 128, 41);
}

TEST_F(Gpu, TensorCoreDecodePassesOverKRanges) {
  // d_model 4352: down tiles of 64 columns, 8 groups, one a warp over the whole K (one slice); d_ff 8256 at batch 4:
  // 3 K ranges of 2752 (not a multiple of a weight step) for down, the rest in one range.
  check_gpu_generation(small_config(4352, 8256, 68, 17, 64, true, true, 1), {5, 9, 3, 7}, 4, 128, 30);
}

TEST_F(Gpu, DecodeKRangesHoldForTheLastShorterPass) {
  // d_ff 4160 = 65 blocks of 64 at batch 31: on wgmma, down's K in 33 steps of 128, the last one half past K. (In
  // mma.sync passes of 16 and 15 rows, 15 rows alone would have taken no K ranges, 2-4 not dividing 65 blocks, and
  // overran the staging space before the ranges were the full pass's.)
  std::vector<int64_t> prompt_lengths;
  for (int64_t b = 0; b < 31; ++b) prompt_lengths.push_back(1 + b % 7);
  check_gpu_generation(small_config(256, 4160, 4, 2, 64, true, true, 1), prompt_lengths, 3, 64, 31);
}

// Greedy steps in groups (DecodeEngine::steps: the engine feeds each step the previous one's ids at the next
// positions on the device, with no host between) make the same tokens and stops as steps fed one at a time by the
// host, including a group cut by the cache's end and a sequence stopping at EOS within a group.
void check_steps_fed_on_the_device(const ModelConfig& config, const std::vector<int64_t>& prompt_lengths,
                                   int64_t new_tokens, int64_t max_context, uint64_t seed) {
  SCOPED_TRACE(fmt::format("{} batch {} max context {}", config.name, prompt_lengths.size(), max_context));
  const GenerationCase c = generation_case(config, prompt_lengths, max_context, seed);
  const ModelWeights& weights = c.weights;
  const std::vector<std::vector<int32_t>>& prompts = c.prompts;
  const DecodeSetup& setup = c.setup;
  const std::unique_ptr<DecodeEngine> gpu = make_gpu_decoder(weights, setup);
  GenerationOptions by_host;
  by_host.max_new_tokens = new_tokens;
  by_host.steps_per_sync = 1;
  GenerationOptions on_device = by_host;
  on_device.steps_per_sync = 8;
  const GenerationResult expected = generate(*gpu, prompts, by_host);
  const GenerationResult grouped = generate(*gpu, prompts, on_device);
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(grouped.sequences[b].tokens, expected.sequences[b].tokens) << "sequence " << b;
    EXPECT_EQ(grouped.sequences[b].stop, expected.sequences[b].stop) << "sequence " << b;
  }
  EXPECT_EQ(grouped.step_s.size(), expected.step_s.size());
  EXPECT_LT(grouped.waits, int64_t(grouped.step_s.size())) << "no group of steps ran without the host";
  // The third new token of sequence 0 as EOS: it stops inside the first group, the others run on.
  const SequenceResult& first = expected.sequences[0];
  ASSERT_GE(int64_t(first.tokens.size()), first.prompt_length + 3) << "too few tokens for the EOS case";
  by_host.eos_ids = on_device.eos_ids = {first.tokens[size_t(first.prompt_length + 2)]};
  const GenerationResult expected_eos = generate(*gpu, prompts, by_host);
  EXPECT_EQ(expected_eos.sequences[0].stop, StopReason::kEos);
  const GenerationResult grouped_eos = generate(*gpu, prompts, on_device);
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(grouped_eos.sequences[b].tokens, expected_eos.sequences[b].tokens) << "EOS, sequence " << b;
    EXPECT_EQ(grouped_eos.sequences[b].stop, expected_eos.sequences[b].stop) << "EOS, sequence " << b;
  }
}

TEST_F(Gpu, GreedyStepsFedOnTheDeviceMatchStepsFedByTheHost) {
  check_steps_fed_on_the_device(find_preset("tiny").config, {8}, 21, 64, 41);
  // Ragged, and a cache of 32 rows: the longest sequence's second group is cut short by the cache's end.
  check_steps_fed_on_the_device(find_preset("tiny").config, {19, 5, 11}, 40, 32, 42);
  ModelConfig config = find_preset("llama-3.2-1b").config;
  config.n_layers = 2;
  config.vocab_size = 4096;
  check_steps_fed_on_the_device(config, {64}, 20, 1024, 43);
  check_steps_fed_on_the_device(config, {64, 9, 30, 17}, 12, 1024, 44);  // the tensor-core path
}

TEST_F(Gpu, GenerationOnTheTinyPresetMatchesTheForwardPass) {
  check_gpu_generation(find_preset("tiny").config, {8, 5}, 16, 64, 24);
}

TEST_F(Gpu, GenerationOfALlama1bShapedModel) {
  ModelConfig config = find_preset("llama-3.2-1b").config;
  config.n_layers = 2;
  config.vocab_size = 4096;  // keeps the CPU forward passes of the check short
  check_gpu_generation(config, {64}, 8, 1024, 25);
  // Batch 5: tensor-core passes at the real widths (two groups a warp for gate_up, K split 4 ways for o_proj and
  // down), and down's k = 8192 holds only 4 rows in the staging space: one pass of 5 rows over 2 K ranges.
  check_gpu_generation(config, {64, 9, 30, 17, 41}, 4, 1024, 28);
  // Batch 20: on wgmma at the real widths, in stages of 32 batch rows: the norm-fused q, kv, gate_up and LM head tiles
  // (chunks of 256 weight rows), o_proj, and down over K 8192.
  check_gpu_generation(config, {9, 3, 7, 5, 12, 1, 8, 6, 4, 11, 6, 10, 2, 7, 3, 10, 5, 3, 8, 4}, 3, 1024, 33);
}

// Batches above 8 run megakernel_decode_wgmma: decode GEMMs on wgmma, a pass of up to 64 batch rows (one M tile)
// streaming through the ring beside the weights in K steps (decode_gemm_wgmma.cuh).
TEST_F(Gpu, WideDecodePasses) {
  // Batch 40 at d_model 2560 and d_ff 3072: one pass, the norm-fused ops' (q, kv, gate_up, the LM head) rows' squares
  // summed as they land and their 1 / rms applied to the accumulators (the norm weights folded into the weights).
  std::vector<int64_t> forty;
  for (int64_t b = 0; b < 40; ++b) forty.push_back(1 + (b * 5) % 9);
  check_gpu_generation(small_config(2560, 3072, 20, 4, 128, true, true, 1), forty, 3, 64, 45);
  // LM head tiles wider than one chunk of 256 weight rows, in stages of 32 batch rows (the m64 wgmma's rows past them
  // dropped): batch 20, vocabulary 20000 (~152 columns a tile: 2 chunks) at d_model 256; batch 32, vocabulary 40000
  // (~303 columns: 3 chunks) at d_model 3072.
  ModelConfig config = small_config(256, 512, 4, 2, 64, true, true, 1);
  config.vocab_size = 20000;
  check_gpu_generation(config, std::vector<int64_t>(forty.begin(), forty.begin() + 20), 3, 64, 46);
  config = small_config(3072, 3072, 24, 4, 128, true, true, 1);
  config.vocab_size = 40000;
  std::vector<int64_t> thirty_two;
  for (int64_t b = 0; b < 32; ++b) thirty_two.push_back(1 + b % 4);
  check_gpu_generation(config, thirty_two, 2, 64, 47);
  // Batch 70: a pass of 64 rows, then one of 6, through each tile's weights.
  std::vector<int64_t> seventy;
  for (int64_t b = 0; b < 70; ++b) seventy.push_back(1 + (b * 3) % 8);
  check_gpu_generation(small_config(256, 512, 4, 2, 64, true, true, 1), seventy, 3, 64, 48);
}

TEST_F(Gpu, WideDecodePassesAtTheLlama1bWidths) {
  // Batch 64, one pass at the real widths: q and kv tiles of 32 columns in pair order (RoPE in the epilogue), o_proj
  // and down of 16 (8 weight rows a warpgroup), gate_up of 64 columns (gate and up: 128 weight rows), down's K 8192.
  ModelConfig config = find_preset("llama-3.2-1b").config;
  config.n_layers = 2;
  config.vocab_size = 4096;
  std::vector<int64_t> sixty_four;
  for (int64_t b = 0; b < 64; ++b) sixty_four.push_back(1 + (b * 7) % 12);
  check_gpu_generation(config, sixty_four, 3, 1024, 49);
}

// use(gpu) on a tiny decode engine of batch 2 on `sm_count` SMs whose sample task waits for a signal that never comes;
// `planted` says which wait (use is not called when there is none). Nothing waits for the sample task, so its wait is
// the only one that can stall.
void with_planted_stall(int32_t sm_count, bool skip_dependency_waits, PlantedWait& planted,
                        const std::function<void(GpuEngine&)>& use) {
  const ModelConfig config = find_preset("tiny").config;
  const RunShape shape{2, 1, PassKind::kDecode, 128};
  const Graph graph(config, shape);
  Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, sm_count);
  planted = plant_missing_signal(schedule, Opcode::kSample);
  if (!planted.planted) return;
  GpuEngine gpu(graph, schedule, random_weights(config, 1),
                {.stall_timeout_s = 0.5, .verify = false, .skip_dependency_waits = skip_dependency_waits});
  ref::ModelInput input;
  input.shape = shape;
  input.tokens = {1, 2};
  input.positions = {3, 7};
  gpu.set_input(input);
  use(gpu);
}

// What `run` throws from the engine of with_planted_stall (a test failure if nothing).
std::string planted_stall_message(int32_t sm_count, const std::function<void(GpuEngine&)>& run,
                                  PlantedWait& planted) {
  std::string message = "the decode schedule has no sample task with a wait";
  with_planted_stall(sm_count, false, planted,
                     [&](GpuEngine& gpu) { message = testing_util::error_of([&] { run(gpu); }); });
  return message;
}

// In decode passes the counter poller warp checks the consumers' counters; a wait that is never met must still be
// reported naming its task and counter (the poller's stall report), not as a hang or a shared-memory stall.
TEST_F(Gpu, DecodeMissingSignalIsReportedNamingTheWait) {
  PlantedWait planted;
  const std::string message = planted_stall_message(info_.sm_count, [](GpuEngine& gpu) { gpu.run(); }, planted);
  ASSERT_TRUE(planted.planted) << message;
  EXPECT_THAT(message, HasSubstr("megakernel stall: SM"));
  EXPECT_THAT(message, HasSubstr(fmt::format("(task {}: sample", planted.task)));
  EXPECT_THAT(message, HasSubstr(fmt::format("counter {},", planted.counter)));
  EXPECT_THAT(message, Not(HasSubstr("launched together"))) << "a single launch names no step";
}

// In a group of steps fed on the device, the stall names the step that stalled (the later ones leave at their first
// wait once the first aborts).
TEST_F(Gpu, DecodeStallInAGroupNamesTheStep) {
  PlantedWait planted;
  const std::string message = planted_stall_message(
      info_.sm_count, [](GpuEngine& gpu) { gpu.run_steps_and_read_sampled(4); }, planted);
  ASSERT_TRUE(planted.planted) << message;
  EXPECT_THAT(message, HasSubstr(fmt::format("counter {},", planted.counter)));
  EXPECT_THAT(message, HasSubstr("(step 1 of the 4 launched together)"));
}

// The diagnostic skips every wait on another SM's counter: the missing signal is passed over, in every step of a group
// fed on the device, and the sampled ids stay inside the vocabulary (the next step's embedding reads them).
TEST_F(Gpu, DecodeSkippedDependencyWaitsPassAMissingSignal) {
  PlantedWait planted;
  with_planted_stall(info_.sm_count, true, planted, [](GpuEngine& gpu) {
    const std::vector<int32_t> sampled = gpu.run_steps_and_read_sampled(4);
    ASSERT_EQ(sampled.size(), 8u);
    const int32_t vocab = find_preset("tiny").config.vocab_size;
    for (int32_t id : sampled) EXPECT_TRUE(id >= 0 && id < vocab) << id;
    gpu.run();
  });
  ASSERT_TRUE(planted.planted);
}

TEST_F(Gpu, DecodeRefusesWhatItCannotServe) {
  ModelConfig config = small_config(256, 512, 16, 1, 64, true, true);  // 16 query heads per kv head
  DecodeSetup setup;
  setup.max_context = 64;
  EXPECT_THAT([&] { make_gpu_decoder(random_weights(config, 1), setup); },
              testing::ThrowsMessage<Error>(HasSubstr("at most 8 query heads per kv head")));
}

}  // namespace
}  // namespace mk
