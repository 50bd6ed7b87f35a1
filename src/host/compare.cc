// Error metrics, the tolerance policy, and buffer-by-buffer bisection with per-op checks.
#include "mk/compare.h"

#include <fmt/format.h>

#include <cmath>

#include "mk/check.h"
#include "mk/program.h"

namespace mk {

namespace {

// An op's output stored as bf16 differs from its fp32 value by at most half a bf16 ulp, 2^-9 relative; relative L2
// errors of a correct op sit near 1e-3, an indexing or ordering bug lands at 1e-1 or above.
constexpr double kOpRelL2Tolerance = 1e-2;

}  // namespace

ErrorStats error_stats(const ref::Matrix& actual, const ref::Matrix& expected) {
  MK_CHECK(actual.rows == expected.rows && actual.cols == expected.cols, "comparing ({}, {}) with ({}, {})",
           actual.rows, actual.cols, expected.rows, expected.cols);
  ErrorStats stats;
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < actual.data.size(); ++i) {
    const double a = actual.data[i], e = expected.data[i];
    if (!std::isfinite(a)) {
      ++stats.nan_count;
      continue;
    }
    stats.max_abs_error = std::max(stats.max_abs_error, std::fabs(a - e));
    stats.max_abs_reference = std::max(stats.max_abs_reference, std::fabs(e));
    diff2 += (a - e) * (a - e);
    ref2 += e * e;
  }
  stats.rel_l2_error = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return stats;
}

TolerancePolicy check_tolerance(const ref::Matrix& engine_output, const ModelWeights& weights,
                                const ref::ModelInput& input) {
  const ref::Matrix fp32 = ref::forward(weights, input);
  const ref::Matrix bf16 = ref::forward(weights, input, {.round_activations_to_bf16 = true});
  return tolerance_of(engine_output, fp32, bf16);
}

TolerancePolicy tolerance_of(const ref::Matrix& engine_output, const ref::Matrix& fp32, const ref::Matrix& bf16) {
  TolerancePolicy policy;
  policy.engine = error_stats(engine_output, fp32);
  policy.bf16 = error_stats(bf16, fp32);
  // Rounding noise: one bf16 rounding of the output itself.
  policy.allowed = 2.0 * policy.bf16.rel_l2_error + 4e-3;
  policy.passed = policy.engine.nan_count == 0 && policy.engine.rel_l2_error <= policy.allowed;
  return policy;
}

std::string TolerancePolicy::describe() const {
  return fmt::format("rel L2 error vs fp32 reference {:.3e} (max abs {:.3e}), bf16-activation reference {:.3e}, "
                     "allowed {:.3e}{}: {}",
                     engine.rel_l2_error, engine.max_abs_error, bf16.rel_l2_error, allowed,
                     engine.nan_count ? fmt::format(", {} NaN", engine.nan_count) : "", passed ? "PASS" : "FAIL");
}

std::vector<BufferComparison> bisect_buffers(const Graph& graph, const ModelWeights& weights,
                                             const ref::ModelInput& input, const std::vector<ref::Matrix>& run,
                                             const std::vector<ref::Matrix>& reference_run, int until_layer) {
  const ModelConfig& c = graph.config();
  MK_CHECK(run.size() == graph.buffers().size() && reference_run.size() == graph.buffers().size(),
           "bisect: {} and {} buffers for a graph of {}", run.size(), reference_run.size(), graph.buffers().size());
  const ref::ModelOperands operands(weights, graph.shape().seq_len);
  // Every op reads the run's own buffers: each is checked alone, whatever the errors of the ops before it.
  CpuTile cpu{c, operands, input, graph.buffer_table(), {}};
  for (const ref::Matrix& buffer : run) cpu.buffers.push_back(&buffer);

  std::vector<BufferComparison> out;
  // In program order, so that the first failing buffer is the first op that fails.
  for_each_step(c, [&](const OpDescriptor& op, uint16_t layer) {
    const uint32_t b = graph.buffer_table().id(op.output(layer));
    const Buffer& buffer = graph.buffers()[b];
    // Steps outside the layers count as the layer of the buffer they write: the embedding's hidden[0] is layer 0's.
    const int32_t step_layer = layer == kNoLayer ? buffer.layer : int32_t(layer);
    if (until_layer >= 0 && (step_layer < 0 || step_layer > until_layer)) return;
    ref::Matrix expected(buffer.rows, buffer.cols);
    run_whole_step(op, graph.context(), cpu, layer, expected, false);
    BufferComparison row;
    row.buffer = buffer.name();
    row.against_reference = error_stats(run[b], reference_run[b]);
    row.op_alone = error_stats(run[b], expected);
    row.op_passed = row.op_alone.nan_count == 0 && row.op_alone.rel_l2_error <= kOpRelL2Tolerance;
    out.push_back(std::move(row));
  });
  return out;
}

std::string format_bisect(const std::vector<BufferComparison>& rows) {
  std::string text = fmt::format("{:<16} {:>12} {:>12} {:>12} {:>8}   {}\n", "buffer", "op rel L2", "op max abs",
                                 "vs ref rel L2", "NaN", "op check");
  for (const BufferComparison& row : rows) {
    text += fmt::format("{:<16} {:>12.3e} {:>12.3e} {:>12.3e} {:>8}   {}\n", row.buffer, row.op_alone.rel_l2_error,
                        row.op_alone.max_abs_error, row.against_reference.rel_l2_error, row.op_alone.nan_count,
                        row.op_passed ? "ok" : "FAIL");
  }
  return text;
}

}  // namespace mk
