// Running the built `mk` as a child process from tests: its exit status (or the signal that killed it) and output.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace mk::testing_util {

struct MkResult {
  bool exited = false;  // false: killed by a signal, i.e. a crash
  int status = -1;      // the exit status when exited; 124 when the time limit killed it (a hang)
  std::string output;   // stdout and stderr together
};

// The binary under test: MK_TEST_BINARY when set (to run a suite against another build, say main's, and see its
// reproducers fail there), else the mk of this build.
inline std::string mk_binary() {
  const char* other = std::getenv("MK_TEST_BINARY");
  return other != nullptr && *other != '\0' ? other : MK_BINARY;
}

// Runs `<shell_prefix> mk <args>` through the shell, killed after `seconds`; args are quoted by the caller where
// needed. shell_prefix runs first in the same shell, e.g. "ulimit -v 1000000;".
inline MkResult run_mk(const std::string& args, const std::string& shell_prefix = "", int seconds = 30) {
  const std::string command = fmt::format("{} timeout {} '{}' {} 2>&1", shell_prefix, seconds, mk_binary(), args);
  MkResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed for " << command;
    return result;
  }
  std::array<char, 4096> buffer;
  size_t count;
  while ((count = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), count);
  const int status = ::pclose(pipe);
  // timeout reports a child killed by a signal as 128 + the signal.
  result.exited = WIFEXITED(status) && WEXITSTATUS(status) < 128;
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string quoted(const std::filesystem::path& path) { return fmt::format("'{}'", path.string()); }

}  // namespace mk::testing_util
