// The options of mk's model subcommands (info, run, schedule, bisect, trace, export), each registered on the app by
// its add(); tools/mk.cc runs them.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "mk/cpu_vm.h"
#include "mk/gpu.h"
#include "options.h"

namespace mk::cli {

struct InfoCommand {
  ModelOptions model;
  bool json = false;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command = app.add_subcommand("info", "print a model's shape, parameter count, FLOPs and memory");
    model.add_to(*command);
    model.add_pass_to(*command);
    command->add_flag("--json", json, "print one JSON object: config, shape, parameters, FLOPs and bytes");
    return command;
  }
};

struct RunCommand {
  ModelOptions model;
  ScheduleOptions schedule;
  mk::CpuVmOptions vm;
  std::string engine = "auto", input_path, output_path, json_path;
  int iterations = 20;
  bool launch_per_op = false;
  bool skip_dependency_waits = false;
  double stall_timeout_s = mk::kDefaultStallTimeoutS;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command = app.add_subcommand("run", "run one forward pass and print its time and an output checksum");
    model.add_to(*command);
    schedule.add_to(*command);
    command->add_option("--engine", engine, "auto (gpu where possible) | gpu | cpu-vm | reference")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "gpu", "cpu-vm", "reference"}));
    command->add_option("--max-delay-us", vm.max_delay_us, "cpu-vm: random delay before each instruction")
        ->capture_default_str()
        ->check(CLI::Range(0, mk::kMaxCpuVmDelayUs));
    command->add_flag("!--no-race-check", vm.detect_races, "cpu-vm: skip the happens-before race detector");
    // The input fixes batch and seq: --batch and --seq would be ignored.
    command
        ->add_option("--input", input_path, "safetensors with 'tokens' (batch, seq) or 'hidden' (batch, seq, d_model)")
        ->check(kNonEmpty)
        ->excludes(command->get_option("--batch"))
        ->excludes(command->get_option("--seq"));
    command->add_option("--output", output_path, "write the output (logits or hidden states, F32) as safetensors")
        ->check(kNonEmpty);
    command->add_option("--iterations", iterations, "gpu: timed launches after one warm-up (the median is reported)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    command->add_option("--json", json_path, "write the timing and shape as one JSON object to this file")
        ->check(kNonEmpty);
    add_stall_timeout_option(*command, stall_timeout_s);
    command->add_flag("--launch-per-op", launch_per_op,
                      "gpu: time the pass as one kernel launch per op and layer instead of one launch (an ablation: "
                      "what the single launch buys)");
    add_skip_dependency_waits_flag(*command, skip_dependency_waits);
    return command;
  }
};

struct ScheduleCommand {
  ModelOptions model;
  ScheduleOptions schedule;
  bool explain = false;
  std::string out;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command =
        app.add_subcommand("schedule", "build, verify and explain the per-SM instruction lists of a forward pass");
    model.add_to(*command);
    model.add_pass_to(*command);
    schedule.add_to(*command);
    command->add_flag("--explain", explain, "per-SM load and instruction count, makespan, idle, critical path");
    command->add_option("--out", out, "write the schedule to this file")->check(kNonEmpty);
    return command;
  }
};

struct BisectCommand {
  ModelOptions model;
  ScheduleOptions schedule;
  int until_layer = -1;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command = app.add_subcommand(
        "bisect", "run gpu and cpu-vm on one input and compare every intermediate buffer, each op also alone");
    model.add_to(*command);
    schedule.add_to(*command);
    command->add_option("--until-layer", until_layer, "compare the ops of layers up to this one only (-1: all)")
        ->capture_default_str()
        ->check(kNonEmpty);
    return command;
  }
};

struct TraceCommand {
  ModelOptions model;
  ScheduleOptions schedule;
  std::string engine = "auto", out = "trace.json", summary;
  int overhead_launches = 0;
  bool skip_dependency_waits = false;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command = app.add_subcommand("trace",
                                 "record a per-SM timeline of one forward pass (Chrome trace JSON) and summarize it");
    model.add_to(*command);
    schedule.add_to(*command);
    command->add_option("--engine", engine, "auto (gpu where possible, else cpu-vm) | gpu | cpu-vm")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "gpu", "cpu-vm"}));
    command->add_option("--out", out, "trace file to write")->capture_default_str()->check(kNonEmpty);
    command->add_option("--summary", summary, "also write the summary's per-op phases as JSON, for scripts")
        ->check(kNonEmpty);
    command->add_option("--overhead", overhead_launches, "gpu: also measure tracing overhead over N launch pairs")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000));
    add_skip_dependency_waits_flag(*command, skip_dependency_waits);
    return command;
  }
};

// One traced forward pass (tools/trace_command.cc).
int run_trace(const TraceCommand& trace_command);

struct ExportCommand {
  ModelOptions model;
  std::string dir, input_path;
  CLI::App* command = nullptr;
  CLI::App* add(CLI::App& app) {
    command = app.add_subcommand("export", "write a model (random weights for a preset) as a Hugging Face directory");
    model.add_to(*command);
    command->add_option("--out", dir, "directory to write config.json and model.safetensors to")
        ->required()
        ->check(kNonEmpty);
    auto* input = command->add_option("--input", input_path, "also write a random input of the run shape to this file")
                      ->check(kNonEmpty);
    // The run shape is the input's: without --input, --batch and --seq would be ignored.
    command->get_option("--batch")->needs(input);
    command->get_option("--seq")->needs(input);
    return command;
  }
};

}  // namespace mk::cli
