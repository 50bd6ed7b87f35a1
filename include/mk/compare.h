// Comparing engines: error metrics, the tolerance policy, and buffer-by-buffer bisection of a run against the
// reference, with every op also checked alone on the run's own inputs.
#pragma once

#include <string>
#include <vector>

#include "mk/graph.h"
#include "mk/reference.h"
#include "mk/weights.h"

namespace mk {

struct ErrorStats {
  double max_abs_error = 0;
  double rel_l2_error = 0;  // ||a - b|| / ||b||
  double max_abs_reference = 0;
  size_t nan_count = 0;     // NaN or inf in a
};
ErrorStats error_stats(const ref::Matrix& actual, const ref::Matrix& expected);

// ARCHITECTURE.md section 6: an engine's error against the fp32 reference may be at most twice that of a bf16
// computation of the same model (activations rounded to bf16 after every op), plus rounding noise; NaN never passes.
struct TolerancePolicy {
  ErrorStats engine;    // engine vs fp32 reference
  ErrorStats bf16;      // bf16-activation reference vs fp32 reference
  double allowed = 0;   // bound on engine.rel_l2_error
  bool passed = false;
  std::string describe() const;
};
TolerancePolicy check_tolerance(const ref::Matrix& engine_output, const ModelWeights& weights,
                                const ref::ModelInput& input);
// The same policy for outputs computed elsewhere: the engine's, the fp32 reference's and the bf16-activation
// reference's (decode: the rows of forward passes that the decode steps reproduce).
TolerancePolicy tolerance_of(const ref::Matrix& engine_output, const ref::Matrix& fp32, const ref::Matrix& bf16);

struct BufferComparison {
  std::string buffer;
  ErrorStats against_reference;  // the run's buffer vs the fp32 reference's (errors accumulate along the model)
  ErrorStats op_alone;           // vs the buffer's op recomputed in fp32 from the run's own inputs
  bool op_passed = false;        // op_alone within a bf16 output's rounding
};

// Compares every buffer of `run` (as GpuEngine::buffers or CpuVmRun::buffers return them) with `reference_run` (the
// cpu-vm's, fp32), up to and including layer `until_layer` (-1: all, including final norm and logits).
std::vector<BufferComparison> bisect_buffers(const Graph& graph, const ModelWeights& weights,
                                             const ref::ModelInput& input, const std::vector<ref::Matrix>& run,
                                             const std::vector<ref::Matrix>& reference_run, int until_layer = -1);
std::string format_bisect(const std::vector<BufferComparison>& rows);

}  // namespace mk
