// Issue 12's reproducers through the `mk` binary: each hostile flag, file or path must end in one clear message and
// exit status 1 (bad input) or 2 (usage), never a crash, a hang, a silent result or a destroyed file.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hostile_fixture.h"

namespace {

namespace fs = std::filesystem;
// The fixture and its helpers are this file's vocabulary.
using namespace mk::testing_util;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;
using ::testing::Not;

// ---- crashes and unbounded memory: sizes are checked before anything is allocated from them ----

TEST_F(Hostile, HeadsThatOverflowAreRefused) {
  expect_failure(
      run_mk("run --preset tiny --engine reference --heads 576460752303423492 --kv-heads 288230376151711746"), 2,
      "--heads: must be at most 1073741824");
  const fs::path edited = model_with([](nlohmann::json& c) {
    c["num_attention_heads"] = 576460752303423492;
    c["num_key_value_heads"] = 288230376151711746;
  });
  expect_failure(run_mk(fmt::format("run --model {} --engine reference", quoted(edited))), 1,
                 "num_attention_heads 576460752303423492 is more than the 1073741824 the engines address");
}

TEST_F(Hostile, ScheduleOfHugeShapesIsRefusedAtOnce) {
  expect_failure(run_mk("schedule --preset tiny --heads 576460752303423492 --kv-heads 288230376151711746", "", 10), 2,
                 "--heads: must be at most");
  expect_failure(run_mk("schedule --preset tiny --batch 4611686018427387904", "", 10), 2, "--batch: must be at most");
  // Addressable, but more than any host here can schedule (~970 GiB; 150 GiB with 2 layers would fit the larger GPU
  // machines): refused before tiling, not at an allocation.
  expect_failure(run_mk("schedule --preset tiny --layers 16 --batch 1000000 --seq 1000", "", 10), 1,
                 "scheduling 2597937500 tasks (batch 1000000 x seq 1000) needs");
}

TEST_F(Hostile, BatchTimesSeqThatWrapsIsRefused) {
  const fs::path output = path("o.safetensors");
  expect_failure(run_mk("run --preset tiny --engine reference --batch 4611686018427387904 --output " + quoted(output)),
                 2, "--batch: must be at most");
  EXPECT_FALSE(fs::exists(output));
  expect_failure(run_mk("run --preset tiny --engine reference --batch 4611686018427387905 --seq 4"), 2,
                 "--batch: must be at most");
  expect_failure(run_mk("run --preset tiny --engine reference --batch 9223372036854775807"), 2,
                 "--batch: must be at most");
  expect_failure(run_mk("run --preset tiny --engine reference --batch 1073741824 --seq 2"), 1,
                 "batch 1073741824 x sequence length 2 is more than the 1073741824 tokens one pass addresses");
}

TEST_F(Hostile, InfoOfASequencePastTheModelsPositionsIsRefused) {
  // It printed the figures of a pass that run, schedule and trace refuse.
  for (const std::string& source : {"--model " + quoted(model()), std::string("--preset tiny")}) {
    expect_failure(run_mk(fmt::format("info {} --batch 1 --seq 1025 --json", source)), 1,
                   "sequence length 1025 exceeds the model's max_position_embeddings 1024");
  }
}

TEST_F(Hostile, RunsTooLargeForThisHostAreRefusedBeforeAllocating) {
  expect_failure(run_mk("run --preset tiny --engine reference --batch 1000000 --seq 1000", "", 10), 1,
                 "the reference engine at batch 1000000 x seq 1000 needs");
  // "On a small machine": an 8B model's reference pass under a 4 GB address space ends in a message, not in a
  // std::bad_alloc after 21 s.
  expect_failure(run_mk("run --preset llama-3.1-8b --engine reference", "ulimit -v 4000000;", 10), 1,
                 "of host memory, more than the");
}

TEST_F(Hostile, SeedsOutsideUint64AreRefusedNotSaturated) {
  // Both ran with seed 2^64 - 1, as `--seed 18446744073709551615` does.
  const std::string run = "run --preset tiny --engine reference --batch 1 --seq 4 --seed ";
  expect_failure(run_mk(run + "99999999999999999999"), 2, "--seed: must be below 2^64, got 99999999999999999999");
  expect_failure(run_mk(run + "-1"), 2, "--seed: must be a whole number from 0, got -1");
  expect_failure(run_mk("generate --preset tiny --prompt-ids 1 --weights-seed -1"), 2, "--weights-seed: must be a");
  expect_failure(run_mk("generate --preset tiny --prompt-ids 1 --temperature 1 --seed 18446744073709551616"), 2,
                 "--seed: must be below 2^64");
}

TEST_F(Hostile, DModelNotAMultipleOfHeadDimIsAUsageError) {
  // 200 ran with one head of 128 columns; 32 blamed num_attention_heads, which was never given.
  for (const char* command : {"run", "info", "schedule"}) {
    expect_failure(run_mk(fmt::format("{} --preset seed --d-model 200", command)), 2,
                   "--d-model 200 is not a multiple of the seed preset's head_dim 128");
    expect_failure(run_mk(fmt::format("{} --preset tiny --d-model 32", command)), 2,
                   "--d-model 32 is not a multiple of the tiny preset's head_dim 64");
  }
  // --heads derives nothing from d_model, and the kv heads follow it rather than d_model / head_dim.
  const MkResult heads = run_mk("info --preset seed --d-model 200 --heads 3");
  EXPECT_EQ(heads.status, 0) << heads.output;
  EXPECT_THAT(heads.output, HasSubstr("d_model 200, d_ff 800, layers 8, heads 3 (kv 3, head_dim 128)"));
}

// ---- data loss: outputs never land on inputs, and a failed write is a failure ----

TEST_F(Hostile, OutputOntoTheInputIsRefused) {
  const std::string before = read_bytes(input());
  expect_failure(run_mk(run_model("--output " + quoted(input()))), 1, "is the same file as --input");
  // The same file by another name: a symbolic link, a hard link, a detour through "..".
  fs::create_symlink(input(), path("link.safetensors"));
  fs::create_hard_link(input(), path("hard.safetensors"));
  for (const fs::path& alias : {path("link.safetensors"), path("hard.safetensors"), model() / ".." / "in.safetensors"})
    expect_failure(run_mk(run_model("--output " + quoted(alias))), 1, "refusing to overwrite an input");
  expect_failure(run_mk(run_model("--json " + quoted(input()))), 1, "refusing to overwrite an input");
  expect_failure(run_mk(fmt::format("generate --model {} --tokens {} --output {}", quoted(model()), quoted(input()),
                                    quoted(input()))),
                 1, "--output " + input().string() + " is the same file as --tokens");
  EXPECT_EQ(read_bytes(input()), before);
}

TEST_F(Hostile, OutputOntoTheWeightsIsRefused) {
  const std::string before = read_bytes(model() / "model.safetensors");
  expect_failure(run_mk(run_model("--output " + quoted(model() / "model.safetensors"))), 1,
                 "model.safetensors): refusing to overwrite an input");
  expect_failure(run_mk(run_model("--json " + quoted(model() / "config.json"))), 1, "refusing to overwrite an input");
  expect_failure(run_mk(fmt::format("schedule --model {} --out {}", quoted(model()), quoted(model() / "config.json"))),
                 1, "refusing to overwrite an input");
  EXPECT_EQ(read_bytes(model() / "model.safetensors"), before);
}

TEST_F(Hostile, ExportDoesNotClobberItsOwnOutputOrItsModel) {
  const fs::path out = path("e");
  expect_failure(
      run_mk(fmt::format("export --preset tiny --out {} --input {}", quoted(out), quoted(out / "model.safetensors"))),
      1, "are the same file: one would overwrite the other");
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  const std::string config = read_bytes(model() / "config.json");
  expect_failure(run_mk(fmt::format("export --model {} --out {}", quoted(model()), quoted(model()))), 1,
                 "refusing to overwrite an input");
  EXPECT_EQ(read_bytes(model() / "config.json"), config);
}

TEST_F(Hostile, ExportRefusesAnInputThatIsItsOutputDirectory) {
  // The model was written first, and only then did writing --input onto the new directory fail.
  for (const auto& [out, input] : {std::pair{path("e"), path("e")}, std::pair{path("f") / "m", path("f")}}) {
    expect_failure(run_mk(fmt::format("export --preset tiny --out {} --input {}/", quoted(out), quoted(input))), 1,
                   "or a directory holding it; give a file name");
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST_F(Hostile, AFailedWriteIsAFailure) {
  expect_failure(run_mk(run_model("--output /dev/full")), 1, "/dev/full: write failed: No space left on device");
  expect_failure(run_mk(run_model("--json /dev/full")), 1, "/dev/full: write failed");
}

TEST_F(Hostile, OutputInAMissingDirectoryFailsBeforeThePass) {
  const fs::path missing = path("missing") / "o.safetensors";
  const auto result = run_mk(run_model("--output " + quoted(missing)));
  expect_failure(result, 1, "does not exist");
  EXPECT_THAT(result.output, Not(HasSubstr("checksum")));  // failed before the pass, not after it
  expect_failure(run_mk("trace --preset tiny --engine cpu-vm --out " + quoted(missing)), 1, "does not exist");
  expect_failure(run_mk("schedule --preset tiny --out " + quoted(missing)), 1, "does not exist");
  expect_failure(run_mk(run_model("--output " + quoted(model()))), 1, "is a directory");
}

// ---- silent wrong results: refused instead ----

TEST_F(Hostile, EmptyModelOrPresetIsRefused) {
  expect_failure(run_mk("run --model ''"), 2, "--model: must not be empty");
  expect_failure(run_mk("run --preset ''"), 2, "--preset: must not be empty");
  expect_failure(run_mk("run --preset tiny --output ''"), 2, "--output: must not be empty");
  // An empty --tokenizer was looked for as "no tokenizer.json at ", an empty --file read as empty text.
  expect_failure(run_mk("tokenize --tokenizer '' --text hi"), 2, "--tokenizer: must not be empty");
  expect_failure(run_mk("detokenize --tokenizer '' --ids 1"), 2, "--tokenizer: must not be empty");
  expect_failure(run_mk("tokenize --tokenizer " + quoted(model()) + " --file ''"), 2, "--file: must not be empty");
}

TEST_F(Hostile, InsaneConfigNumbersAreRefused) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& c) { c["rms_norm_eps"] = 1e308; }, "field 'rms_norm_eps' is out of range"},
      {[](nlohmann::json& c) { c["rms_norm_eps"] = 0.5; }, "rms_norm_eps must be positive and at most 0.01, got 0.5"},
      {[](nlohmann::json& c) { c["rope_theta"] = 1e-308; }, "rope_theta must be a finite number above 1"},
      {[](nlohmann::json& c) { c["rope_scaling"] = "llama3"; }, "field 'rope_scaling' must be an object"},
      {[](nlohmann::json& c) { c["max_position_embeddings"] = 1e24; }, "'max_position_embeddings' is out of range"},
  };
  for (const auto& [edit, message] : cases)
    expect_failure(run_mk(fmt::format("run --model {} --engine reference", quoted(model_with(edit)))), 1, message);
}

TEST_F(Hostile, DuplicateNamesAreRefused) {
  write_bytes(path("dup.safetensors"),
              safetensors_bytes(R"({"tokens":{"dtype":"I32","shape":[1,1],"data_offsets":[0,4]},)"
                                R"("tokens":{"dtype":"I32","shape":[1,1],"data_offsets":[4,8]}})",
                                std::string(8, '\1')));
  expect_failure(run_mk(fmt::format("run --model {} --input {} --engine reference", quoted(model()),
                                    quoted(path("dup.safetensors")))),
                 1, "tensor 'tokens' appears twice in the header");
  std::string config = read_bytes(model() / "config.json");
  config.insert(1, "\"hidden_size\": 7, ");
  write_bytes(model() / "config.json", config);
  expect_failure(run_mk(fmt::format("run --model {} --engine reference", quoted(model()))), 1,
                 "key 'hidden_size' appears twice in one object");
}

TEST_F(Hostile, TokenShapeOf2To63IsRefused) {
  for (const char* shape : {"[9223372036854775808,0]", "[0,9223372036854775808]"}) {
    write_bytes(
        path("huge.safetensors"),
        safetensors_bytes(fmt::format(R"({{"tokens":{{"dtype":"I32","shape":{},"data_offsets":[0,0]}}}})", shape)));
    expect_failure(run_mk(fmt::format("run --model {} --input {} --engine reference", quoted(model()),
                                      quoted(path("huge.safetensors")))),
                   1, "tensor 'tokens': shape is too large");
  }
}

}  // namespace
