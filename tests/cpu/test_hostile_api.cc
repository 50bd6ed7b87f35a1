// Issue 12's defects at the API where the fix lives: checked sizes, the task count before tiling, JSON and
// safetensors headers that cannot amplify or hide duplicates, non-blocking inputs, atomic outputs, escaped names.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hostile_fixture.h"
#include "mk/cpu_vm.h"
#include "mk/files.h"
#include "mk/generate.h"
#include "mk/graph.h"
#include "mk/limits.h"
#include "mk/parallel.h"
#include "mk/program.h"
#include "mk/safetensors.h"
#include "mk/schedule.h"
#include "mk/tokenizer.h"
#include "mk/weights.h"

namespace {

namespace fs = std::filesystem;
using mk::testing_util::error_of;
using mk::testing_util::read_bytes;
using mk::testing_util::safetensors_bytes;
using mk::testing_util::TempDir;
using mk::testing_util::write_bytes;
using ::testing::HasSubstr;

std::string parse_error(const std::string& header) {
  const std::string bytes = safetensors_bytes(header, std::string(16, '\0'));
  return error_of([&] { mk::parse_safetensors({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "f"); });
}

TEST(HostileApi, PrintableEscapesWhatSteersATerminal) {
  EXPECT_EQ(mk::printable("a\x1b[2Jb\n\x7f"), "a\\x1b[2Jb\\x0a\\x7f");
  EXPECT_EQ(mk::printable("\xc2\x9b"
                          "31m"),
            "\\xc2\\x9b31m");                                                        // C1 CSI, as UTF-8
  EXPECT_EQ(mk::printable("\x9b\xff"), "\\x9b\\xff");                                // not UTF-8
  EXPECT_EQ(mk::printable("x\xe2\x80\xaey"), "x\\xe2\\x80\\xaey");                   // U+202E right-to-left override
  EXPECT_EQ(mk::printable("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // text stays text
  EXPECT_EQ(mk::printable(mk::printable("\x1b")), mk::printable("\x1b"));
}

TEST(HostileApi, SizesAreCheckedBeforeUse) {
  EXPECT_THAT(error_of([] { (void)mk::RunShape{int64_t(1) << 62, 4}.tokens(); }), HasSubstr("overflows 64 bits"));
  EXPECT_THAT(error_of([] { mk::RunShape{int64_t(1) << 62, 4}.validate(); }), HasSubstr("more than the 1073741824"));
  EXPECT_THAT(error_of([] { mk::RunShape{0, 4}.validate(); }), HasSubstr("must be positive"));
  mk::ModelConfig config = mk::find_preset("tiny").config;
  config.n_heads = int64_t(1) << 20;
  config.n_kv_heads = int64_t(1) << 20;
  config.head_dim = int64_t(1) << 20;
  EXPECT_THAT(error_of([&] { config.validate(); }), HasSubstr("x head_dim 3298534883328 is more than"));
  config = mk::find_preset("tiny").config;
  config.n_layers = mk::kMaxLayers + 1;
  EXPECT_THAT(error_of([&] { config.validate(); }), HasSubstr("num_hidden_layers 65535 is more than"));
  config = mk::find_preset("tiny").config;
  config.rms_norm_eps = std::numeric_limits<float>::infinity();
  EXPECT_THAT(error_of([&] { config.validate(); }), HasSubstr("rms_norm_eps must be positive and at most"));
  config = mk::find_preset("tiny").config;
  config.rope.theta = std::nan("");
  EXPECT_THAT(error_of([&] { config.validate(); }), HasSubstr("rope_theta must be a finite number above 1"));
  // Every width addressable, yet the buffers of 65534 layers of 2^30 x 2^30 elements overflow int64.
  config = mk::find_preset("seed").config;
  config.n_layers = mk::kMaxLayers;
  config.d_ff = mk::kMaxColumns;
  EXPECT_THAT(error_of([&] { mk::forward_cost(config, {1, mk::kMaxTokens}); }), HasSubstr("overflows 64 bits"));
}

TEST(HostileApi, TheGraphIsCountedBeforeItIsTiled) {
  for (const mk::Preset& preset : mk::presets()) {
    for (mk::RunShape shape : {mk::RunShape{1, 1}, mk::RunShape{3, 129}, mk::RunShape{2, 300}}) {
      const mk::Graph graph(preset.config, shape);
      EXPECT_EQ(mk::count_tasks(preset.config, shape), int64_t(graph.tasks().size())) << preset.config.name;
    }
  }
  // Addressable but not schedulable on any host: refused without tiling (which would take hours and terabytes).
  EXPECT_THAT(error_of([] {
                mk::Graph graph(mk::find_preset("seed").config, {1, int64_t(1) << 29});
              }),
              HasSubstr("tasks (batch 1 x seq 536870912) needs"));
  EXPECT_THAT(error_of([] {
                mk::Graph graph(mk::find_preset("seed").config, {1, mk::kMaxTokens});
              }),
              HasSubstr("4563402752 tasks are more than a schedule addresses (fewer than 2^32)"));
}

TEST(HostileApi, JsonWithDuplicateKeysOrDeepNestingIsRefused) {
  EXPECT_THAT(error_of([] { mk::parse_json(R"({"a": {"b": 1, "b": 2}})", "c.json"); }),
              HasSubstr("c.json: key 'b' appears twice in one object"));
  EXPECT_EQ(mk::parse_json(R"([{"b": 1}, {"b": 2}])", "c.json").size(), 2u);  // the same key in two objects is fine
  EXPECT_THAT(error_of([] { mk::parse_json(std::string(65, '[') + std::string(65, ']'), "c.json"); }),
              HasSubstr("JSON nested deeper than 64 levels"));
  EXPECT_EQ(mk::json_to_int64(nlohmann::json(1e24)), std::nullopt);
  EXPECT_EQ(mk::json_to_int64(nlohmann::json(true)), std::nullopt);
  EXPECT_EQ(mk::json_to_int64(nlohmann::json(2.5)), std::nullopt);
  EXPECT_EQ(mk::json_to_int64(nlohmann::json(uint64_t(1) << 63)), std::nullopt);
  EXPECT_EQ(mk::json_to_int64(nlohmann::json(256.0)), 256);
  EXPECT_EQ(mk::json_to_double(nlohmann::json(std::numeric_limits<double>::infinity())), std::nullopt);
}

TEST(HostileApi, TokenizerConfigFilesThatAreNotObjectsAreRefused) {
  // Each was read as a file naming no BOS or EOS: llama2's text was encoded without its BOS.
  for (const char* name : {"tokenizer_config.json", "generation_config.json", "config.json"}) {
    const TempDir dir;
    fs::copy(fs::path(MK_TOKENIZER_FIXTURES) / "llama2", dir.path());
    write_bytes(dir.path() / name, "[{\"bos_token\": \"<s>\"}]");
    EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }),
                HasSubstr(fmt::format("{}: expected a JSON object, got [", name)));
  }
}

// Every reader of a model directory's config files (the tokenizer's BOS and EOS, model_eos_ids, the model config)
// reads them by one set of rules: each of these was accepted by one reader and refused by another, or refused by both
// in different words.
TEST(HostileApi, ConfigFilesGetOneVerdictAndOneMessageFromEveryReader) {
  const std::string past_the_limit = R"({"pad": ")" + std::string(mk::kMaxConfigJsonBytes, 'x') + R"("})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([{"eos_token_id": 2}])", "expected a JSON object, got [{"},
      {"{oops", ": not valid JSON: "},
      {R"({"eos_token_id": 1, "eos_token_id": 2})", "key 'eos_token_id' appears twice in one object"},
      {past_the_limit, "more than the 4194304 allowed for this file"},
      {"", "cannot open: No such file or directory"},  // a dangling symbolic link
  };
  const mk::ModelConfig& config = mk::find_preset("tiny").config;
  for (const char* name : {"tokenizer_config.json", "generation_config.json", "config.json"}) {
    for (const auto& [text, message] : cases) {
      const TempDir dir;
      fs::copy_file(fs::path(MK_TOKENIZER_FIXTURES) / "llama2" / "tokenizer.json", dir.path() / "tokenizer.json");
      const fs::path file = dir.path() / name;
      if (text.empty()) {
        fs::create_symlink(dir.path() / "nowhere.json", file);
      } else {
        write_bytes(file, text);
      }
      // tokenizer_config.json has a cap of its own (ATokenizerConfigPastTheConfigCapLoads)
      if (std::string(name) == "tokenizer_config.json" && text == past_the_limit) continue;
      const std::string shown = fmt::format("{} with {}", name, message);
      const std::string expected = error_of([&] { mk::read_config_json(file); });
      EXPECT_THAT(expected, HasSubstr(file.string() + ": ")) << shown;
      EXPECT_THAT(expected, HasSubstr(message)) << shown;
      EXPECT_EQ(error_of([&] { mk::Tokenizer::load(dir.path()); }), expected) << shown;
      if (std::string(name) == "tokenizer_config.json") continue;  // read by the tokenizer alone
      EXPECT_EQ(error_of([&] { mk::model_eos_ids(config, dir.path()); }), expected) << shown;
      if (std::string(name) == "config.json") {
        EXPECT_EQ(error_of([&] { mk::load_model_config(file); }), expected) << shown;
      }
    }
  }
}

// tokenizer_config.json lists every added token, and models with tens of thousands of them (audio codes) write one
// past the 4 MiB that caps the other config files: it loads, up to the cap tokenizer.json has.
TEST(HostileApi, ATokenizerConfigPastTheConfigCapLoads) {
  const TempDir dir;
  fs::copy_file(fs::path(MK_TOKENIZER_FIXTURES) / "llama2" / "tokenizer.json", dir.path() / "tokenizer.json");
  const std::string template_text(mk::kMaxConfigJsonBytes + 1024, 'x');
  write_bytes(dir.path() / "tokenizer_config.json", R"({"chat_template": ")" + template_text + R"("})");
  EXPECT_NO_THROW(mk::Tokenizer::load(dir.path()));
}

// A dangling tokenizer.json in a model directory is named, not taken for a model without a tokenizer (whose EOS
// would then be passed over).
TEST(HostileApi, ADanglingTokenizerIsNamedNotPassedOver) {
  const TempDir dir;
  fs::create_symlink(dir.path() / "blob", dir.path() / "tokenizer.json");
  EXPECT_TRUE(mk::Tokenizer::in_model_dir(dir.path()));
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }),
              HasSubstr("tokenizer.json: cannot open: No such file or directory (a symbolic link to '"));
}

// A symbolic link to a good file is followed by every reader alike.
TEST(HostileApi, ConfigFilesMayBeSymbolicLinks) {
  const TempDir dir;
  fs::copy_file(fs::path(MK_TOKENIZER_FIXTURES) / "llama2" / "tokenizer.json", dir.path() / "tokenizer.json");
  write_bytes(dir.path() / "real.json", R"({"eos_token_id": 7})");
  fs::create_symlink(dir.path() / "real.json", dir.path() / "generation_config.json");
  EXPECT_EQ(mk::model_eos_ids(mk::find_preset("tiny").config, dir.path()), std::vector<int32_t>{7});
  EXPECT_EQ(mk::Tokenizer::load(dir.path()).eos_ids(), std::vector<int32_t>{7});
}

// A dangling mk_config.json link is refused by name: passed over, the model would silently load by config.json.
TEST(HostileApi, ADanglingMkConfigIsRefusedNotPassedOver) {
  const TempDir dir;
  write_bytes(dir.path() / "config.json",
              mk::model_config_to_hf_json(mk::find_preset("llama-3.2-1b").config).dump());
  ASSERT_NO_THROW(mk::load_model_dir_config(dir.path()));
  fs::create_symlink(dir.path() / "missing.json", dir.path() / "mk_config.json");
  EXPECT_THAT(error_of([&] { mk::load_model_dir_config(dir.path()); }), HasSubstr("mk_config.json"));
}

TEST(HostileApi, SafetensorsHeadersHideNoDuplicatesAndCannotNest) {
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})"),
              HasSubstr("f: tensor 'a' appears twice in the header"));
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})"),
              HasSubstr("tensor 'a': field 'dtype' appears twice"));
  EXPECT_THAT(parse_error(R"({"__metadata__":{},"__metadata__":{}})"), HasSubstr("'__metadata__' appears twice"));
  EXPECT_THAT(parse_error(R"({"__metadata__":)" + std::string(20, '[') + std::string(20, ']') + "}"),
              HasSubstr("nested deeper than 16 levels"));
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","shape":[0,1152921504606846977],"data_offsets":[0,0]}})"),
              HasSubstr("shape is too large"));
  // Metadata and unknown fields, however shaped, are skipped, not kept.
  const std::string ok = safetensors_bytes(
      R"({"__metadata__":{"x":[[1,{"y":null}]]},"a":{"dtype":"U8","note":{"z":[true]},"shape":[2],"data_offsets":[0,2]}})",
      "ab");
  EXPECT_EQ(mk::parse_safetensors({reinterpret_cast<const uint8_t*>(ok.data()), ok.size()}, "ok").size(), 1u);
}

TEST(HostileApi, InputsThatAreNotRegularFilesAreRefusedWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { mk::SafetensorsFile file(fifo); }),
              HasSubstr("is a FIFO (named pipe), not a regular file"));
  EXPECT_THAT(error_of([&] { mk::load_schedule(fifo); }), HasSubstr("is a FIFO"));
  EXPECT_THAT(error_of([] { mk::load_schedule("/dev/zero"); }), HasSubstr("/dev/zero: is a device"));
  EXPECT_THAT(error_of([] { mk::load_model_config("/dev/zero"); }), HasSubstr("is a device"));
  write_bytes(dir.path() / "big.json", std::string(100, ' '));
  EXPECT_THAT(error_of([&] { mk::read_file(dir.path() / "big.json", 99); }), HasSubstr("100 bytes, more than the 99"));
}

TEST(HostileApi, SchedulesAskingForMoreCountersThanTasksAreRefused) {
  const mk::Graph graph(mk::find_preset("tiny").config, {1, 8});
  mk::Schedule schedule = mk::make_schedule(graph, mk::derive_dependencies(graph), mk::SchedulePolicy::kCostModel, 2);
  schedule.num_counters = 200'000'000;
  EXPECT_THAT(error_of([&] { mk::verify_schedule(graph, schedule); }), HasSubstr("200000000 counters for"));
}

TEST(HostileApi, WritesAreAtomic) {
  TempDir dir;
  const fs::path file = dir.path() / "out.txt";
  mk::write_file(file, "old");
  ::chmod(file.c_str(), 0640);
  // A writer that fails halfway leaves the old file as it was, and no temporary file behind.
  EXPECT_THROW(mk::write_file(file,
                              [](std::ostream& out) {
                                out << "partial";
                                throw std::runtime_error("disk gone");
                              }),
               std::runtime_error);
  EXPECT_EQ(read_bytes(file), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  mk::write_file(file, "new");
  EXPECT_EQ(read_bytes(file), "new");
  EXPECT_EQ(fs::status(file).permissions() & fs::perms::all, fs::perms(0640));  // replacing keeps permissions
  // Through a symbolic link: the target changes, the link stays a link.
  fs::create_symlink(file, dir.path() / "link");
  mk::write_file(dir.path() / "link", "linked");
  EXPECT_TRUE(fs::is_symlink(dir.path() / "link"));
  EXPECT_EQ(read_bytes(file), "linked");
  EXPECT_THAT(error_of([] { mk::write_file("/dev/full", "x"); }), HasSubstr("/dev/full: write failed"));
  EXPECT_THAT(error_of([&] { mk::write_file(dir.path() / "no" / "x", "x"); }), HasSubstr("does not exist"));
}

TEST(HostileApi, OutputsAreComparedWithInputsAsFiles) {
  TempDir dir;
  const fs::path input = dir.path() / "in";
  write_bytes(input, "x");
  fs::create_hard_link(input, dir.path() / "hard");
  const std::vector<mk::NamedPath> inputs = {{"--input", input}};
  for (const fs::path& alias : {dir.path() / "hard", dir.path() / "." / "in"}) {
    EXPECT_THAT(error_of([&] {
                  mk::check_distinct({{"--output", alias}}, inputs);
                }),
                HasSubstr("is the same file as --input"));
  }
  EXPECT_THAT(error_of([&] {
                mk::check_distinct({{"--a", dir.path() / "new"}, {"--b", dir.path() / "new"}}, {});
              }),
              HasSubstr("--a " + (dir.path() / "new").string() + " and --b"));
  EXPECT_NO_THROW(mk::check_distinct({{"--a", "/dev/null"}, {"--b", "/dev/null"}}, inputs));
}

TEST(HostileApi, ParallelForPassesExceptionsOn) {
  EXPECT_THROW(mk::parallel_for(
                   64,
                   [](int64_t begin, int64_t) {
                     if (begin > 0) throw mk::Error("chunk failed");
                   },
                   4),
               mk::Error);
}

TEST(HostileApi, CpuVmDelayIsBounded) {
  const mk::ModelConfig config = mk::find_preset("tiny").config;
  const mk::Graph graph(config, {1, 8});
  const mk::Schedule schedule =
      mk::make_schedule(graph, mk::derive_dependencies(graph), mk::SchedulePolicy::kCostModel, 2);
  mk::CpuVmOptions options;
  options.max_delay_us = mk::kMaxCpuVmDelayUs + 1;
  EXPECT_THAT(error_of([&] {
                mk::run_cpu_vm(graph, schedule, mk::random_weights(config, 1), mk::ref::random_input(config, {1, 8}, 2),
                               options);
              }),
              HasSubstr("max_delay_us must be in [0, 100000]"));
}

TEST(HostileApi, FuzzSeedCorporaOfConfigsAndSchedulesFailAsTheirNamesSay) {
  // Seeds named valid-* or invalid-*: keep them honest, so that each fuzzer starts on both sides of its checks.
  const fs::path fuzz = fs::path(__FILE__).parent_path() / ".." / ".." / "fuzz";
  auto check_corpus = [&](const char* corpus, const std::function<void(const fs::path&)>& load) {
    int valid = 0, invalid = 0;
    for (const auto& entry : fs::directory_iterator(fuzz / corpus)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("valid-")) {
        ++valid;
        EXPECT_NO_THROW(load(entry.path())) << name
                                            << " (after a change of include/mk/tiles.h, remake the schedule "
                                               "seeds with fuzz/make_schedule_seeds.sh)";
      } else {
        ++invalid;
        EXPECT_THROW(load(entry.path()), mk::Error) << name;
      }
    }
    EXPECT_GE(valid, 2) << corpus;
    EXPECT_GE(invalid, 2) << corpus;
  };
  check_corpus("corpus_config", [](const fs::path& path) {
    const nlohmann::json json = mk::read_json_file(path, mk::kMaxConfigJsonBytes);
    if (json.contains("d_model")) {
      mk::model_config_from_json(json, path.string());
    } else {
      mk::model_config_from_hf_json(json, path.string());
    }
  });
  check_corpus("corpus_schedule", [](const fs::path& path) {
    const mk::LoadedSchedule loaded = mk::load_schedule(path);
    mk::verify_schedule(mk::Graph(loaded.config, loaded.shape), loaded.schedule);
  });
}

}  // namespace
