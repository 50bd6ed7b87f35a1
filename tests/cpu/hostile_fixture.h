// The fixture of the hostile-input tests (issue 12): the tiny model exported as a user's files, helpers to edit and
// write hostile ones, and the one failure mode every reproducer asserts.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "mk_process.h"
#include "test_util.h"

namespace mk::testing_util {

namespace fs = std::filesystem;

inline std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file whose header is `header` verbatim, followed by `data`.
inline std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return bytes + header + data;
}

// The failure mode every test asserts: an exit (no signal, no time limit), the status, the message.
inline void expect_failure(const MkResult& result, int status, const std::string& message) {
  ASSERT_TRUE(result.exited) << "killed by a signal or the time limit:\n" << result.output;
  EXPECT_EQ(result.status, status) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr(message));
  EXPECT_THAT(result.output, ::testing::Not(::testing::HasSubstr("unexpected error")));
}

// The fixture T: the tiny model exported to m/ with its input in.safetensors, in a scratch directory.
class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    const MkResult result =
        run_mk(fmt::format("export --preset tiny --out {} --input {}", quoted(model()), quoted(input())));
    ASSERT_EQ(result.status, 0) << result.output;
  }
  fs::path model() const { return dir_.path() / "m"; }
  fs::path input() const { return dir_.path() / "in.safetensors"; }
  fs::path path(const std::string& name) const { return dir_.path() / name; }
  std::string run_model(const std::string& args) const {
    return fmt::format("run --model {} --input {} --engine reference {}", quoted(model()), quoted(input()), args);
  }
  // A copy of the model whose config.json `edit` changed.
  fs::path model_with(const std::function<void(nlohmann::json&)>& edit) const {
    const fs::path copy = path("edited");
    fs::create_directories(copy);
    fs::copy_file(model() / "model.safetensors", copy / "model.safetensors", fs::copy_options::overwrite_existing);
    nlohmann::json config = nlohmann::json::parse(read_bytes(model() / "config.json"));
    edit(config);
    write_bytes(copy / "config.json", config.dump());
    return copy;
  }

 private:
  TempDir dir_;
};

}  // namespace mk::testing_util
