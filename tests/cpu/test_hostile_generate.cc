// Hostile input to `mk generate` through the binary: the model directory's generation_config.json and tokenizer EOS,
// token ids outside the vocabulary, flags the run would ignore, and outputs onto the files generation reads.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "hostile_fixture.h"
#include "mk/generate.h"
#include "mk/program.h"
#include "mk/reference.h"
#include "mk/tokenizer.h"

namespace {

namespace fs = std::filesystem;
// The fixture and its helpers are this file's vocabulary.
using namespace mk::testing_util;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;
using ::testing::Not;

class HostileGenerate : public Hostile {
 protected:
  std::string generate(const std::string& args) const {
    return fmt::format("generate --model {} --engine reference --max-new-tokens 1 {}", quoted(model()), args);
  }
  void write_generation_config(const std::string& text) const {
    write_bytes(model() / "generation_config.json", text);
  }
  // A fixture's tokenizer.json and tokenizer_config.json (tests/data/tokenizers) into the model; returns its EOS ids.
  std::vector<int32_t> copy_tokenizer(const char* fixture) const {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(MK_TOKENIZER_FIXTURES) / fixture / name, model() / name,
                    fs::copy_options::overwrite_existing);
    }
    return mk::Tokenizer::load(model()).eos_ids();
  }
};

TEST_F(HostileGenerate, GenerationConfigIsReadAsStrictlyAsConfigJson) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // 2^32 was taken as EOS id 0 by a cast to int32.
      {R"({"eos_token_id": 4294967296})", "eos_token_id must be a token id (a whole number in [0, 2^31))"},
      {R"({"eos_token_id": [2, -3]})", "eos_token_id must be a token id"},
      {R"({"eos_token_id": 1, "eos_token_id": 2})", "key 'eos_token_id' appears twice in one object"},
      {R"([{"eos_token_id": 2}])", "generation_config.json: expected a JSON object"},  // was read as "no EOS"
  };
  for (const auto& [text, message] : cases) {
    write_generation_config(text);
    expect_failure(run_mk(generate("--prompt-ids 1")), 1, message);
  }
}

TEST_F(HostileGenerate, GenerationConfigThatIsNotARegularFileIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo((model() / "generation_config.json").c_str(), 0600), 0);
  expect_failure(run_mk(generate("--prompt-ids 1"), "", 5), 1, "generation_config.json: is a FIFO");  // it hung
  fs::remove(model() / "generation_config.json");
  fs::create_directory(model() / "generation_config.json");
  // It ended in "unexpected error: basic_filebuf::underflow error reading the file".
  expect_failure(run_mk(generate("--prompt-ids 1")), 1, "generation_config.json: is a directory");
}

TEST_F(HostileGenerate, OutputOntoTheFilesGenerationReadsIsRefused) {
  write_generation_config(R"({"eos_token_id": 2})");
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    const fs::path target = model() / name;
    if (!fs::exists(target)) write_bytes(target, "{}");
    const std::string before = read_bytes(target);
    expect_failure(run_mk(generate("--prompt-ids 1 --output " + quoted(target))), 1, "refusing to overwrite an input");
    EXPECT_EQ(read_bytes(target), before) << name;
  }
}

TEST_F(HostileGenerate, EosIdsGivenOutsideTheVocabularyAreRefused) {
  // Each was accepted, and generation ran on as if there were no EOS.
  expect_failure(run_mk(generate("--prompt-ids 1 --eos 1,500")), 1,
                 "EOS id 500 (from --eos) is outside the vocabulary [0, 384)");
  expect_failure(run_mk(generate("--prompt-ids 1 --eos -5")), 1, "EOS id -5 (from --eos) is outside the vocabulary");
}

TEST_F(HostileGenerate, ModelEosIdsNoneOfWhichIsInTheVocabularyAreRefused) {
  // As --eos's were: generation ran on to the budget as if the model had no EOS.
  // (One the model lacks beside one it has never matches, and is allowed.)
  write_generation_config(R"({"eos_token_id": [500, 384]})");
  expect_failure(run_mk(generate("--prompt-ids 1")), 1,
                 "generation_config.json: eos_token_id names no id in the model's vocabulary [0, 384), got 500, 384");
  fs::remove(model() / "generation_config.json");
  nlohmann::json config = nlohmann::json::parse(read_bytes(model() / "config.json"));
  config["eos_token_id"] = 384;
  write_bytes(model() / "config.json", config.dump());
  expect_failure(run_mk(generate("--prompt-ids 1")), 1,
                 "config.json: eos_token_id names no id in the model's vocabulary");
}

TEST_F(HostileGenerate, TokenizerEosIdsNoneOfWhichIsInTheVocabularyAreRefused) {
  // The exported config.json names no EOS, so the tokenizer's (tokenizer_config.json's eos_token) is the default.
  // llama2's </s> lies in the tiny model's vocabulary: the control.
  const std::vector<int32_t> valid = copy_tokenizer("llama2");
  ASSERT_EQ(valid.size(), 1U);
  const MkResult control = run_mk(generate("--prompt-ids 1 --stream text"));
  ASSERT_EQ(control.status, 0) << control.output;
  EXPECT_THAT(control.output, HasSubstr(fmt::format("EOS {}\n", valid[0])));
  // llama3's <|eot_id|> does not: it was accepted, and generation ran on to the budget as if there were no EOS.
  const std::vector<int32_t> outside = copy_tokenizer("llama3");
  ASSERT_EQ(outside.size(), 1U);
  ASSERT_GE(outside[0], 384);
  expect_failure(run_mk(generate("--prompt-ids 1 --stream text")), 1,
                 fmt::format("{}: eos_token \"<|eot_id|>\" names no id in the model's vocabulary [0, 384), got {}",
                             (model() / "tokenizer_config.json").string(), outside[0]));
  // --eos replaces the tokenizer's, as it does the model's.
  EXPECT_EQ(run_mk(generate("--prompt-ids 1 --stream text --eos 3")).status, 0);
}

TEST_F(HostileGenerate, IdsPromptsEndAtTheTokenizersEosAsThePythonModelDoes) {
  // mk generate read the tokenizer only for text (--prompt, --stream text): a run of ids had no EOS, where the Python
  // Model of the same directory stopped at tokenizer_config.json's eos_token.
  const std::vector<int32_t> eos = copy_tokenizer("llama2");
  ASSERT_EQ(eos.size(), 1U);
  for (const char* args : {"--prompt-ids 1", "--prompt-ids 1 --stream none"}) {
    const MkResult result = run_mk(generate(args));
    ASSERT_EQ(result.status, 0) << result.output;
    EXPECT_THAT(result.output, HasSubstr(fmt::format("; EOS {}\n", eos[0]))) << args;
  }
  // A tokenizer.json that does not load is named, with why a run of ids read it.
  write_bytes(model() / "tokenizer.json", "{not json");
  const MkResult broken = run_mk(generate("--prompt-ids 1"));
  expect_failure(broken, 1, "tokenizer.json is not valid JSON: ");
  EXPECT_THAT(broken.output, HasSubstr("(read for the default EOS ids: neither generation_config.json nor config.json "
                                       "names an eos_token_id)"));
  // The configs' EOS comes first, and the tokenizer is not read.
  write_generation_config(R"({"eos_token_id": 3})");
  const MkResult configured = run_mk(generate("--prompt-ids 1"));
  ASSERT_EQ(configured.status, 0) << configured.output;
  EXPECT_THAT(configured.output, HasSubstr("; EOS 3\n"));
}

TEST_F(HostileGenerate, PromptIdsOutsideTheVocabularyAreNamedByPromptAndPosition) {
  // The engine named the padded prefill's flat index ("at position 3") after the weights were loaded.
  const MkResult result = run_mk(generate("--prompt-ids '1,2;5,999,3'"));
  expect_failure(result, 1, "prompt 1: token id 999 at position 1 is outside the vocabulary [0, 384)");
  EXPECT_THAT(result.output, Not(HasSubstr("longest prompt")));  // refused before the engine was built
}

TEST_F(HostileGenerate, AnEmptyPromptIsRefusedBeforeTheEngineIsBuilt) {
  // The generation loop refused it, after the weights were made and the engine built.
  const MkResult result = run_mk(generate("--prompt-ids '1;;2'"));
  expect_failure(result, 1, "prompt 1 is empty: generation starts from at least one token");
  EXPECT_THAT(result.output, Not(HasSubstr("longest prompt")));
}

TEST_F(HostileGenerate, FlagsTheRunWouldIgnoreAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompt-ids ''", "--prompt-ids: must not be empty"},  // was "--prompt needs --model DIR"
      {"--prompt-ids 1 --sms 4", "--sms applies to --engine cpu-vm only, and the engine is reference"},
      {"--prompt-ids 1 --policy round-robin", "--policy applies to --engine cpu-vm only"},
      {"--prompt-ids 1 --stall-timeout 60",
       "--stall-timeout applies to --engine gpu only, and the engine is reference"},
      {"--prompt-ids 1 --skip-dependency-waits",
       "--skip-dependency-waits applies to --engine gpu only, and the engine is reference"},
      {"--prompt-ids 1 --weights-seed 3", "--weights-seed has nothing to seed: --model gives the weights"},
      {"--prompt-ids 1 --top-k 40", "--top-k applies to sampling, and --temperature 0 is greedy"},
      {"--prompt-ids 1 --top-p 0.9", "--top-p applies to sampling"},
      {"--prompt-ids 1 --seed 3", "--seed applies to sampling"},
  };
  for (const auto& [args, message] : cases) expect_failure(run_mk(generate(args)), 2, message);
}

TEST_F(HostileGenerate, RealFlagsMustBePositiveAndFinite) {
  // nan passed CLI::PositiveNumber (a budget of nan meant the default; a floor of nan was printed), and its range
  // was printed as 0.000000 to DBL_MAX in 309 digits.
  for (const char* args : {"--bandwidth nan", "--bandwidth inf", "--bandwidth -5", "--memory-budget nan",
                          "--memory-budget 0"}) {
    const MkResult result = run_mk(generate(std::string("--prompt-ids 1 ") + args));
    expect_failure(result, 2, "must be a positive finite number, got");
    EXPECT_THAT(result.output, Not(HasSubstr("1797693134862315")));
  }
}

TEST_F(HostileGenerate, RealFlagsBeyondADoubleAreOutOfRangeNotNaN) {
  // from_chars' out-of-range error read as "not a number: 1e999".
  for (const char* args : {"--memory-budget 1e999", "--bandwidth 1e999", "--memory-budget 1e-999"}) {
    const MkResult result = run_mk(generate(fmt::format("--prompt-ids 1 {}", args)));
    expect_failure(result, 2, "out of range (a double holds about 1e-308 to 1e308), got 1e");
    EXPECT_THAT(result.output, Not(HasSubstr("not a number")));
  }
}

TEST_F(HostileGenerate, ARepeatedPromptIsCheckedAgainstTheBudgetBeforeItIsCopied) {
  // One prompt was copied --batch times before the budget was checked: 5 GB and 5 s at 10^8, std::bad_alloc at 2^30.
  // (Batches whose cache rows a schedule cannot address are refused before the budget, and before the copy too.)
  expect_failure(run_mk(generate("--prompt-ids 1 --batch 4000000"), "ulimit -v 2000000;", 10), 1,
                 "the KV cache of batch 4000000 x max context 128 needs");
  expect_failure(run_mk(generate("--prompt-ids 1 --batch 1073741824"), "ulimit -v 2000000;", 10), 1,
                 "a KV cache of batch 1073741824 x max context 128 has more than the 2^30 rows one schedule addresses");
}

TEST_F(HostileGenerate, SamplingFlagsAreNotRoundedToADefault) {
  // "" and 1e-320 were read as temperature 0 (greedy, the sampling flags given then blamed on it), --top-k "" as
  // 0 (all), and 1e39 reported as inf.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--temperature ''", "--temperature: not a number: "},
      {"--temperature 1e-320", "--temperature: out of range (a float holds about 1e-45 to 3e38), got 1e-320"},
      {"--temperature 1e-320 --seed 3", "--temperature: out of range"},
      {"--temperature 1e39", "--temperature: out of range (a float holds about 1e-45 to 3e38), got 1e39"},
      {"--temperature 1 --top-p ''", "--top-p: not a number: "},
      {"--temperature 1 --top-p 1e-320", "--top-p: out of range"},
      {"--temperature 1 --top-k ''", "--top-k: must not be empty"},
  };
  for (const auto& [args, message] : cases) expect_failure(run_mk(generate("--prompt-ids 1 " + args)), 2, message);
}

TEST_F(HostileGenerate, ATinyTemperatureSamplesAsGreedyNotGarbage) {
  // logit / 1e-40 overflowed to inf and inf - inf to NaN: each draw was the least likely token, or with a top-p an
  // index before the candidates (undefined behaviour; it printed token 0).
  const MkResult greedy = run_mk(generate("--prompt-ids 1,2 --stream none"));
  ASSERT_EQ(greedy.status, 0) << greedy.output;
  const std::string tokens = greedy.output.substr(greedy.output.rfind("tokens: "));
  for (const char* args : {"--temperature 1e-40", "--temperature 1e-40 --top-p 0.9", "--temperature 1e-40 --top-k 5"}) {
    const MkResult result = run_mk(generate(fmt::format("--prompt-ids 1,2 --stream none {}", args)));
    ASSERT_EQ(result.status, 0) << result.output;
    EXPECT_THAT(result.output, HasSubstr(tokens)) << args;
  }
}

TEST(HostileGenerateApi, SamplingAtATinyTemperatureDrawsTheLargest) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 3.0f, 2.0f};
  for (const float uniform : {0.0f, 0.5f, 0.999f}) {
    for (const float top_p : {1.0f, 0.5f}) {
      const int32_t token = mk::ref::sample_token(logits.data(), 5, {1e-40f, 0, top_p, 0}, uniform);
      EXPECT_TRUE(token == 1 || token == 3) << "u " << uniform << ", top-p " << top_p << ": " << token;
    }
  }
}

TEST(HostileGenerateApi, APromptPastTheModelsPositionsIsNamedNotBlamedOnTheCache) {
  // The cache cannot grow past max_position_embeddings (1024 in tiny): a longer prompt was told to raise it.
  const mk::ModelConfig config = mk::find_preset("tiny").config;
  EXPECT_THAT(error_of([&] { mk::check_prompt_ids(config, {{1, 2}, std::vector<int32_t>(1025, 1)}); }),
              HasSubstr("prompt 1 has 1025 tokens, more than the model's max_position_embeddings 1024"));
  EXPECT_NO_THROW(mk::check_prompt_ids(config, {std::vector<int32_t>(1024, 1)}));
  EXPECT_EQ(mk::default_max_context(config, 1024, 1), 1024);
}

TEST(HostileGenerateApi, NegativeNewTokensAreNamedNotBlamedOnTheCache) {
  // A cache of (2 - 3) positions rounded up was 1, and generate() then blamed the prompt for not fitting it.
  EXPECT_THAT(error_of([] { mk::default_max_context(mk::find_preset("tiny").config, 2, -3); }),
              HasSubstr("max new tokens must not be negative, got -3"));
}

}  // namespace
