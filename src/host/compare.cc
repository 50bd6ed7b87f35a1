// Error metrics, the tolerance policy, and buffer-by-buffer bisection with per-op checks.
#include "mk/compare.h"

#include <fmt/format.h>

#include <cmath>

#include "mk/check.h"
#include "mk/parallel.h"

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
  const int64_t S = graph.shape().seq_len;
  const int64_t T = graph.shape().tokens();
  MK_CHECK(run.size() == graph.buffers().size() && reference_run.size() == graph.buffers().size(),
           "bisect: {} and {} buffers for a graph of {}", run.size(), reference_run.size(), graph.buffers().size());
  const ref::RopeTable rope = ref::make_rope_table(c, S);
  auto in = [&](BufferKind kind, int32_t layer = -1) -> const ref::Matrix& { return run[graph.buffer_id(kind, layer)]; };
  auto rows = [&](auto&& op) { parallel_for(T, [&](int64_t b, int64_t e) { op(ref::Range{b, e}); }); };

  std::vector<BufferComparison> out;
  for (size_t b = 0; b < graph.buffers().size(); ++b) {
    const Buffer& buffer = graph.buffers()[b];
    if (buffer.host_written) continue;
    const int32_t l = buffer.layer;
    if (until_layer >= 0 && (l > until_layer || l < 0)) continue;
    ref::Matrix expected(buffer.rows, buffer.cols);
    switch (buffer.kind) {
      case BufferKind::kHidden:
        if (l == 0) {
          rows([&](ref::Range r) { ref::embedding_rows(input.tokens, weights.embedding, expected, r); });
        } else {
          const LayerWeights& w = weights.layers[size_t(l - 1)];
          rows([&](ref::Range r) {
            ref::linear_residual_tile(in(BufferKind::kAct, l - 1), ref::StackedWeights(w.w_down, c.d_model, c.d_ff),
                                      in(BufferKind::kHiddenMid, l - 1), expected, r, {0, c.d_model});
          });
        }
        break;
      case BufferKind::kAttnNorm:
        rows([&](ref::Range r) {
          ref::rmsnorm_rows(in(BufferKind::kHidden, l), weights.layers[size_t(l)].attn_norm, c.rms_norm_eps, expected, r);
        });
        break;
      case BufferKind::kQkv: {
        const LayerWeights& w = weights.layers[size_t(l)];
        const ref::StackedWeights w_qkv = ref::qkv_weights(c, w);
        rows([&](ref::Range r) {
          ref::linear_tile(in(BufferKind::kAttnNorm, l), w_qkv, expected, r, {0, c.qkv_dim()});
          if (c.rope.type != RopeType::kNone) ref::rope_tile(c, rope, S, expected, r, {0, c.qkv_dim()});
        });
        break;
      }
      case BufferKind::kAttn:
        parallel_for(graph.shape().batch * c.n_heads, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i)
            ref::attention_tile(c, S, in(BufferKind::kQkv, l), expected, i / c.n_heads, {0, S}, i % c.n_heads);
        });
        break;
      case BufferKind::kHiddenMid:
        rows([&](ref::Range r) {
          ref::linear_residual_tile(in(BufferKind::kAttn, l),
                                    ref::StackedWeights(weights.layers[size_t(l)].wo, c.d_model, c.q_dim()),
                                    in(BufferKind::kHidden, l), expected, r, {0, c.d_model});
        });
        break;
      case BufferKind::kMlpNorm:
        rows([&](ref::Range r) {
          ref::rmsnorm_rows(in(BufferKind::kHiddenMid, l), weights.layers[size_t(l)].mlp_norm, c.rms_norm_eps, expected, r);
        });
        break;
      case BufferKind::kAct: {
        const LayerWeights& w = weights.layers[size_t(l)];
        rows([&](ref::Range r) {
          ref::swiglu_tile(in(BufferKind::kMlpNorm, l), ref::StackedWeights(w.w_gate, c.d_ff, c.d_model),
                           ref::StackedWeights(w.w_up, c.d_ff, c.d_model), expected, r, {0, c.d_ff});
        });
        break;
      }
      case BufferKind::kFinalNorm:
        rows([&](ref::Range r) {
          ref::rmsnorm_rows(in(BufferKind::kHidden, int32_t(c.n_layers)), weights.final_norm, c.rms_norm_eps, expected, r);
        });
        break;
      case BufferKind::kLogits:
        rows([&](ref::Range r) {
          ref::linear_tile(in(BufferKind::kFinalNorm), ref::StackedWeights(weights.lm_head_matrix(), c.vocab_size, c.d_model),
                           expected, r, {0, c.vocab_size});
        });
        break;
      case BufferKind::kTokens:
        continue;
    }
    BufferComparison row;
    row.buffer = buffer.name();
    row.against_reference = error_stats(run[b], reference_run[b]);
    row.op_alone = error_stats(run[b], expected);
    row.op_passed = row.op_alone.nan_count == 0 && row.op_alone.rel_l2_error <= kOpRelL2Tolerance;
    out.push_back(std::move(row));
  }
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
