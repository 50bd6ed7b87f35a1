// Tests of the `mk` command-line tool, run as a child process: exit codes, messages, and its files.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mk/model_config.h"
#include "mk/model_io.h"
#include "mk/program.h"
#include "mk/reference.h"
#include "mk/safetensors.h"
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

// The line of `mk run` output that holds the checksum.
std::string checksum_line(const std::string& output) {
  const size_t at = output.find("checksum");
  if (at == std::string::npos) return "";
  const size_t begin = output.rfind('\n', at) + 1;  // npos + 1 == 0 on the first line
  return output.substr(begin, output.find('\n', at) - begin);
}

}  // namespace

TEST(Cli, InfoPrintsFlops) {
  const Result result = run_mk("info --preset seed");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 0) << result.output;
  const mk::Preset& seed = mk::find_preset("seed");
  const double gflops = mk::forward_cost(seed.config, seed.shape).flops / 1e9;
  EXPECT_THAT(result.output, HasSubstr(fmt::format("FLOPs:              {:.3f} GFLOP", gflops)));
  EXPECT_THAT(result.output, HasSubstr("model seed: d_model 1024"));
  EXPECT_THAT(result.output, HasSubstr("batch 8 x seq 256"));
}

TEST(Cli, InfoJsonHoldsTheConfigAndTheGraphsCounts) {
  const Result result = run_mk("info --preset tiny --layers 3 --seq 64 --json");
  ASSERT_TRUE(result.exited);
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json info = nlohmann::json::parse(result.output);
  mk::ModelConfig expected = mk::find_preset("tiny").config;
  expected.n_layers = 3;
  const mk::ModelConfig config = mk::model_config_from_json(info.at("config"), "mk info");
  EXPECT_EQ(mk::first_difference(config, expected), "");
  EXPECT_EQ(config.name, "tiny");
  EXPECT_EQ(info.at("batch"), 2);
  EXPECT_EQ(info.at("seq_len"), 64);
  const mk::ForwardCost cost = mk::forward_cost(expected, {2, 64});
  EXPECT_EQ(info.at("flops").get<double>(), cost.flops);
  EXPECT_EQ(info.at("parameters").get<int64_t>(), cost.parameters);
  EXPECT_EQ(info.at("min_bytes").get<double>(), cost.min_bytes);
  EXPECT_EQ(info.at("weight_bytes").get<double>(), cost.weight_bytes);
  EXPECT_EQ(info.at("activation_bytes").get<double>(), cost.activation_bytes);
}

TEST(Cli, RunTinyPrintsAChecksum) {
  const Result result = run_mk("run --preset tiny");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("output logits (80 x 384) checksum: sum "));
}

TEST(Cli, UnknownPresetFails) {
  const Result result = run_mk("run --preset nope");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.output, HasSubstr("unknown preset 'nope'"));
  EXPECT_THAT(result.output, HasSubstr("tiny"));  // the known names are listed
}

TEST(Cli, MissingModelDirectoryFails) {
  const Result result = run_mk("run --model /nonexistent");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.output, HasSubstr("mk: error: /nonexistent/config.json: cannot open"));
}

TEST(Cli, UsageErrorsFail) {
  Result result = run_mk("");
  ASSERT_TRUE(result.exited);
  EXPECT_NE(result.status, 0);
  result = run_mk("run --preset tiny --model /x");  // mutually exclusive
  ASSERT_TRUE(result.exited);
  EXPECT_NE(result.status, 0);
  EXPECT_THAT(result.output, HasSubstr("excludes"));
  result = run_mk("run --preset tiny --batch -2");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 2);  // a usage error
  EXPECT_THAT(result.output, HasSubstr("--batch: must be positive"));
  result = run_mk("run --preset tiny --policy fastest");
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 2);
  EXPECT_THAT(result.output, HasSubstr("--policy"));
}

TEST(Cli, ExportThenRunTheExportedModel) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  const std::filesystem::path input = dir.path() / "in.safetensors";
  const std::filesystem::path output = dir.path() / "out.safetensors";
  Result result = run_mk("export --preset tiny --out " + quoted(model) + " --input " + quoted(input));
  ASSERT_TRUE(result.exited);
  ASSERT_EQ(result.status, 0) << result.output;
  ASSERT_TRUE(std::filesystem::exists(model / "config.json"));
  ASSERT_TRUE(std::filesystem::exists(model / "model.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(input));

  // NOTE: the engine is pinned: `auto` picks the GPU where there is one, whose bf16 result is not the reference's.
  result = run_mk("run --engine reference --model " + quoted(model) + " --input " + quoted(input) + " --output " +
                  quoted(output));
  ASSERT_TRUE(result.exited);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("wrote " + output.string()));

  mk::SafetensorsFile file(output);
  const mk::TensorInfo* logits = file.find("logits");
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->dtype, mk::DType::kF32);
  const mk::Preset& tiny = mk::find_preset("tiny");
  EXPECT_EQ(logits->shape, (std::vector<int64_t>{tiny.shape.batch, tiny.shape.seq_len, tiny.config.vocab_size}));

  // Export writes seed-1 weights and a seed-2 input, which is what `run --preset tiny` uses: the round trip
  // through the files must change nothing, down to the bits.
  const mk::ref::Matrix from_file = mk::load_model_output(output, "logits");
  const mk::ref::Matrix in_process =
      mk::ref::forward(mk::random_weights(tiny.config, 1), mk::ref::random_input(tiny.config, tiny.shape, 2));
  ASSERT_EQ(from_file.data.size(), in_process.data.size());
  EXPECT_EQ(std::memcmp(from_file.data.data(), in_process.data.data(), in_process.data.size() * sizeof(float)), 0);
  const Result preset_run = run_mk("run --preset tiny --engine reference");
  EXPECT_EQ(checksum_line(preset_run.output), checksum_line(result.output));
  EXPECT_NE(checksum_line(result.output), "");
}

// The seed's model (no embedding, LM head or RoPE) exports with mk's own config form and runs from its directory
// exactly as from the preset.
TEST(Cli, ExportedSeedModelRunsLikeThePreset) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "seed";
  const Result exported = run_mk("export --preset seed --layers 1 --out " + quoted(model));
  ASSERT_EQ(exported.status, 0) << exported.output;
  EXPECT_TRUE(std::filesystem::exists(model / "mk_config.json"));
  const std::string shape = " --engine reference --batch 1 --seq 16";
  const Result from_dir = run_mk("run --model " + quoted(model) + shape);
  const Result from_preset = run_mk("run --preset seed --layers 1" + shape);
  ASSERT_EQ(from_dir.status, 0) << from_dir.output;
  ASSERT_EQ(from_preset.status, 0) << from_preset.output;
  auto checksum = [](const std::string& output) { return output.substr(output.find("checksum")); };
  EXPECT_EQ(checksum(from_dir.output), checksum(from_preset.output));
}

TEST(Cli, TruncatedWeightsFailCleanly) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  Result result = run_mk("export --preset tiny --out " + quoted(model));
  ASSERT_TRUE(result.exited);
  ASSERT_EQ(result.status, 0) << result.output;
  const std::filesystem::path weights = model / "model.safetensors";
  const uintmax_t full_size = std::filesystem::file_size(weights);

  // Cut in the data section (an interrupted download), then inside the header.
  for (uintmax_t size : {full_size / 2, full_size - 1, uintmax_t{100}, uintmax_t{5}}) {
    std::filesystem::resize_file(weights, size);
    result = run_mk("run --model " + quoted(model));
    ASSERT_TRUE(result.exited) << "mk crashed on a file truncated to " << size << " bytes";
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_THAT(result.output, HasSubstr("mk: error: " + weights.string())) << size;
    EXPECT_THAT(result.output, HasSubstr("truncated")) << size;
    EXPECT_THAT(result.output, Not(HasSubstr("unexpected error")));
  }
}

TEST(Cli, BadInputFileFails) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  const std::filesystem::path input = dir.path() / "in.safetensors";
  Result result = run_mk("export --preset tiny --out " + quoted(model));
  ASSERT_EQ(result.status, 0) << result.output;
  // Token ids beyond the vocabulary.
  const std::vector<int32_t> tokens = {1, 2, 384};
  mk::write_safetensors(input, {{"tokens", mk::DType::kI32, {1, 3},
                                 {reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size() * 4}}});
  result = run_mk("run --model " + quoted(model) + " --input " + quoted(input));
  ASSERT_TRUE(result.exited);
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.output, HasSubstr("token id 384 at index 2 is outside the vocabulary"));
}

// ---- mk generate ----

namespace {

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
  const Result eos_run = run_mk("generate --model " + quoted(model) + " --prompt-ids 1,2,3 --max-new-tokens 6 --output " +
                                quoted(output));
  ASSERT_EQ(eos_run.status, 0) << eos_run.output;
  const size_t stop = size_t(std::find(tokens.begin() + 3, tokens.end(), tokens[4]) - tokens.begin());
  EXPECT_EQ(ids_after(eos_run.output, "tokens: "), std::vector<int32_t>(tokens.begin(), tokens.begin() + int64_t(stop) + 1));
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
      {"--prompt-ids 1,2 --engine gpu", "not yet implemented on the GPU"},
      {"--prompt-ids 1,2,3 --max-context 2", "more than the KV cache's 2 positions"},
      {"--prompt-ids 1,2,3 --max-context 100000", "exceeds the model's max_position_embeddings 1024"},
      {"--prompt-ids 1,2 --memory-budget 0.0001", "more than the memory budget"},
      {"--prompt hello", "--prompt needs --model DIR with a tokenizer.json"},
      {"--prompt-ids 1,x", "--prompt-ids: \"x\" is not a token id"},
      {"--prompt-ids 1,2 --temperature -1", "temperature must be 0 (greedy) or positive"},
      {"--prompt-ids 1,2 --top-p 1.5", "top-p must be in (0, 1]"},
      {"--prompt-ids 1,999", "outside the vocabulary"},
      {"--prompt-ids '1;2' --batch 3", "--batch 3 but 2 prompts"},
  };
  for (const auto& [args, message] : cases) {
    const Result result = run_mk("generate --preset tiny " + args);
    EXPECT_TRUE(result.exited) << args;
    EXPECT_EQ(result.status, 1) << args << "\n" << result.output;
    EXPECT_THAT(result.output, HasSubstr(message)) << args;
  }
  EXPECT_EQ(run_mk("generate --preset tiny").status, 2) << "no prompt: a usage error";
  const Result full = run_mk("generate --preset tiny --prompt-ids 1,2,3 --max-context 8 --max-new-tokens 100");
  EXPECT_EQ(full.status, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("sequence 0 at the KV cache's end (6 new)"));
}

}  // namespace
