// Helpers shared by the CPU tests: the message of an expected mk::Error, scratch directories, byte views.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "mk/check.h"

namespace mk::testing_util {

// Runs body, which must throw mk::Error, and returns the error's message (a test failure otherwise).
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const mk::Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected mk::Error, got another exception: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected mk::Error, nothing was thrown";
  return "";
}

// A unique scratch directory for the running test, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("mk_test_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(T)};
}

}  // namespace mk::testing_util
