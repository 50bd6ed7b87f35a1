// mk: the command-line tool. `mk --help` lists the subcommands; each has its own --help.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <functional>
#include <sstream>

#include "mk/check.h"
#include "mk/compare.h"
#include "mk/cpu_vm.h"
#include "mk/files.h"
#include "mk/gpu.h"
#include "mk/graph.h"
#include "mk/model_config.h"
#include "mk/model_io.h"
#include "mk/program.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/tokenizer.h"
#include "mk/trace.h"
#include "mk/weights.h"
#include "commands.h"
#include "generate.h"
#include "options.h"

namespace {

using mk::cli::BisectCommand;
using mk::cli::ExportCommand;
using mk::cli::InfoCommand;
using mk::cli::ModelOptions;
using mk::cli::RunCommand;
using mk::cli::ScheduleCommand;
using mk::cli::ScheduleOptions;
using mk::cli::TraceCommand;

using mk::human_bytes;
using mk::cli::CommandFiles;
using mk::cli::UsageError;

int run_info(const CLI::App& command, const ModelOptions& options, bool json) {
  mk::cli::check_seed_used(command, false, "mk info makes no weights or inputs");
  const mk::ModelConfig config = options.config();
  const mk::RunShape shape = options.shape();
  if (json) {
    fmt::print("{}\n", mk::forward_info_json(config, shape).dump(1));
    return 0;
  }
  const mk::ForwardCost cost = mk::forward_cost(config, shape);
  fmt::print("{}\n", mk::describe(config));
  if (shape.pass == mk::PassKind::kDecode) {
    // NOTE: 4.2 TB/s is the H200's measured HBM bandwidth; at small batch a decode step is weight streaming.
    fmt::print("decode step: batch {}, KV cache of {} positions per sequence\n", shape.batch, shape.max_context);
    fmt::print("weights read:       {} per step: {:.1f} us at 4.2 TB/s, the step's floor\n",
               human_bytes(cost.weights_read), cost.weights_read / 4.2e6);
  } else {
    fmt::print("forward pass: batch {} x seq {} = {} tokens\n", shape.batch, shape.seq_len, shape.tokens());
  }
  fmt::print("parameters:         {:.3f} M\n", double(cost.parameters) / 1e6);
  fmt::print("FLOPs:              {:.3f} GFLOP (causal attention counted half)\n", cost.flops / 1e9);
  fmt::print("minimum bytes:      {} (weights once, input, output and K/V once; decode: the whole cache read)\n",
             human_bytes(cost.min_bytes));
  fmt::print("arithmetic intensity: {:.1f} FLOP/byte\n", cost.flops / cost.min_bytes);
  fmt::print("memory needed:      {} weights (bf16) + {} activations (one buffer per layer and op, any KV cache)\n",
             human_bytes(cost.weight_bytes), human_bytes(cost.activation_bytes));
  fmt::print("engines need:       reference {}, cpu-vm {} of host memory; gpu {} of device memory ({} tasks)\n",
             human_bytes(cost.reference_host_bytes), human_bytes(cost.cpu_vm_host_bytes),
             human_bytes(cost.gpu_device_bytes), cost.tasks);
  return 0;
}

// "auto" is the gpu engine where a suitable GPU exists and the reference elsewhere, saying why.
std::string resolve_engine(const std::string& engine) {
  if (engine != "auto") return engine;
  const mk::GpuInfo gpu = mk::query_gpu();
  if (gpu.usable) return "gpu";
  fmt::print("gpu engine unavailable: {}; using the reference engine\n", gpu.reason);
  return "reference";
}

void print_checksum(const mk::ModelConfig& config, const mk::ref::Matrix& output) {
  double sum = 0, abs_sum = 0;
  size_t nans = 0;
  for (float value : output.data) {
    if (std::isnan(value)) ++nans;
    sum += value;
    abs_sum += std::fabs(value);
  }
  fmt::print("output {} ({} x {}) checksum: sum {:.6e}, mean |x| {:.6e}{}\n", config.has_lm_head ? "logits" : "hidden",
             output.rows, output.cols, sum, abs_sum / double(output.data.size()),
             nans ? fmt::format(", {} NaN", nans) : "");
}

// The files of `mk run`: --input, --output and --json.
struct RunFiles {
  std::string input, output, json;
};

// What `mk run` checks before it loads anything: flags its engine would ignore, and its files.
void check_run(const CLI::App& command, const ModelOptions& options, const ScheduleOptions& schedule_options,
               const std::string& requested_engine, const std::string& engine, const RunFiles& paths) {
  mk::cli::check_seed_used(command, options.model_dir.empty() || paths.input.empty(),
                           "--model gives the weights and --input the tokens");
  mk::cli::check_engine_flags(command, engine, requested_engine == "auto",
                              {{"--schedule", {"cpu-vm", "gpu"}},
                               {"--sms", {"cpu-vm", "gpu"}},
                               {"--policy", {"cpu-vm", "gpu"}},
                               {"--max-delay-us", {"cpu-vm"}},
                               {"--no-race-check", {"cpu-vm"}},
                               {"--iterations", {"gpu"}},
                               {"--launch-per-op", {"gpu"}},
                               {"--stall-timeout", {"gpu"}},
                               {"--skip-dependency-waits", {"gpu"}}});
  mk::cli::check_no_output_when_skipping_waits(command.count("--skip-dependency-waits") > 0, paths.output);
  CommandFiles files;
  options.add_inputs(files);
  schedule_options.add_inputs(files);
  files.given_input("--input", paths.input);
  files.output("--output", paths.output);
  files.output("--json", paths.json);
  files.check();
}

int run_forward(const RunCommand& run) {
  const CLI::App& command = *run.command;
  const ModelOptions& options = run.model;
  ScheduleOptions schedule_options = run.schedule;
  const std::string &requested_engine = run.engine, &input_path = run.input_path, &output_path = run.output_path,
                    &json_path = run.json_path;
  const bool launch_per_op = run.launch_per_op;
  const mk::ModelConfig config = options.config();
  const std::string engine = resolve_engine(requested_engine);
  check_run(command, options, schedule_options, requested_engine, engine, {input_path, output_path, json_path});
  // Memory is checked before a random input is made (its tokens alone can take gigabytes); a file's input is no
  // larger than the file, and its shape is known only once it is read.
  if (input_path.empty())
    mk::cli::check_engine_memory(engine, mk::forward_cost(config, options.shape()), options.shape());
  mk::ref::ModelInput input = input_path.empty() ? mk::ref::random_input(config, options.shape(), options.seed + 1)
                                                 : mk::load_model_input(input_path, config);
  if (!input_path.empty()) mk::cli::check_engine_memory(engine, mk::forward_cost(config, input.shape), input.shape);
  const mk::ModelWeights weights = options.weights(config);
  fmt::print("{}\n", mk::describe(config));
  fmt::print("engine {}: batch {} x seq {}\n", engine, input.shape.batch, input.shape.seq_len);

  mk::ref::Matrix output;
  double seconds = 0;
  auto timed = [&](auto&& body) {
    const auto start = std::chrono::steady_clock::now();
    body();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (engine == "reference") {
    timed([&] { output = mk::ref::forward(weights, input); });
  } else {
    const mk::Graph graph(config, input.shape);
    if (engine == "gpu") schedule_options.use_device_sm_count();
    const mk::Schedule schedule = schedule_options.make(graph);
    fmt::print("schedule: {} instructions on {} SMs ({}), verified\n", schedule.instructions.size(), schedule.num_sms,
               mk::schedule_policy_name(schedule.policy));
    if (engine == "cpu-vm") {
      // ScheduleOptions::make verified the schedule.
      timed([&] { output = mk::run_cpu_vm_unverified(graph, schedule, weights, input, run.vm).output(graph); });
    } else {
      // ScheduleOptions::make verified the schedule.
      mk::GpuEngine gpu(graph, schedule, weights,
                        {.stall_timeout_s = run.stall_timeout_s,
                         .verify = false,
                         .skip_dependency_waits = run.skip_dependency_waits});
      gpu.set_input(input);
      gpu.run();  // warm-up: module load and first-touch costs stay out of the time
      std::vector<float> times =
          launch_per_op ? gpu.time_runs_per_step(run.iterations) : gpu.time_runs(run.iterations);
      std::sort(times.begin(), times.end());
      seconds = times[times.size() / 2] / 1e3;
      fmt::print("gpu: median of {} {} (min {:.3f} ms, max {:.3f} ms)\n", times.size(),
                 launch_per_op ? "passes of one launch per op and layer" : "launches", times.front(), times.back());
      output = gpu.output();
    }
  }
  const double flops = mk::forward_cost(config, input.shape).flops;
  if (seconds < 0.1) {
    fmt::print("time: {:.3f} ms ({:.1f} TFLOP/s)\n", seconds * 1e3, flops / seconds / 1e12);
  } else {
    fmt::print("time: {:.3f} s ({:.2f} GFLOP/s)\n", seconds, flops / seconds / 1e9);
  }
  if (run.skip_dependency_waits) {
    fmt::print("output: not the model's (--skip-dependency-waits), no checksum\n");
  } else {
    print_checksum(config, output);
  }
  if (!output_path.empty()) {
    mk::save_model_output(output_path, config.has_lm_head ? "logits" : "hidden", output, input.shape);
    fmt::print("wrote {}\n", output_path);
  }
  if (!json_path.empty()) {
    const mk::ForwardCost cost = mk::forward_cost(config, input.shape);
    const nlohmann::json result = {{"engine", engine},
                                   {"model", config.name},
                                   {"batch", input.shape.batch},
                                   {"seq_len", input.shape.seq_len},
                                   {"d_model", config.d_model},
                                   {"n_layers", config.n_layers},
                                   {"d_ff", config.d_ff},
                                   {"n_heads", config.n_heads},
                                   {"launch_per_op", launch_per_op},
                                   {"skip_dependency_waits", run.skip_dependency_waits},
                                   {"ms", seconds * 1e3},
                                   {"flops", cost.flops},
                                   {"tflops", cost.flops / seconds / 1e12}};
    mk::write_file(json_path, result.dump() + "\n");
  }
  return 0;
}

int run_bisect(const ModelOptions& options, ScheduleOptions schedule_options, int until_layer) {
  const mk::ModelConfig config = options.config();
  // A layer past the model's compared them all, as -1 does: a typo would pass for a bisection up to it.
  if (until_layer < -1 || until_layer >= config.n_layers)
    throw UsageError(fmt::format("--until-layer {}: must be -1 (all) or one of the model's {} layers, 0 to {}",
                                 until_layer, config.n_layers, config.n_layers - 1));
  const mk::RunShape shape = options.shape();
  const mk::ForwardCost cost = mk::forward_cost(config, shape);
  for (const char* engine : {"gpu", "cpu-vm"}) mk::cli::check_engine_memory(engine, cost, shape);
  const mk::ModelWeights weights = options.weights(config);
  const mk::ref::ModelInput input = mk::ref::random_input(config, shape, options.seed + 1);
  const mk::Graph graph(config, shape);
  schedule_options.use_device_sm_count();
  const mk::Schedule schedule = schedule_options.make(graph);
  fmt::print("{}\nbatch {} x seq {}: gpu against cpu-vm, buffer by buffer{}\n", mk::describe(config), shape.batch,
             shape.seq_len, until_layer >= 0 ? fmt::format(", up to layer {}", until_layer) : "");
  mk::GpuEngine gpu(graph, schedule, weights, {.verify = false});  // ScheduleOptions::make verified it
  gpu.set_input(input);
  gpu.run();
  // The cpu-vm runs the model as the gpu holds it, each norm's weight folded into the matrices after it (the gpu's
  // norm buffers hold x / rms): a second copy of the weights on the host.
  const mk::ModelWeights folded = mk::fold_norm_weights(weights);
  const mk::CpuVmRun reference = mk::run_cpu_vm_unverified(graph, schedule, folded, input, {});
  const auto rows = mk::bisect_buffers(graph, folded, input, gpu.buffers(), reference.buffers, until_layer);
  fmt::print("{}", mk::format_bisect(rows));
  for (const mk::BufferComparison& row : rows) {
    if (!row.op_passed) {
      fmt::print("first failing buffer: {}\n", row.buffer);
      return 1;
    }
  }
  fmt::print("every op within tolerance\n");
  return 0;
}

int run_schedule(const CLI::App& command, const ModelOptions& options, const ScheduleOptions& schedule_options,
                 bool explain, const std::string& out_path) {
  mk::cli::check_seed_used(command, false, "mk schedule makes no weights or inputs");
  const mk::ModelConfig config = options.config();
  const mk::RunShape shape = options.shape();
  CommandFiles files;
  options.add_inputs(files);
  schedule_options.add_inputs(files);
  files.output("--out", out_path);
  files.check();
  const auto start = std::chrono::steady_clock::now();
  const mk::Graph graph(config, shape);
  const mk::Schedule schedule = schedule_options.make(graph);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{}\n", mk::describe(config));
  fmt::print("{}: {} tasks, scheduled and verified in {:.3f} s\n", mk::describe(shape), graph.tasks().size(), seconds);
  const mk::ScheduleEstimate estimate = mk::estimate_schedule(graph, schedule);
  if (explain) {
    fmt::print("{}", mk::explain_schedule(graph, schedule, estimate));
  } else {
    fmt::print("policy {}: {} SMs, estimated makespan {:.1f} us, idle {:.1f}% (--explain for per-SM detail)\n",
               mk::schedule_policy_name(schedule.policy), schedule.num_sms, estimate.makespan_ns / 1e3,
               100.0 * estimate.idle_fraction());
  }
  if (!out_path.empty()) {
    mk::save_schedule(out_path, graph, schedule);
    fmt::print("wrote {}\n", out_path);
  }
  return 0;
}

// The absolute path of `path` without a trailing separator ("m/" as "m"), whether or not it exists.
std::filesystem::path canonical_directory(const std::filesystem::path& path) {
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path);
  return canonical.has_filename() ? canonical : canonical.parent_path();
}

// Whether `path` is `directory` or lies inside it, both canonical.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& directory) {
  return std::mismatch(directory.begin(), directory.end(), path.begin(), path.end()).first == directory.end();
}

int run_export(const CLI::App& command, const ModelOptions& options, const std::string& out_dir,
               const std::string& input_path) {
  mk::cli::check_seed_used(command, options.model_dir.empty() || !input_path.empty(),
                           "--model gives the weights and no --input is written");
  const mk::ModelConfig config = options.config();
  CommandFiles files;
  options.add_inputs(files);
  // The directory is created if need be; its files must not be inputs, nor --input one of them.
  for (const char* name : {"config.json", "mk_config.json", "model.safetensors"})
    files.output(fmt::format("--out ({})", name), (std::filesystem::path(out_dir) / name).string());
  files.output("--input", input_path);
  mk::check_distinct(files.outputs, files.inputs);
  if (!input_path.empty()) {
    const std::filesystem::path out = canonical_directory(out_dir), input = canonical_directory(input_path);
    // --out itself, or a directory it would be created in: a directory once the model is written, too late to refuse.
    MK_CHECK(!is_within(out, input), "--input {}: is --out {} or a directory holding it; give a file name", input_path,
             out_dir);
    // --input may go into a directory the export creates (--out r/m --input r/in.safetensors).
    if (!is_within(out, input.parent_path()) || std::filesystem::is_directory(input_path))
      mk::check_output_path(files.outputs.back());
  }
  const double input_bytes =
      input_path.empty() ? 0.0
                         : 4.0 * double(options.shape().tokens()) * double(config.has_embedding ? 1 : config.d_model);
  mk::check_memory(2.0 * double(mk::parameter_count(config)) + input_bytes, double(mk::host_memory_bytes()),
                   "the model's weights and input", "host memory");
  const std::string config_file = mk::save_model(out_dir, options.weights(config));
  fmt::print("wrote {}/{} and model.safetensors ({})\n", out_dir, config_file, mk::describe(config));
  if (!input_path.empty()) {
    mk::save_model_input(input_path, mk::ref::random_input(config, options.shape(), options.seed + 1), config);
    fmt::print("wrote {}\n", input_path);
  }
  return 0;
}

// The largest text `mk tokenize --file` reads; refused, not read, beyond it.
constexpr uint64_t kMaxTextFileBytes = uint64_t(1) << 30;

// `mk tokenize` and `mk detokenize`: text to token ids and back with a model's tokenizer.json.
struct TextCommands {
  std::string tokenizer_path, text, file, ids;
  bool no_special = false, split_special = false, skip_special = false;
  CLI::App* tokenize = nullptr;
  CLI::App* detokenize = nullptr;

  void add(CLI::App& app) {
    const char* tokenizer_help = "tokenizer.json, or a model directory holding one (and its config files)";
    tokenize = app.add_subcommand("tokenize", "print the token ids of a text, separated by spaces");
    tokenize->add_option("--tokenizer", tokenizer_path, tokenizer_help)->required()->check(mk::cli::kNonEmpty);
    CLI::Option_group* source = tokenize->add_option_group("text", "where the text comes from (one of)");
    source->add_option("--text", text, "the text (UTF-8)");
    source->add_option("--file", file, "a file holding the text (UTF-8, taken byte for byte)")
        ->check(mk::cli::kNonEmpty);
    source->require_option(1);
    tokenize->add_flag("--no-special", no_special, "add no special tokens (no BOS/EOS), as add_special_tokens=False");
    tokenize->add_flag("--split-special", split_special,
                       "tokenize special-token text in the input (say <|eot_id|>) as plain text");
    detokenize = app.add_subcommand("detokenize", "print the text of token ids as it is, with no newline added");
    detokenize->add_option("--tokenizer", tokenizer_path, tokenizer_help)->required()->check(mk::cli::kNonEmpty);
    detokenize->add_option("--ids", ids, "token ids separated by commas or spaces")->required();
    detokenize->add_flag("--skip-special", skip_special, "leave special tokens (BOS, EOS, ...) out of the text");
  }

  bool given() const { return *tokenize || *detokenize; }

  int run() const { return *tokenize ? run_tokenize() : run_detokenize(); }

  int run_tokenize() const {
    const mk::Tokenizer tokenizer = mk::Tokenizer::load(tokenizer_path);
    std::string input = text;
    if (!file.empty()) input = mk::read_file(file, kMaxTextFileBytes);
    std::vector<int32_t> token_ids;
    try {
      token_ids = tokenizer.encode(input, {.add_special_tokens = !no_special, .split_special_tokens = split_special});
    } catch (const mk::Error& error) {
      throw mk::Error(file.empty() ? error.what() : fmt::format("{}: {}", file, error.what()));
    }
    std::string line;
    for (const int32_t id : token_ids) line += fmt::format("{}{}", line.empty() ? "" : " ", id);
    fmt::print("{}\n", line);
    return 0;
  }

  int run_detokenize() const {
    const std::vector<int32_t> token_ids = mk::cli::parse_token_ids(ids, "--ids");
    const std::string decoded = mk::Tokenizer::load(tokenizer_path).decode(token_ids, skip_special);
    std::fwrite(decoded.data(), 1, decoded.size(), stdout);
    return 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"megakernel: a LLaMA-family forward pass as one persistent kernel on Hopper"};
  app.require_subcommand(1);
  InfoCommand info;
  RunCommand run;
  ScheduleCommand schedule;
  BisectCommand bisect;
  TraceCommand trace;
  ExportCommand export_model;
  mk::cli::GenerateCommand generate;
  const std::pair<CLI::App*, std::function<int()>> commands[] = {
      {info.add(app), [&] { return run_info(*info.command, info.model, info.json); }},
      {run.add(app),
       [&] {
         return run_forward(run);
       }},
      {schedule.add(app),
       [&] {
         return run_schedule(*schedule.command, schedule.model, schedule.schedule, schedule.explain, schedule.out);
       }},
      {bisect.add(app), [&] { return run_bisect(bisect.model, bisect.schedule, bisect.until_layer); }},
      {trace.add(app),
       [&] {
         return mk::cli::run_trace(trace);
       }},
      {export_model.add(app),
       [&] {
         return run_export(*export_model.command, export_model.model, export_model.dir, export_model.input_path);
       }},
      {generate.add(app), [&] { return generate.run(); }},
  };
  TextCommands text_commands;
  text_commands.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help exits 0; every usage error exits 2, bad input found later exits 1.
    return app.exit(error) == 0 ? 0 : 2;
  }
  try {
    for (const auto& [command, body] : commands)
      if (*command) return body();
    if (text_commands.given()) return text_commands.run();
  } catch (const mk::cli::UsageError& error) {
    fmt::print(stderr, "mk: error: {}\nRun with --help for more information.\n", mk::printable(error.what()));
    return 2;
  } catch (const mk::Error& error) {
    // Escaped: messages quote names and values read from files, which must not reach the terminal raw.
    fmt::print(stderr, "mk: error: {}\n", mk::printable(error.what()));
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "mk: error: out of memory (the figures of `mk info` say what a run needs)\n");
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "mk: unexpected error: {}\n", mk::printable(error.what()));
    return 1;
  }
  return 0;
}
