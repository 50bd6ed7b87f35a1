// Issue 12's reproducers of hostile files and ignored flags through the `mk` binary: files that hang or amplify,
// schedule files that lie about their counts, names that steer the terminal, flags that would be silently ignored.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hostile_fixture.h"
#include "mk/program.h"

namespace {

namespace fs = std::filesystem;
// The fixture and its helpers are this file's vocabulary.
using namespace mk::testing_util;  // NOLINT(google-build-using-namespace)
using ::testing::HasSubstr;
using ::testing::Not;

// A schedule file of the tiny model at batch 1 x seq 8 on 2 SMs, with its JSON header edited.
class HostileSchedule : public Hostile {
 protected:
  static constexpr const char* kShape = "--preset tiny --batch 1 --seq 8";
  void SetUp() override {
    Hostile::SetUp();
    const auto result = run_mk(fmt::format("schedule {} --sms 2 --out {}", kShape, quoted(schedule())));
    ASSERT_EQ(result.status, 0) << result.output;
  }
  fs::path schedule() const { return path("s.sched"); }
  fs::path edited(const std::function<void(nlohmann::json&)>& edit) const {
    const std::string bytes = read_bytes(schedule());
    uint64_t length;
    std::memcpy(&length, bytes.data() + 8, 8);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(16, length));
    edit(header);
    const std::string text = header.dump();
    const uint64_t new_length = text.size();
    write_bytes(path("edited.sched"), bytes.substr(0, 8) + std::string(reinterpret_cast<const char*>(&new_length), 8) +
                                          text + bytes.substr(16 + length));
    return path("edited.sched");
  }
  std::string run_with(const fs::path& file) const {
    return fmt::format("run {} --engine cpu-vm --schedule {}", kShape, quoted(file));
  }
};

// ---- hangs and memory from tiny files ----

TEST_F(HostileSchedule, CountsBeyondTheFileAreRefusedBeforeAllocating) {
  // A 5 KB file declaring 200 M counters had the verifier take 16 GB; 2 GB of address space is plenty now.
  expect_failure(
      run_mk(run_with(edited([](nlohmann::json& h) { h["num_counters"] = 200'000'000; })), "ulimit -v 2000000;"), 1,
      "200000000 counters for");
  expect_failure(run_mk(run_with(edited([](nlohmann::json& h) { h["num_instructions"] = 1e24; }))), 1,
                 "'num_instructions' must be a whole number in [0, 4294967295], got 1e+24");
  // A float-to-integer cast of 1e24 was undefined behaviour.
  expect_failure(run_mk(run_with(edited([](nlohmann::json& h) { h["config"]["max_position_embeddings"] = 1e24; }))), 1,
                 "'max_position_embeddings' is out of range (1e+24)");
  expect_failure(run_mk(run_with(edited([](nlohmann::json& h) { h["batch"] = -1; }))), 1,
                 "'batch' must be a whole number");
  expect_failure(
      run_mk(fmt::format("run --preset tiny --batch 2 --seq 8 --engine cpu-vm --schedule {}", quoted(schedule()))), 1,
      "built for batch 1 x seq 8, not batch 2 x seq 8");
}

TEST_F(Hostile, FilesThatAreNotRegularAreRefusedWithoutBlocking) {
  const std::string vm = "run --preset tiny --engine cpu-vm --schedule ";
  expect_failure(run_mk(vm + "/dev/zero", "", 5), 1, "/dev/zero: is a device, not a regular file");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  expect_failure(run_mk(vm + quoted(path("fifo")), "", 5), 1, "is a FIFO (named pipe), not a regular file");
  expect_failure(
      run_mk(fmt::format("run --model {} --input {} --engine reference", quoted(model()), quoted(path("fifo"))), "", 5),
      1, "is a FIFO");
  expect_failure(run_mk(fmt::format("tokenize --tokenizer {} --text hi", quoted(path("fifo"))), "", 5), 1,
                 "fifo: is a FIFO (named pipe), not a regular file");
  fs::create_directories(path("dir"));
  expect_failure(run_mk(vm + quoted(path("dir"))), 1, "is a directory, not a regular file");
  fs::create_directories(path("dirmodel") / "config.json");
  expect_failure(run_mk(fmt::format("run --model {}", quoted(path("dirmodel")))), 1,
                 "config.json: is a directory, not a regular file");
  fs::create_symlink(path("loop2"), path("loop1"));
  fs::create_symlink(path("loop1"), path("loop2"));
  expect_failure(run_mk(vm + quoted(path("loop1"))), 1, "a loop of symbolic links");
}

TEST_F(Hostile, NestedHeadersCostNoMemory) {
  // A 40 MB nested header took 1.5 GB as a DOM; now it is refused at depth 16 within a 1 GB address space.
  const size_t depth = 20'000'000;
  write_bytes(path("nested.safetensors"),
              safetensors_bytes("{\"__metadata__\":" + std::string(depth, '[') + std::string(depth, ']') + "}"));
  expect_failure(run_mk(fmt::format("run --model {} --input {} --engine reference", quoted(model()),
                                    quoted(path("nested.safetensors"))),
                        "ulimit -v 1000000;"),
                 1, "safetensors header nested deeper than 16 levels");
  // config.json: capped before parsing, and nesting refused within the cap.
  write_bytes(model() / "config.json", std::string(5 << 20, ' '));
  expect_failure(run_mk(fmt::format("run --model {}", quoted(model()))), 1, "more than the 4194304 allowed");
  write_bytes(model() / "config.json", std::string(100'000, '[') + std::string(100'000, ']'));
  expect_failure(run_mk(fmt::format("run --model {}", quoted(model()))), 1, "JSON nested deeper than 64 levels");
}

TEST_F(Hostile, CpuVmDelayIsBounded) {
  expect_failure(run_mk("run --preset tiny --engine cpu-vm --max-delay-us 2147483647", "", 5), 2,
                 "--max-delay-us: Value 2147483647 not in range");  // CLI11 versions word the range differently
}

// ---- names from files never reach the terminal raw ----

TEST_F(Hostile, TensorNamesAreEscaped) {
  write_bytes(path("ansi.safetensors"),
              safetensors_bytes(R"({"\u001b[2J\u001b[31mevil\u009b":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})",
                                std::string(4, '\0')));
  const auto result = run_mk(
      fmt::format("run --model {} --input {} --engine reference", quoted(model()), quoted(path("ansi.safetensors"))));
  expect_failure(result, 1, "tensor '\\x1b[2J\\x1b[31mevil\\xc2\\x9b': unknown dtype 'F7'");
  EXPECT_EQ(result.output.find('\x1b'), std::string::npos);
  EXPECT_EQ(result.output.find("\xc2\x9b"), std::string::npos);
}

// ---- flags that would be silently ignored are usage errors naming both flags ----

TEST_F(Hostile, FlagsThatCannotApplyAreUsageErrors) {
  const std::string vm = "run --preset tiny --engine cpu-vm ", reference = "run --preset tiny --engine reference ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {run_model("--batch 2"), "--batch excludes --input"},
      {run_model("--seq 2"), "--seq excludes --input"},
      {vm + "--schedule x.sched --sms 4", "--sms excludes --schedule"},
      {vm + "--schedule x.sched --policy round-robin", "--policy excludes --schedule"},
      {reference + "--schedule x.sched",
       "--schedule applies to --engine cpu-vm or gpu only, and the engine is reference"},
      {reference + "--max-delay-us 5", "--max-delay-us applies to --engine cpu-vm only"},
      {vm + "--iterations 3", "--iterations applies to --engine gpu"},
      {reference + "--launch-per-op", "--launch-per-op applies to --engine gpu"},
      {vm + "--stall-timeout 60", "--stall-timeout applies to --engine gpu only, and the engine is cpu-vm"},
      {reference + "--stall-timeout 0", "--stall-timeout: must be a number of seconds in [0.001, 3600], got 0"},
      {reference + "--stall-timeout 7200", "--stall-timeout: must be a number of seconds in [0.001, 3600], got 7200"},
      {reference + "--stall-timeout 1e-320", "--stall-timeout: must be a number of seconds in [0.001, 3600]"},
      {reference + "--stall-timeout nan", "--stall-timeout: must be a number of seconds in [0.001, 3600], got nan"},
      {run_model("--seed 3"), "--seed has nothing to seed"},
      {fmt::format("run --model {} --layers 3", quoted(model())), "--model excludes --layers"},
      {"trace --preset tiny --engine cpu-vm --overhead 3", "--overhead applies to --engine gpu"},
      {reference + "--skip-dependency-waits", "--skip-dependency-waits applies to --engine gpu only"},
      {"trace --preset tiny --engine cpu-vm --skip-dependency-waits", "--skip-dependency-waits applies to --engine gpu"},
      // refused before a GPU is looked for: that output is not the model's
      {"run --preset tiny --engine gpu --skip-dependency-waits --output out.safetensors",
       "--output with --skip-dependency-waits: that output is not the model's"},
      {reference + "--no-race-check", "--no-race-check applies to --engine cpu-vm only"},
      {"export --preset tiny --out x --batch 2", "--batch requires --input"},
      {"info --preset tiny --max-context 256", "--max-context describes the KV cache of a --decode step"},  // was 1
      {"schedule --preset tiny --max-context 256", "--max-context describes the KV cache of a --decode step"},
  };
  for (const auto& [args, message] : cases) expect_failure(run_mk(args), 2, message);
}

TEST_F(Hostile, BisectUntilALayerTheModelLacksIsAUsageError) {
  // Each compared every layer, as -1 does, and only after the weights were made and a GPU was looked for.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--until-layer 2", "--until-layer 2: must be -1 (all) or one of the model's 2 layers, 0 to 1"},
      {"--until-layer -5", "--until-layer -5: must be -1 (all) or one of the model's 2 layers"},
      {"--until-layer ''", "--until-layer: must not be empty"},  // was layer 0
  };
  for (const auto& [args, message] : cases) expect_failure(run_mk("bisect --preset tiny " + args), 2, message);
}

// ---- what held up still holds, and mk info counts every weight ----

TEST(HostileInfo, WeightMemoryCountsTheEmbedding) {
  const auto result = run_mk("info --preset llama-3.1-8b --json");
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json info = nlohmann::json::parse(result.output);
  EXPECT_EQ(info.at("weight_bytes").get<double>(), 2.0 * info.at("parameters").get<double>());
  EXPECT_NEAR(info.at("weight_bytes").get<double>() / (1 << 30), 14.96, 0.01);
  EXPECT_THAT(run_mk("info --preset llama-3.1-8b").output, HasSubstr("14.96 GiB weights"));
}

}  // namespace
