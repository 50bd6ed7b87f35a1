// `mk trace`: one forward pass traced on the gpu engine (or the cpu-vm), its per-SM timeline written as Chrome trace
// JSON and its summary printed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "mk/cpu_vm.h"
#include "mk/files.h"
#include "mk/gpu.h"
#include "mk/graph.h"
#include "mk/model_config.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/trace.h"
#include "mk/weights.h"
#include "commands.h"
#include "guards.h"
#include "options.h"

namespace mk::cli {

int run_trace(const TraceCommand& trace_command) {
  const CLI::App& command = *trace_command.command;
  const ModelOptions& options = trace_command.model;
  ScheduleOptions schedule_options = trace_command.schedule;
  const std::string &requested_engine = trace_command.engine, &out_path = trace_command.out,
                    &summary_path = trace_command.summary;
  const int overhead_launches = trace_command.overhead_launches;
  const mk::ModelConfig config = options.config();
  const mk::RunShape shape = options.shape();
  std::string engine = requested_engine;
  if (engine == "auto") {
    const mk::GpuInfo gpu = mk::query_gpu();
    engine = gpu.usable ? "gpu" : "cpu-vm";
    if (!gpu.usable) fmt::print("gpu engine unavailable: {}; tracing the cpu-vm\n", gpu.reason);
  }
  mk::cli::check_engine_flags(command, engine, requested_engine == "auto",
                              {{"--overhead", {"gpu"}}, {"--skip-dependency-waits", {"gpu"}}});
  CommandFiles files;
  options.add_inputs(files);
  schedule_options.add_inputs(files);
  files.output("--out", out_path);
  files.output("--summary", summary_path);
  files.check();
  mk::cli::check_engine_memory(engine, mk::forward_cost(config, shape), shape);
  const mk::ModelWeights weights = options.weights(config);
  const mk::ref::ModelInput input = mk::ref::random_input(config, shape, options.seed + 1);
  const mk::Graph graph(config, shape);
  if (engine == "gpu") schedule_options.use_device_sm_count();
  const mk::Schedule schedule = schedule_options.make(graph);
  fmt::print("{}\nbatch {} x seq {}, engine {}, {} instructions on {} SMs\n", mk::describe(config), shape.batch,
             shape.seq_len, engine, schedule.instructions.size(), schedule.num_sms);
  mk::Trace trace;
  if (engine == "gpu") {
    // ScheduleOptions::make verified the schedule.
    mk::GpuEngine gpu(graph, schedule, weights,
                      {.verify = false, .skip_dependency_waits = trace_command.skip_dependency_waits});
    gpu.set_input(input);
    gpu.run();
    trace = gpu.run_traced();
    if (overhead_launches > 0) {
      // Alternate plain and traced launches so that clock drift affects both alike.
      std::vector<float> plain, traced;
      for (int i = 0; i < overhead_launches; ++i) {
        plain.push_back(gpu.time_runs(1).at(0));
        traced.push_back(float(gpu.run_traced().launch_ns / 1e6));
      }
      std::sort(plain.begin(), plain.end());
      std::sort(traced.begin(), traced.end());
      const float plain_ms = plain[plain.size() / 2], traced_ms = traced[traced.size() / 2];
      fmt::print("tracing overhead: median {:.4f} ms traced vs {:.4f} ms plain over {} launches each: {:+.2f}%\n",
                 traced_ms, plain_ms, overhead_launches, 100.0 * (traced_ms / plain_ms - 1.0));
    }
  } else {
    mk::CpuVmOptions vm_options;
    vm_options.record_trace = true;
    vm_options.detect_races = false;
    trace = mk::run_cpu_vm_unverified(graph, schedule, weights, input, vm_options).trace;
  }
  mk::write_file(out_path, mk::trace_to_chrome_json(graph, trace));
  fmt::print("wrote {} (open it in ui.perfetto.dev)\n", out_path);
  const mk::TraceSummary summary = mk::summarize_trace(graph, schedule, trace);
  if (!summary_path.empty()) mk::write_file(summary_path, mk::trace_summary_json(summary).dump(1) + "\n");
  if (trace_command.skip_dependency_waits)
    fmt::print("--skip-dependency-waits: no wait held a tile back, so the waits table's inputs may be published after "
               "the tiles that read them (negative hops)\n");
  fmt::print("{}", mk::format_trace_summary(graph, summary, trace));
  return 0;
}

}  // namespace mk::cli
