// Tests of `mk generate` through the binary: the streamed ids and text, the report, the sequences, its errors.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mk/bf16.h"
#include "mk/generate.h"
#include "mk/model_config.h"
#include "mk/safetensors.h"
#include "mk/tokenizer.h"
#include "mk/weights.h"
#include "mk_process.h"
#include "test_util.h"

namespace {

using mk::testing_util::quoted;
using mk::testing_util::run_mk;
using mk::testing_util::TempDir;
using Result = mk::testing_util::MkResult;

using ::testing::HasSubstr;
using ::testing::Not;

// The ids of the last line starting with `prefix`.
std::vector<int32_t> ids_after(const std::string& output, const std::string& prefix) {
  const size_t at = output.rfind("\n" + prefix);
  if (at == std::string::npos) return {};
  std::istringstream line(output.substr(at + 1 + prefix.size(), output.find('\n', at + 1) - at - 1 - prefix.size()));
  std::vector<int32_t> ids;
  for (int32_t id; line >> id;) ids.push_back(id);
  return ids;
}

TEST(CliGenerate, StreamsTheTokensThenReportsAndEndsWithTheSequences) {
  const Result result = run_mk("generate --preset tiny --prompt-ids 1,2,3 --max-new-tokens 4");
  ASSERT_EQ(result.status, 0) << result.output;
  const std::vector<int32_t> tokens = ids_after(result.output, "tokens: ");
  ASSERT_EQ(tokens.size(), 7u) << result.output;
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3), (std::vector<int32_t>{1, 2, 3}));
  // The streamed line: the new ids, as they were made.
  EXPECT_THAT(result.output, HasSubstr(fmt::format("\n{} {} {} {}\n", tokens[3], tokens[4], tokens[5], tokens[6])));
  for (const char* expected : {"decode step of", "verified once", "stopped: sequence 0 at max new tokens (4 new)",
                               "prefill: ", "per-token latency p50", "tokens/s", "% of the floor"})
    EXPECT_THAT(result.output, HasSubstr(expected));
  EXPECT_EQ(result.output.substr(result.output.rfind("\ntokens: ") + 1).find('\n') + 1,
            result.output.size() - result.output.rfind("\ntokens: ") - 1)
      << "the tokens line comes last";
}

TEST(CliGenerate, ReferenceAndCpuVmMakeTheSameTokensForARaggedBatch) {
  const std::string args = "generate --preset tiny --prompt-ids '5,6;7,8,9,10;11' --max-new-tokens 3 --temperature 0.9 "
                           "--top-k 40 --top-p 0.95 --seed 4 --engine ";
  const Result vm = run_mk(args + "cpu-vm");
  const Result reference = run_mk(args + "reference");
  ASSERT_EQ(vm.status, 0) << vm.output;
  ASSERT_EQ(reference.status, 0) << reference.output;
  EXPECT_THAT(vm.output, HasSubstr("step 2: "));
  EXPECT_EQ(vm.output.substr(vm.output.find("tokens: ")), reference.output.substr(reference.output.find("tokens: ")));
}

// A memory budget that holds the generation only with the prefill in parts: the parts are as large as fit, and the
// tokens are those of one pass (given by --prefill-batch, or with room for it).
TEST(CliGenerate, PrefillsInPartsWhereTheMemoryBudgetAsksIt) {
  const mk::ModelConfig config = mk::find_preset("tiny").config;
  const double gib = double(int64_t(1) << 30);
  // 4 prompts, the longest 6 tokens (5 prefill rows), cache 128: room for 2 sequences a pass, not 3 or 4.
  const double budget = (mk::generation_memory(config, 4, 5, 128, true, 2).total() +
                         mk::generation_memory(config, 4, 5, 128, true, 3).total()) / 2;
  const std::string args = "generate --preset tiny --engine cpu-vm --prompt-ids '1,2,3,4,5,6;7,8;9,10,11;12' "
                           "--max-new-tokens 3 --max-context 128";
  const Result one_pass = run_mk(args);
  const Result parts = run_mk(args + fmt::format(" --memory-budget {:.12f}", budget / gib));
  const Result ones = run_mk(args + " --prefill-batch 1");
  for (const Result* result : {&one_pass, &parts, &ones}) ASSERT_EQ(result->status, 0) << result->output;
  EXPECT_THAT(one_pass.output, Not(HasSubstr(" passes of up to")));
  EXPECT_THAT(parts.output, HasSubstr(" in 2 passes of up to 2 sequences (--prefill-batch)"));
  EXPECT_THAT(ones.output, HasSubstr(" in 4 passes of up to 1 sequence (--prefill-batch)"));
  const std::string tokens = one_pass.output.substr(one_pass.output.find("\ntokens: "));
  EXPECT_EQ(parts.output.substr(parts.output.find("\ntokens: ")), tokens);
  EXPECT_EQ(ones.output.substr(ones.output.find("\ntokens: ")), tokens);
  const Result too_small = run_mk(args + fmt::format(" --memory-budget {:.12f} --prefill-batch 3", budget / gib));
  EXPECT_NE(too_small.status, 0);
  EXPECT_THAT(too_small.output, HasSubstr("more than the memory budget"));
  EXPECT_THAT(too_small.output, HasSubstr("or raise --memory-budget, or lower --prefill-batch"));
}

TEST(CliGenerate, StopsAtTheEosOfGenerationConfigAndWritesTheSequences) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  ASSERT_EQ(run_mk("export --preset tiny --out " + quoted(model)).status, 0);
  const Result free_run = run_mk("generate --model " + quoted(model) + " --prompt-ids 1,2,3 --max-new-tokens 6");
  ASSERT_EQ(free_run.status, 0) << free_run.output;
  const std::vector<int32_t> tokens = ids_after(free_run.output, "tokens: ");
  ASSERT_EQ(tokens.size(), 9u);
  {
    std::ofstream config(model / "generation_config.json");
    config << fmt::format(R"({{"eos_token_id": [100000, {}]}})", tokens[4]);
  }
  const std::filesystem::path output = dir.path() / "out.safetensors";
  const Result eos_run =
      run_mk("generate --model " + quoted(model) + " --prompt-ids 1,2,3 --max-new-tokens 6 --output " + quoted(output));
  ASSERT_EQ(eos_run.status, 0) << eos_run.output;
  const size_t stop = size_t(std::find(tokens.begin() + 3, tokens.end(), tokens[4]) - tokens.begin());
  EXPECT_EQ(ids_after(eos_run.output, "tokens: "),
            std::vector<int32_t>(tokens.begin(), tokens.begin() + int64_t(stop) + 1));
  EXPECT_THAT(eos_run.output, HasSubstr("sequence 0 at EOS"));
  mk::SafetensorsFile file(output);
  ASSERT_NE(file.find("lengths"), nullptr);
  int32_t length = 0, prompt_length = 0;
  std::memcpy(&length, file.bytes(*file.find("lengths")).data(), 4);
  std::memcpy(&prompt_length, file.bytes(*file.find("prompt_lengths")).data(), 4);
  EXPECT_EQ(length, int32_t(stop) + 1);
  EXPECT_EQ(prompt_length, 3);
}

TEST(CliGenerate, ReadsRaggedPromptsFromATokensFile) {
  TempDir dir;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 0, 0};
  const std::vector<int32_t> lengths = {4, 2};
  const std::filesystem::path input = dir.path() / "prompts.safetensors";
  mk::write_safetensors(input, {{"tokens", mk::DType::kI32, {2, 4}, mk::testing_util::as_bytes(tokens)},
                                {"lengths", mk::DType::kI32, {2}, mk::testing_util::as_bytes(lengths)}});
  const Result result = run_mk("generate --preset tiny --tokens " + quoted(input) + " --max-new-tokens 2");
  ASSERT_EQ(result.status, 0) << result.output;
  const Result ids = run_mk("generate --preset tiny --prompt-ids '1,2,3,4;5,6' --max-new-tokens 2");
  EXPECT_EQ(result.output.substr(result.output.find("tokens: ")), ids.output.substr(ids.output.find("tokens: ")));
}

TEST(CliGenerate, TokenizesATextPromptWithTheModelsTokenizer) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  mk::ModelConfig config = mk::find_preset("tiny").config;
  config.vocab_size = 2560;  // holds the llama3 fixture's ids
  mk::save_hf_model(model, mk::random_weights(config, 2));
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(std::filesystem::path(MK_TOKENIZER_FIXTURES) / "llama3" / file, model / file);
  const Result tokenized = run_mk("tokenize --tokenizer " + quoted(model) + " --text 'Hello world'");
  ASSERT_EQ(tokenized.status, 0) << tokenized.output;
  const Result result = run_mk("generate --model " + quoted(model) + " --prompt 'Hello world' --max-new-tokens 3");
  ASSERT_EQ(result.status, 0) << result.output;
  std::istringstream words(tokenized.output);
  std::vector<int32_t> prompt;
  for (int32_t id; words >> id;) prompt.push_back(id);
  const std::vector<int32_t> tokens = ids_after(result.output, "tokens: ");
  ASSERT_GE(tokens.size(), prompt.size());
  EXPECT_EQ(std::vector<int32_t>(tokens.begin(), tokens.begin() + int64_t(prompt.size())), prompt);
  EXPECT_THAT(result.output, HasSubstr("EOS 2501 2504"));
  EXPECT_THAT(result.output, HasSubstr("text: <|begin_of_text|>Hello world"));
}

TEST(CliGenerate, ErrorsAreClearAndNeverCrashes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompt-ids 1,2 --engine cpu-vm --trace t.json", "--trace applies to --engine gpu"},
      {"--prompt-ids 1,2,3 --max-context 2", "more than the KV cache's 2 positions (--max-context)"},
      {"--prompt-ids 1,2,3 --max-context 100000", "exceeds the model's max_position_embeddings 1024"},
      {"--prompt-ids 1,2 --memory-budget 0.0001", ": lower --max-context or --batch, or raise --memory-budget\n"},
      {"--prompt hello", "--prompt needs --model DIR with a tokenizer.json"},
      {"--prompt-ids 1,x", "--prompt-ids: \"x\" is not a token id"},
      // The sampling's checks named the flags without their dashes, and Python's arguments as these flags.
      {"--prompt-ids 1,2 --temperature -1", "error: --temperature must be 0 (greedy) or positive, got -1\n"},
      {"--prompt-ids 1,2 --temperature 1 --top-k -1", "error: --top-k must be 0 (no limit) or positive, got -1\n"},
      {"--prompt-ids 1,2 --temperature 1 --top-p 1.5", "error: --top-p must be in (0, 1], got 1.5\n"},
      {"--prompt-ids 1,999", "outside the vocabulary"},
      {"--prompt-ids '1;2' --batch 3", "--batch 3 but 2 prompts"},
      {"--prompt-ids 1,2 --stream text", "--stream text needs --model DIR with a tokenizer.json"},
  };
  for (const auto& [args, message] : cases) {
    const Result result = run_mk("generate --preset tiny " + args);
    EXPECT_TRUE(result.exited) << args;
    EXPECT_EQ(result.status, 1) << args << "\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr(message)) << args;
  }
  EXPECT_EQ(run_mk("generate --preset tiny").status, 2) << "no prompt: a usage error";
  std::string past_positions = "1";  // tiny's max_position_embeddings is 1024
  for (int i = 1; i < 1025; ++i) past_positions += ",1";
  for (const std::string context : {"", " --max-context 1024"}) {
    const Result too_long = run_mk("generate --preset tiny --prompt-ids " + past_positions + context);
    EXPECT_EQ(too_long.status, 1) << too_long.output;
    EXPECT_THAT(too_long.output, HasSubstr("prompt 0 has 1025 tokens, more than the model's max_position_embeddings"))
        << context;
    EXPECT_THAT(too_long.output, testing::Not(HasSubstr("longest prompt"))) << "refused before the header";
  }
  // A cache past the model's positions is named as such, not as more memory than the budget.
  const Result past_cache = run_mk("generate --preset tiny --prompt-ids 1,2 --max-context 1000000000 --engine cpu-vm");
  EXPECT_EQ(past_cache.status, 1) << past_cache.output;
  EXPECT_THAT(past_cache.output, HasSubstr("max context 1000000000 exceeds the model's max_position_embeddings 1024"));
  const Result full = run_mk("generate --preset tiny --prompt-ids 1,2,3 --max-context 8 --max-new-tokens 100");
  EXPECT_EQ(full.status, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("sequence 0 at the KV cache's end (6 new)"));
}

// ---- streamed text ----

// The line just before the report: a single sequence's stream (or, with nothing streamed, the header's last line).
std::string line_before_report(const std::string& output) {
  const size_t at = output.find("\nstopped: ");
  if (at == std::string::npos) return "<no report>";
  const size_t begin = output.rfind('\n', at - 1) + 1;
  return output.substr(begin, at - begin);
}

// The pieces of a batch's text line, `step N: "a" "" -`: its JSON strings in order (a stopped sequence's - skipped).
std::vector<std::string> json_pieces(const std::string& line) {
  std::vector<std::string> pieces;
  for (size_t at = line.find('"'); at != std::string::npos; ) {
    size_t end = at + 1;
    while (end < line.size() && line[end] != '"') end += line[end] == '\\' ? 2 : 1;
    pieces.push_back(nlohmann::json::parse(line.substr(at, end + 1 - at)).get<std::string>());
    at = line.find('"', end + 1);
  }
  return pieces;
}

std::string joined(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += fmt::format("{}{}", text.empty() ? "" : " ", id);
  return text;
}

// A model whose greedy successor of token chain[k] is chain[k + 1]: its layers add nothing to the residual stream
// (o_proj and down are zero), so the last hidden state is the current token's embedding, and the LM head row of
// chain[k + 1] is chain[k]'s embedding, which wins the dot product by far (|e|^2 against products of random rows).
void save_successor_model(const std::filesystem::path& dir, const std::vector<int32_t>& chain) {
  mk::ModelConfig config = mk::find_preset("tiny").config;
  config.vocab_size = 2560;  // holds the llama3 fixture's ids
  mk::ModelWeights weights = mk::random_weights(config, 3);
  for (mk::LayerWeights& layer : weights.layers) {
    std::fill(layer.wo.begin(), layer.wo.end(), mk::to_bf16(0.0f));
    std::fill(layer.w_down.begin(), layer.w_down.end(), mk::to_bf16(0.0f));
  }
  std::fill(weights.final_norm.begin(), weights.final_norm.end(), mk::to_bf16(1.0f));
  std::fill(weights.lm_head.begin(), weights.lm_head.end(), mk::to_bf16(0.0f));
  const int64_t d = config.d_model;
  for (size_t k = 0; k + 1 < chain.size(); ++k)
    std::copy_n(weights.embedding.begin() + chain[k] * d, d, weights.lm_head.begin() + chain[k + 1] * d);
  mk::save_hf_model(dir, weights);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(std::filesystem::path(MK_TOKENIZER_FIXTURES) / "llama3" / file, dir / file);
}

// `mk generate --prompt Hi` on a successor model that continues with kText: accents, a dash, CJK and an emoji, whose
// ids in the fixture's small byte-level vocabulary cut 日本 into tokens that end inside a character.
class CliGenerateText : public ::testing::Test {
 protected:
  static constexpr const char* kPrompt = "Hi";
  static constexpr const char* kText = " café — 日本 😀!";

  void SetUp() override {
    tokenizer_.emplace(mk::Tokenizer::load(std::filesystem::path(MK_TOKENIZER_FIXTURES) / "llama3"));
    prompt_ = tokenizer_->encode(kPrompt);
    made_ = tokenizer_->encode(kText, {.add_special_tokens = false});
    ASSERT_EQ(tokenizer_->decode(made_), kText);
    std::vector<int32_t> chain = {prompt_.back()};
    chain.insert(chain.end(), made_.begin(), made_.end());
    ASSERT_EQ(std::set<int32_t>(chain.begin(), chain.end()).size(), chain.size()) << "one successor per token";
    for (int32_t eos : tokenizer_->eos_ids()) ASSERT_EQ(std::count(chain.begin(), chain.end(), eos), 0);
    ASSERT_TRUE(std::any_of(made_.begin(), made_.end(), [&](int32_t id) {
      return tokenizer_->decode(std::vector<int32_t>{id}).find("\xEF\xBF\xBD") != std::string::npos;
    })) << "no token ends inside a character: the test would not test that";
    save_successor_model(model_, chain);
  }

  Result generate(const std::string& args) const {
    return run_mk(fmt::format("generate --model {} --max-new-tokens {} {}", quoted(model_), made_.size(), args));
  }

  TempDir dir_;
  std::filesystem::path model_ = dir_.path() / "model";
  std::optional<mk::Tokenizer> tokenizer_;
  std::vector<int32_t> prompt_, made_;
};

TEST_F(CliGenerateText, ATextPromptStreamsTheNewTextAsTheTokenizerDecodesIt) {
  const Result result = generate(fmt::format("--prompt '{}'", kPrompt));
  ASSERT_EQ(result.status, 0) << result.output;
  const std::vector<int32_t> tokens = ids_after(result.output, "tokens: ");
  ASSERT_EQ(tokens.size(), prompt_.size() + made_.size()) << result.output;
  const std::vector<int32_t> made(tokens.begin() + int64_t(prompt_.size()), tokens.end());
  EXPECT_EQ(made, made_) << "the model makes the text's ids";
  EXPECT_EQ(line_before_report(result.output), tokenizer_->decode(made)) << result.output;
  EXPECT_THAT(result.output, HasSubstr(fmt::format("\ntext: <|begin_of_text|>{}{}\n", kPrompt, kText)));
  EXPECT_THAT(result.output, Not(HasSubstr("\xEF\xBF\xBD")));
}

TEST_F(CliGenerateText, ABatchStreamsEachSequencesPiecesAndNoPieceSplitsACharacter) {
  const Result result = generate(fmt::format("--prompt '{}' --batch 2", kPrompt));
  ASSERT_EQ(result.status, 0) << result.output;
  std::vector<std::string> texts(2);
  int64_t steps = 0, held_back = 0;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("step ")) continue;
    const std::vector<std::string> pieces = json_pieces(line);
    ASSERT_EQ(pieces.size(), 2u) << line;
    for (size_t b = 0; b < 2; ++b) {
      EXPECT_EQ(mk::replace_invalid_utf8(pieces[b]), pieces[b]) << "not whole UTF-8 characters: " << line;
      EXPECT_EQ(pieces[b].find("\xEF\xBF\xBD"), std::string::npos) << line;
      held_back += pieces[b].empty();
      texts[b] += pieces[b];
    }
    ++steps;
  }
  EXPECT_EQ(steps, int64_t(made_.size())) << result.output;
  EXPECT_GT(held_back, 0) << "a token that ends inside a character prints nothing";
  for (const std::string& text : texts) EXPECT_EQ(text, tokenizer_->decode(made_));
  EXPECT_THAT(result.output, Not(HasSubstr("\nrest:"))) << "nothing was left held back";
}

TEST_F(CliGenerateText, StreamPicksIdsTextOrNothing) {
  const std::string prompt_ids = fmt::format("--prompt-ids {}", fmt::join(prompt_, ","));
  const std::string by_text = fmt::format("--prompt '{}'", kPrompt);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {prompt_ids, joined(made_)},                                  // auto: ids for ids
      {prompt_ids + " --stream text", kText},                       // the model directory's tokenizer
      {by_text + " --stream ids", joined(made_)},
      {by_text + " --stream auto", kText},
  };
  for (const auto& [args, stream] : cases) {
    const Result result = generate(args);
    ASSERT_EQ(result.status, 0) << args << "\n" << result.output;
    EXPECT_EQ(line_before_report(result.output), stream) << args;
    EXPECT_EQ(ids_after(result.output, "tokens: ").size(), prompt_.size() + made_.size()) << args;
  }
  const Result quiet = generate(by_text + " --stream none");
  ASSERT_EQ(quiet.status, 0) << quiet.output;
  EXPECT_THAT(line_before_report(quiet.output), ::testing::StartsWith("batch 1, ")) << "nothing streamed";
  EXPECT_THAT(quiet.output, HasSubstr(fmt::format("\ntext: <|begin_of_text|>{}{}\n", kPrompt, kText)));
}

}  // namespace
