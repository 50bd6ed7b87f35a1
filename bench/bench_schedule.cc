// Times the host side of a forward pass on one core: graph, dependency derivation, scheduling and verification,
// for a 70B-shaped model (80 layers, d_model 8192, 64 query / 8 kv heads, d_ff 28672) at 8 x 4096 tokens.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>

#include "mk/graph.h"
#include "mk/schedule.h"

int main(int argc, char** argv) {
  mk::ModelConfig config = mk::find_preset("llama-3.1-8b").config;
  config.name = "70b-shaped";
  config.n_layers = argc > 1 ? std::atoi(argv[1]) : 80;
  config.d_model = 8192;
  config.n_heads = 64;
  config.n_kv_heads = 8;
  config.d_ff = 28672;
  const mk::RunShape shape{8, 4096};
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  auto lap = [&](const char* what) {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - start).count();
    fmt::print("  {:<22} {:8.3f} s\n", what, seconds);
    start = now;
    return seconds;
  };
  fmt::print("{} layers, batch {} x seq {}:\n", config.n_layers, shape.batch, shape.seq_len);
  double total = 0;
  const mk::Graph graph(config, shape);
  total += lap("graph");
  const mk::Dependencies deps = mk::derive_dependencies(graph);
  total += lap("dependencies");
  const mk::Schedule schedule = mk::make_schedule(graph, deps, mk::SchedulePolicy::kCostModel, 132);
  total += lap("cost-model schedule");
  mk::verify_schedule(graph, schedule);
  total += lap("verify");
  fmt::print("  {:<22} {:8.3f} s for {} tasks, {} counters, {} waits ({:.0f} ns per task)\n", "total", total,
             graph.tasks().size(), deps.num_counters, deps.waits.size(), 1e9 * total / double(graph.tasks().size()));
  return 0;
}
