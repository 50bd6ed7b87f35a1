// Tests of the `mk` command-line tool, run as a child process: exit codes, messages, and its files.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mk/files.h"
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
  using FlopsByOp = std::map<std::string, double>;
  EXPECT_EQ(info.at("flops_by_op").get<FlopsByOp>(), cost.flops_by_op);
  double summed = 0;
  for (const auto& [op, flops] : cost.flops_by_op) summed += flops;
  EXPECT_DOUBLE_EQ(summed, cost.flops);
  EXPECT_EQ(cost.flops_by_op.count("gate_up"), 1u);
  EXPECT_EQ(cost.flops_by_op.count("attn_norm"), 0u) << "a norm does no matrix product";
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

// A config.json that leaves tensors unused runs (transformers loads it too) with a warning naming them.
TEST(Cli, WeightsTheConfigLeavesUnusedAreWarnedAbout) {
  TempDir dir;
  const std::filesystem::path model = dir.path() / "model";
  ASSERT_EQ(run_mk("export --preset tiny --out " + quoted(model)).status, 0);
  const std::string run = "run --engine reference --batch 1 --seq 8 --model " + quoted(model);
  Result result = run_mk(run);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, Not(HasSubstr("warning")));

  nlohmann::json config = mk::read_json_file(model / "config.json", 1 << 20);
  config["num_hidden_layers"] = 1;
  mk::write_file(model / "config.json", config.dump());
  result = run_mk(run);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("warning: " + model.string() + " holds 9 tensor(s) the model's config"));
  EXPECT_THAT(result.output, HasSubstr("model.layers.1."));
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
