// Tests of generation on the CPU engines: the reference's incremental decode against the full-sequence forward
// pass, the cpu-vm's decode schedules against the reference, ragged batches, sampling, and where generation stops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "mk/generate.h"
#include "mk/gpu.h"
#include "mk/random.h"
#include "test_models.h"
#include "test_util.h"

namespace mk {
namespace {

using ::testing::HasSubstr;

bool bitwise_equal(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0;
}

DecodeSetup setup_for(int64_t batch, int64_t max_context, int32_t num_sms = 7) {
  DecodeSetup setup;
  setup.batch = batch;
  setup.max_context = max_context;
  setup.num_sms = num_sms;
  return setup;
}

GenerationResult generate_with(const std::string& engine, const ModelWeights& weights, const DecodeSetup& setup,
                               const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens) {
  GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.keep_logits = true;
  return generate(*make_decoder(engine, weights, setup), prompts, options);
}

// The logits of every position of one sequence, from one forward pass over all of it.
ref::Matrix forward_logits(const ModelWeights& weights, const std::vector<int32_t>& tokens) {
  ref::ModelInput input;
  input.shape = {1, int64_t(tokens.size())};
  input.tokens = tokens;
  return ref::forward(weights, input);
}

// Decodes `prompt` greedily and checks every step's logits against one forward pass over the same tokens.
void expect_decode_equals_forward(const ModelWeights& weights, const std::vector<int32_t>& prompt, int64_t new_tokens,
                                  int64_t max_context) {
  const GenerationResult result = generate_with("reference", weights, setup_for(1, max_context), {prompt}, new_tokens);
  const std::vector<int32_t>& tokens = result.sequences[0].tokens;
  ASSERT_EQ(tokens.size(), prompt.size() + size_t(new_tokens));
  const ref::Matrix full = forward_logits(weights, {tokens.begin(), tokens.end() - 1});
  for (size_t step = 0; step < result.logits.size(); ++step) {
    const int64_t position = int64_t(prompt.size()) - 1 + int64_t(step);
    EXPECT_TRUE(bitwise_equal(result.logits[step].row(0), full.row(position), full.cols)) << "step " << step;
    // Greedy: each new token is the argmax of the forward pass's logits at the position before it.
    const float* row = full.row(position);
    EXPECT_EQ(tokens[size_t(position + 1)], int32_t(std::max_element(row, row + full.cols) - row)) << "step " << step;
  }
}

// Bit-equal, not merely close: decode computes every op through the forward's arithmetic (src/ref/arith.h), the
// RMSNorm it fuses and the KV blocks of its split attention included, so the same tokens give the same bits.
TEST(Decode, ReferenceIncrementalLogitsEqualTheForwardPassBitForBit) {
  // 151 positions cross a KV block boundary (128), so the combine merges two blocks.
  expect_decode_equals_forward(random_weights(find_preset("tiny").config, 3),
                               random_prompt(find_preset("tiny").config, 140, 1), 12, 256);
  Random random(31);
  for (int trial = 0; trial < 4; ++trial) {  // GQA 1-8, head_dim 64 and 128, every RoPE, tied heads
    ModelConfig config = random_small_config(random);
    config.has_embedding = config.has_lm_head = true;
    SCOPED_TRACE(describe(config));
    expect_decode_equals_forward(random_weights(config, 50 + uint64_t(trial)), random_prompt(config, 9 + trial, 2), 6,
                                 64);
  }
}

// Generates 5 tokens after `prompts` on the cpu-vm and on the reference: the same logits bit for bit, the same tokens.
void expect_vm_equals_reference(const ModelWeights& weights, const DecodeSetup& setup,
                                const std::vector<std::vector<int32_t>>& prompts) {
  const GenerationResult reference = generate_with("reference", weights, setup, prompts, 5);
  const GenerationResult vm = generate_with("cpu-vm", weights, setup, prompts, 5);
  ASSERT_EQ(vm.logits.size(), reference.logits.size());
  for (size_t step = 0; step < vm.logits.size(); ++step)
    EXPECT_TRUE(bitwise_equal(vm.logits[step].data.data(), reference.logits[step].data.data(),
                              int64_t(vm.logits[step].data.size())))
        << "step " << step;
  for (size_t b = 0; b < prompts.size(); ++b) EXPECT_EQ(vm.sequences[b].tokens, reference.sequences[b].tokens);
}

TEST(Decode, CpuVmEqualsTheReferenceBitForBitOnRaggedBatches) {
  Random random(17);
  for (int trial = 0; trial < 4; ++trial) {
    ModelConfig config = trial == 0 ? find_preset("tiny").config : random_small_config(random);
    config.has_embedding = config.has_lm_head = true;
    config.tie_word_embeddings = trial % 2;
    const ModelWeights weights = random_weights(config, 40 + uint64_t(trial));
    const int64_t batch = 1 + trial % 3;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < batch; ++b)
      prompts.push_back(random_prompt(config, 1 + int64_t(random.next_u64() % 20), 7 * uint64_t(b)));
    DecodeSetup setup = setup_for(batch, 128 + 64 * (trial % 2), int32_t(2 + trial));
    setup.vm.max_delay_us = 30;
    setup.sampling = trial % 2 ? ref::SamplingParams{0.8f, 20, 0.9f, 5} : ref::SamplingParams{};
    SCOPED_TRACE(describe(config));
    expect_vm_equals_reference(weights, setup, prompts);
  }
}

// 15992 logits: a round of 132 LM head tiles, 76 of 128 columns, 55 of 112 and a last of 104 (the random configs'
// vocabularies make tiles of 16 only).
TEST(Decode, CpuVmEqualsTheReferenceBitForBitWithTilesOfUnequalWidths) {
  ModelConfig config = find_preset("tiny").config;
  config.vocab_size = 15992;
  const ModelWeights weights = random_weights(config, 8);
  expect_vm_equals_reference(weights, setup_for(2, 64, 9),
                             {random_prompt(config, 7, 1), random_prompt(config, 3, 2)});
}

TEST(Decode, EachSequenceOfARaggedBatchGetsTheTokensItGetsAlone) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 5);
  const std::vector<std::vector<int32_t>> prompts = {
      random_prompt(weights.config, 3, 1), random_prompt(weights.config, 11, 2), random_prompt(weights.config, 1, 3)};
  const GenerationResult together = generate_with("cpu-vm", weights, setup_for(3, 64), prompts, 6);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const GenerationResult alone = generate_with("reference", weights, setup_for(1, 64), {prompts[b]}, 6);
    EXPECT_EQ(together.sequences[b].tokens, alone.sequences[0].tokens) << "sequence " << b;
    for (size_t step = 0; step < alone.logits.size(); ++step)
      EXPECT_TRUE(
          bitwise_equal(together.logits[step].row(int64_t(b)), alone.logits[step].row(0), alone.logits[step].cols));
  }
}

TEST(Decode, SamplingIsReproducibleFromItsSeedAndTopKOneIsGreedy) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 6);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(weights.config, 4, 1),
                                                     random_prompt(weights.config, 4, 1)};
  auto tokens_with = [&](ref::SamplingParams sampling) {
    DecodeSetup setup = setup_for(2, 64);
    setup.sampling = sampling;
    const GenerationResult result = generate_with("reference", weights, setup, prompts, 12);
    return std::vector{result.sequences[0].tokens, result.sequences[1].tokens};
  };
  const auto first = tokens_with({1.0f, 0, 1.0f, 42});
  EXPECT_EQ(tokens_with({1.0f, 0, 1.0f, 42}), first);
  EXPECT_NE(tokens_with({1.0f, 0, 1.0f, 43}), first);
  EXPECT_NE(first[0], first[1]) << "two sequences with one prompt draw their own numbers";
  EXPECT_EQ(tokens_with({0.7f, 1, 1.0f, 42}), tokens_with({}));
  EXPECT_EQ(tokens_with({0.7f, 0, 1e-6f, 9}), tokens_with({})) << "a tiny top-p keeps only the largest";
}

TEST(Sampling, DrawsFromTheTopKAndTopPCandidatesInOrder) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f,
                                     2.0f};  // ids by logit: 1, 3 (tie, lower id first), 4, 2, 0
  const float* l = logits.data();
  EXPECT_EQ(ref::sample_token(l, 5, {}, 0.99f), 1) << "greedy: the first largest";
  EXPECT_EQ(ref::sample_token(l, 5, {1.0f, 1, 1.0f, 0}, 0.99f), 1);
  EXPECT_EQ(ref::sample_token(l, 5, {1.0f, 2, 1.0f, 0}, 0.0f), 1);
  EXPECT_EQ(ref::sample_token(l, 5, {1.0f, 2, 1.0f, 0}, 0.99f), 3);
  // top-p 0.5 of weights e^0 (x2), e^-1, e^-2, e^-3: the two tied largest already hold more than half.
  for (float u : {0.0f, 0.3f, 0.6f, 0.999f}) {
    const int32_t token = ref::sample_token(l, 5, {1.0f, 0, 0.5f, 0}, u);
    EXPECT_TRUE(token == 1 || token == 3) << u;
  }
  EXPECT_EQ(ref::sample_token(l, 5, {1.0f, 0, 1.0f, 0}, 0.999f), 0) << "all candidates: the last is the smallest";
  // The uniform numbers: in [0, 1), a pure function of (seed, sequence, position).
  EXPECT_EQ(ref::sampling_uniform(1, 2, 3), ref::sampling_uniform(1, 2, 3));
  EXPECT_NE(ref::sampling_uniform(1, 2, 3), ref::sampling_uniform(1, 3, 3));
  EXPECT_NE(ref::sampling_uniform(1, 2, 3), ref::sampling_uniform(1, 2, 4));
  double sum = 0;
  for (int64_t p = 0; p < 4000; ++p) {
    const float u = ref::sampling_uniform(7, 0, p);
    ASSERT_TRUE(u >= 0.0f && u < 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 4000, 0.5, 0.02);
}

// A decode engine whose next token of each sequence is a function of its token and position, recording how many
// steps each call to steps() asked for; a step at or past the cache's end fails the test.
class CountingEngine final : public DecodeEngine {
 public:
  explicit CountingEngine(const DecodeSetup& setup) : setup_(setup) {}
  void prefill(const std::vector<int32_t>&, int64_t, int64_t) override {}
  std::vector<int32_t> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) override {
    std::vector<int32_t> next;
    for (size_t b = 0; b < tokens.size(); ++b) {
      EXPECT_LT(positions[b], setup_.max_context) << "sequence " << b << " fed past the cache's end";
      next.push_back((tokens[b] * 7 + positions[b] * 3 + 1) % 50);
    }
    return next;
  }
  std::vector<std::vector<int32_t>> steps(std::vector<int32_t> tokens, std::vector<int32_t> positions,
                                          int64_t count) override {
    counts.push_back(count);
    return DecodeEngine::steps(std::move(tokens), std::move(positions), count);
  }
  int64_t max_steps_per_sync() const override { return 64; }
  const ref::Matrix& logits() const override { return logits_; }
  const DecodeSetup& setup() const override { return setup_; }
  std::string describe() const override { return "counting"; }
  std::vector<int64_t> counts;

 private:
  DecodeSetup setup_;
  ref::Matrix logits_;
};

using Streamed = std::vector<std::pair<int64_t, std::vector<int32_t>>>;  // (step, the ids it made)

// Generates with the options, recording what it streams and the engine's group sizes.
GenerationResult generate_counting(const std::vector<std::vector<int32_t>>& prompts, int64_t max_context,
                                   const GenerationOptions& options, Streamed& streamed,
                                   std::vector<int64_t>& counts) {
  CountingEngine engine(setup_for(int64_t(prompts.size()), max_context));
  const GenerationResult result = generate(engine, prompts, options, [&](int64_t step, const auto& made) {
    streamed.emplace_back(step, made);
  });
  counts = engine.counts;
  return result;
}

// A prefill in parts of the batch (each part through a cache of its own, copied into the batch's) leaves the cache a
// prefill of the whole batch leaves: every step's logits equal bit for bit, on both cpu engines, for parts of one
// sequence, of unequal sizes (2, 2, 1) and of nearly the whole batch.
TEST(Generate, PrefillInPartsOfTheBatchEqualsOnePass) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 6);
  std::vector<std::vector<int32_t>> prompts;
  for (const int64_t length : {9, 2, 14, 1, 6}) prompts.push_back(random_prompt(weights.config, length, 30 + length));
  for (const char* engine : {"reference", "cpu-vm"}) {
    GenerationOptions options;
    options.max_new_tokens = 5;
    options.keep_logits = true;
    const GenerationResult whole = generate(*make_decoder(engine, weights, setup_for(5, 64)), prompts, options);
    for (const int64_t per_pass : {1, 2, 4}) {
      SCOPED_TRACE(fmt::format("{}, {} sequences a prefill pass", engine, per_pass));
      options.prefill_batch = per_pass;
      const GenerationResult parts = generate(*make_decoder(engine, weights, setup_for(5, 64)), prompts, options);
      EXPECT_EQ(parts.prefill_passes, (5 + per_pass - 1) / per_pass);  // ignored, it would be one pass and equal
      for (size_t b = 0; b < prompts.size(); ++b)
        EXPECT_EQ(parts.sequences[b].tokens, whole.sequences[b].tokens) << "sequence " << b;
      ASSERT_EQ(parts.logits.size(), whole.logits.size());
      for (size_t step = 0; step < whole.logits.size(); ++step)
        EXPECT_TRUE(bitwise_equal(parts.logits[step].data.data(), whole.logits[step].data.data(),
                                  int64_t(whole.logits[step].data.size())))
            << "step " << step;
    }
  }
}

TEST(Generate, GroupsOfStepsMakeWhatSingleStepsMake) {
  const std::vector<std::vector<int32_t>> prompts = {{3, 9, 4}, {1}, {7, 2, 8, 8, 5, 6}};
  for (const int64_t max_context : {int64_t(12), int64_t(40)}) {
    for (const bool with_eos : {false, true}) {
      SCOPED_TRACE(fmt::format("max context {}, {}", max_context, with_eos ? "EOS" : "no EOS"));
      GenerationOptions options;
      options.max_new_tokens = 23;
      Streamed single_streamed, grouped_streamed;
      std::vector<int64_t> single_counts, grouped_counts;
      if (with_eos) {  // sequence 0's third new token: it stops inside the first group of 5
        const GenerationResult free = generate_counting(prompts, max_context, options, single_streamed, single_counts);
        options.eos_ids = {free.sequences[0].tokens[5]};
        single_streamed.clear();
      }
      const GenerationResult expected =
          generate_counting(prompts, max_context, options, single_streamed, single_counts);
      EXPECT_THAT(single_counts, ::testing::Each(1));
      if (with_eos) {
        EXPECT_EQ(expected.sequences[0].stop, StopReason::kEos);
      }
      options.steps_per_sync = 5;
      const GenerationResult result =
          generate_counting(prompts, max_context, options, grouped_streamed, grouped_counts);
      for (size_t b = 0; b < prompts.size(); ++b) {
        EXPECT_EQ(result.sequences[b].tokens, expected.sequences[b].tokens) << "sequence " << b;
        EXPECT_EQ(result.sequences[b].stop, expected.sequences[b].stop) << "sequence " << b;
      }
      EXPECT_EQ(grouped_streamed, single_streamed);
      EXPECT_EQ(result.step_s.size(), expected.step_s.size());
      EXPECT_EQ(result.waits, int64_t(grouped_counts.size()));
      EXPECT_EQ(expected.waits, int64_t(expected.step_s.size()));
      // Groups of up to 5 (the longest prompt has 12 - 5 = 7 rows of cache left, so at 12 the second group is cut
      // to 2), going on after sequence 0 stops at EOS, its own ids fed to it inside the groups (the engine fails a
      // step of any sequence at or past its cache's end).
      ASSERT_GE(grouped_counts.size(), 2u);
      EXPECT_EQ(grouped_counts[0], 5);
      EXPECT_EQ(grouped_counts[1], max_context == 12 ? 2 : 5);
      EXPECT_LT(grouped_counts.size(), single_counts.size());
    }
  }
}

TEST(Generate, StopsAtEosAtTheTokenBudgetAndAtTheCachesEnd) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 7);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(weights.config, 5, 1),
                                                     random_prompt(weights.config, 9, 2)};
  GenerationOptions options;
  options.max_new_tokens = 4;
  const GenerationResult budget = generate(*make_reference_decoder(weights, setup_for(2, 16)), prompts, options);
  EXPECT_EQ(budget.sequences[0].stop, StopReason::kMaxNewTokens);
  EXPECT_EQ(budget.sequences[0].tokens.size(), 9u);

  // 16 positions: every sequence runs to the cache's end, whose last new token has no row left to be fed at.
  options.max_new_tokens = 100;
  const GenerationResult full = generate(*make_reference_decoder(weights, setup_for(2, 16)), prompts, options);
  for (const SequenceResult& sequence : full.sequences) {
    EXPECT_EQ(sequence.stop, StopReason::kCacheFull);
    EXPECT_EQ(sequence.tokens.size(), 17u);
  }
  EXPECT_EQ(full.step_s.size(), 12u);

  // Sequence 0's first new token as EOS: it stops at once; sequence 1 runs on until it makes that token too.
  options.eos_ids = {full.sequences[0].tokens[5]};
  std::vector<std::vector<int32_t>> streamed;
  const GenerationResult result =
      generate(*make_reference_decoder(weights, setup_for(2, 16)), prompts, options,
               [&](int64_t, const std::vector<int32_t>& made) { streamed.push_back(made); });
  EXPECT_EQ(result.sequences[0].stop, StopReason::kEos);
  EXPECT_EQ(result.sequences[0].tokens.size(), 6u);
  const std::vector<int32_t>& run_on = full.sequences[1].tokens;
  const auto eos = std::find(run_on.begin() + 9, run_on.end(), options.eos_ids[0]);
  EXPECT_EQ(result.sequences[1].stop, eos == run_on.end() ? StopReason::kCacheFull : StopReason::kEos);
  EXPECT_EQ(result.sequences[1].tokens, std::vector<int32_t>(run_on.begin(), std::min(run_on.end(), eos + 1)));
  ASSERT_EQ(streamed.size(), result.sequences[1].tokens.size() - 9);
  EXPECT_EQ(streamed[0][0], options.eos_ids[0]);
  if (streamed.size() > 1) {
    EXPECT_EQ(streamed[1][0], -1) << "a stopped sequence streams nothing";
  }
  EXPECT_EQ(streamed.back()[1], result.sequences[1].tokens.back());
}

TEST(Generate, BadArgumentsAreClearErrors) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 8);
  auto engine = make_reference_decoder(weights, setup_for(1, 8));
  auto error_of = [](const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of([&] { generate(*engine, {random_prompt(weights.config, 9, 1)}, {}); }),
              HasSubstr("more than the KV cache's 8 positions"));
  EXPECT_THAT(error_of([&] { generate(*engine, {{}}, {}); }), HasSubstr("prompt 0 is empty"));
  EXPECT_THAT(error_of([&] { generate(*engine, {{1}, {2}}, {}); }), HasSubstr("2 prompts for an engine of batch 1"));
  EXPECT_THAT(error_of([&] { generate(*engine, {{1000}}, {}); }), HasSubstr("outside the vocabulary"));
  for (const int64_t steps : {int64_t(0), int64_t(-2), kMaxStepsPerSync + 1}) {
    GenerationOptions options;
    options.steps_per_sync = steps;
    EXPECT_THAT(error_of([&] { generate(*engine, {{1}}, options); }),
                HasSubstr(fmt::format("steps per sync must be in [1, 1024], got {}", steps)));
  }
  // A one-token prompt has no prefill, and a negative prefill batch is refused all the same.
  GenerationOptions negative_parts;
  negative_parts.prefill_batch = -1;
  EXPECT_THAT(error_of([&] { generate(*engine, {{1}}, negative_parts); }),
              HasSubstr("prefill batch must not be negative, got -1"));
  DecodeSetup bad = setup_for(1, 8);
  bad.sampling.top_p = 0;
  EXPECT_THAT(error_of([&] { make_cpu_vm_decoder(weights, bad); }),
              HasSubstr("SamplingParams::top_p must be in (0, 1], got 0"));
  bad = setup_for(1, 2048);
  EXPECT_THAT(error_of([&] { make_reference_decoder(weights, bad); }),
              HasSubstr("max context 2048 exceeds the model's max_position_embeddings 1024"));
  EXPECT_THAT(error_of([&] { make_decoder("tpu", weights, setup_for(1, 8)); }), HasSubstr("unknown engine 'tpu'"));
  EXPECT_THAT(error_of([&] { engine->trace_step({1}, {0}, "unused.json"); }),
              HasSubstr("tracing a decode step needs the gpu engine"));
  EXPECT_EQ(resolve_decode_engine("auto"), query_gpu().usable ? "gpu" : "cpu-vm");
  EXPECT_EQ(resolve_decode_engine("reference"), "reference");
  if (!query_gpu().usable) {  // where there is one, tests/gpu covers it
    EXPECT_THAT(error_of([&] { make_decoder("gpu", weights, setup_for(1, 8)); }),
                HasSubstr("gpu engine: " + query_gpu().reason));
  }
  ModelConfig seed = find_preset("seed").config;
  seed.n_layers = 1;
  EXPECT_THAT(error_of([&] { make_reference_decoder(random_weights(seed, 1), setup_for(1, 8)); }),
              HasSubstr("has no embedding: generating needs token ids in and logits out"));
}

// What an engine's construction or generate() would refuse, check_generation refuses alike with nothing built (Python's
// Model.stream checks its arguments with it when called and generates only when iterated).
TEST(Generate, CheckGenerationRefusesWhatGenerateRefuses) {
  using testing_util::error_of;  // fails the test where nothing is thrown
  const ModelWeights weights = random_weights(find_preset("tiny").config, 8);
  GenerationOptions negative;
  negative.max_new_tokens = -1;
  DecodeSetup no_top_p = setup_for(1, 8);
  no_top_p.sampling.top_p = 0;
  const struct {
    std::vector<std::vector<int32_t>> prompts;
    GenerationOptions options;
    DecodeSetup setup;
  } cases[] = {{{random_prompt(weights.config, 9, 1)}, {}, setup_for(1, 8)},
               {{{1}, {2}}, {}, setup_for(1, 8)},
               {{{}}, {}, setup_for(1, 8)},
               {{{1}}, negative, setup_for(1, 8)},
               {{{1}}, {}, no_top_p},
               {{{1}}, {}, setup_for(1, 2048)}};
  // The sampling's parameters named as an engine names them, so that the messages are the same.
  SettingNames names;
  names.sampling = {};
  for (const auto& [prompts, options, setup] : cases) {
    const std::string refused =
        error_of([&] { generate(*make_reference_decoder(weights, setup), prompts, options); });
    EXPECT_EQ(error_of([&] { check_generation(weights.config, prompts, options, setup, names); }), refused);
  }
  EXPECT_NO_THROW(check_generation(weights.config, {{1, 2}}, {}, setup_for(1, 8)));
}

TEST(Generate, MemoryBudgetIsCheckedBeforeAllocating) {
  const ModelConfig config = find_preset("llama-3.2-1b").config;
  const GenerationMemory memory = generation_memory(config, 4, 100, 131072, false);
  EXPECT_DOUBLE_EQ(memory.kv_cache, 16.0 * 4 * 131072 * 2 * 512 * 2);  // 16 GiB: layers x batch x context x K,V x bf16
  // Tied embeddings: the gpu engine's LM head is a matrix of its own (the final norm folded in); the cpu engines' not.
  EXPECT_DOUBLE_EQ(memory.weights, 2.0 * (double(parameter_count(config)) + 128256.0 * 2048));
  EXPECT_DOUBLE_EQ(generation_memory(config, 4, 100, 131072, true).weights, 2.0 * double(parameter_count(config)));
  EXPECT_THAT([&] { check_memory_budget(memory, 8.0 * (1 << 30), 4, 131072); },
              testing::ThrowsMessage<Error>(HasSubstr("the KV cache of batch 4 x max context 131072 needs 16.00 GiB")));
  EXPECT_NO_THROW(check_memory_budget(memory, 80.0 * (1 << 30), 4, 131072));
  EXPECT_EQ(default_max_context(config, 100, 30), 256);
  EXPECT_EQ(prefill_batch_within(config, 4, 100, 131072, false, 80.0 * (1 << 30)), 4);
  EXPECT_EQ(default_max_context(find_preset("tiny").config, 1000, 100), 1024) << "capped at max_position_embeddings";
}

// The settings the messages say to change are named as the caller's interface names them: mk generate's flags by
// default, Python's arguments where it passes them (it was told of --max-context, --batch and --memory-budget, and
// of top-p and top-k: the flags without their dashes), and none it lacks.
TEST(Generate, MessagesNameTheSettingsAsTheCallerNamesThem) {
  using testing_util::error_of;
  const SettingNames python{.max_context = "max_context",
                            .batch = "the number of prompts",
                            .memory_budget = "",
                            .prefill_batch = "",
                            .sampling = {.temperature = "temperature", .top_k = "top_k", .top_p = "top_p"}};
  const ModelConfig tiny = find_preset("tiny").config;
  const std::vector<std::vector<int32_t>> long_prompt = {{1, 2, 3}};
  EXPECT_THAT(error_of([&] { check_generation(tiny, long_prompt, {}, setup_for(1, 2)); }),
              testing::EndsWith("more than the KV cache's 2 positions (--max-context)"));
  EXPECT_THAT(error_of([&] { check_generation(tiny, long_prompt, {}, setup_for(1, 2), python); }),
              testing::EndsWith("more than the KV cache's 2 positions (max_context)"));
  DecodeSetup sampled = setup_for(1, 8);
  sampled.sampling = {.temperature = 1.0f, .top_k = -1, .top_p = 0.5f};
  EXPECT_EQ(error_of([&] { check_decode_setup(tiny, sampled); }), "--top-k must be 0 (no limit) or positive, got -1");
  EXPECT_EQ(error_of([&] { check_generation(tiny, {{1}}, {}, sampled, python); }),
            "top_k must be 0 (no limit) or positive, got -1");
  sampled.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 0.0f};
  EXPECT_EQ(error_of([&] { check_decode_setup(tiny, sampled); }), "--top-p must be in (0, 1], got 0");
  EXPECT_EQ(error_of([&] { check_generation(tiny, {{1}}, {}, sampled, python); }), "top_p must be in (0, 1], got 0");
  const GenerationMemory memory = generation_memory(tiny, 4, 100, 1024, true);
  EXPECT_THAT(
      error_of([&] { check_memory_budget(memory, 1.0, 4, 1024, true); }),
      testing::EndsWith(": lower --max-context or --batch, or raise --memory-budget, or lower --prefill-batch"));
  EXPECT_THAT(error_of([&] { check_memory_budget(memory, 1.0, 4, 1024, true, python); }),
              testing::EndsWith(": lower max_context or the number of prompts"));
  EXPECT_THAT(error_of([&] { prefill_batch_within(tiny, 4, 100, 1024, true, 1.0, 0.0, python); }),
              testing::EndsWith(": lower max_context or the number of prompts"));
}

// Llama-3.1-8B at batch 64 of 896-token prompts: one prefill pass of all 64 needs ~141 GiB of activations (every
// layer keeps its own), more than an H200 has, so the prefill goes in equal parts of as many sequences as fit.
TEST(Generate, PrefillPassesTakeWhatTheMemoryBudgetAllows) {
  const ModelConfig config = find_preset("llama-3.1-8b").config;
  const GenerationMemory one_pass = generation_memory(config, 64, 895, 1024, false);
  const GenerationMemory in_thirds = generation_memory(config, 64, 895, 1024, false, 22);
  EXPECT_DOUBLE_EQ(in_thirds.kv_cache, one_pass.kv_cache);
  EXPECT_DOUBLE_EQ(generation_memory(config, 64, 895, 1024, false, 64).total(), one_pass.total());
  EXPECT_LT(in_thirds.activations, one_pass.activations / 2);
  // A part's own cache (22 sequences x 895 rows) is counted: more than a third of one pass's activations.
  EXPECT_GT(in_thirds.activations - generation_memory(config, 64, 0, 1024, false).activations,
            (one_pass.activations - generation_memory(config, 64, 0, 1024, false).activations) * 22 / 64);
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, one_pass.total()), 64);
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, in_thirds.total()), 22);
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, in_thirds.total() - 1), 16);
  EXPECT_EQ(prefill_batch_within(config, 64, 0, 1024, false, 24.0 * (1 << 30)), 64) << "no prefill";
  // A headroom: the parts fit the budget less it; one a pass fits the budget even where it misses the headroom.
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, in_thirds.total() + 1.0e9, 1.0e9), 22);
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, one_pass.total(), 1.0), 32);
  const double one_a_pass = generation_memory(config, 64, 895, 1024, false, 1).total();
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, one_a_pass), 1);
  EXPECT_EQ(prefill_batch_within(config, 64, 895, 1024, false, one_a_pass, 1.0e9), 1);
  EXPECT_THAT([&] { prefill_batch_within(config, 64, 895, 1024, false, one_a_pass - 1); },
              testing::ThrowsMessage<Error>(HasSubstr("the KV cache of batch 64 x max context 1024 needs 8.00 GiB")));
}

}  // namespace
}  // namespace mk
