// Checks mk makes before any work: flags that would be silently ignored, the files a command reads and writes, and
// the memory a run needs. Each failure is one message naming the flag, file or figure.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/files.h"
#include "mk/gpu.h"
#include "mk/limits.h"
#include "mk/program.h"

namespace mk::cli {

// A usage error found after parsing (a flag that cannot apply): mk exits 2, as for errors CLI11 finds.
class UsageError : public mk::Error {
 public:
  using mk::Error::Error;
};

// A flag some engines use and others would ignore.
struct EngineFlag {
  const char* flag;
  std::vector<std::string> engines;
};

// Refuses each flag of `flags` given on `command` when `engine` does not use it.
inline void check_engine_flags(const CLI::App& command, const std::string& engine, bool chosen_by_auto,
                               const std::vector<EngineFlag>& flags) {
  for (const EngineFlag& flag : flags) {
    if (command.count(flag.flag) == 0 ||
        std::find(flag.engines.begin(), flag.engines.end(), engine) != flag.engines.end())
      continue;
    throw UsageError(fmt::format("{} applies to --engine {} only, and the engine is {}{}", flag.flag,
                                 fmt::join(flag.engines, " or "), engine,
                                 chosen_by_auto ? " (chosen by --engine auto; give --engine)" : ""));
  }
}

// --seed seeds random weights and random inputs; with neither it would be ignored.
inline void check_seed_used(const CLI::App& command, bool used, const char* why_not) {
  if (command.count("--seed") > 0 && !used) throw UsageError(fmt::format("--seed has nothing to seed: {}", why_not));
}

// The files one command reads and writes: every output is checked (its directory exists, it is not an input or
// another output) before the command does any work, so that no pass ends in a write that fails or destroys a file.
struct CommandFiles {
  std::vector<mk::NamedPath> inputs;
  std::vector<mk::NamedPath> outputs;
  std::vector<std::string> opened;  // inputs given by flag: opened up front, so that a FIFO or loop fails first

  void input(std::string role, const std::string& path) {
    if (!path.empty()) inputs.push_back({std::move(role), path});
  }
  void given_input(std::string role, const std::string& path) {
    input(std::move(role), path);
    if (!path.empty()) opened.push_back(path);
  }
  void output(std::string role, const std::string& path) {
    if (!path.empty()) outputs.push_back({std::move(role), path});
  }
  void check() const {
    for (const std::string& path : opened) mk::InputFile file(path);
    for (const mk::NamedPath& out : outputs) mk::check_output_path(out);
    mk::check_distinct(outputs, inputs);
  }
};

// Refuses a run whose engine would not fit in this host's memory (or the device's), before anything is allocated:
// otherwise it ends, late, in std::bad_alloc or the OOM killer.
inline void check_engine_memory(const std::string& engine, const mk::ForwardCost& cost, const mk::RunShape& shape) {
  const double host = double(mk::host_memory_bytes());
  const std::string what = fmt::format("the {} engine at batch {} x seq {}", engine, shape.batch, shape.seq_len);
  if (engine == "reference") mk::check_memory(cost.reference_host_bytes, host, what, "host memory");
  if (engine == "cpu-vm") mk::check_memory(cost.cpu_vm_host_bytes, host, what, "host memory");
  if (engine == "gpu") {
    mk::check_memory(cost.gpu_host_bytes, host, what, "host memory");
    const mk::GpuInfo gpu = mk::query_gpu();
    if (gpu.usable) mk::check_memory(cost.gpu_device_bytes, double(gpu.memory_bytes), what, "device memory");
  }
}

}  // namespace mk::cli
