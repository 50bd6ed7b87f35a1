// The gpu engine: the schedule run by the megakernel on an sm_90 GPU. Declared in every build; a build without
// CUDA, a machine without a GPU, or a GPU other than Hopper gets a clear reason instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mk/graph.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/trace.h"
#include "mk/weights.h"

namespace mk {

struct GpuInfo {
  bool usable = false;
  std::string reason;  // why not, when not usable
  std::string name;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  size_t memory_bytes = 0;
};
GpuInfo query_gpu();  // never throws

// The stall timeout's default and bounds, in seconds: at most an hour (the host's watchdog waits twice the timeout and
// more before it gives up on a launch), at least a millisecond (it becomes a count of nanoseconds).
inline constexpr double kDefaultStallTimeoutS = 5.0;
inline constexpr double kMinStallTimeoutS = 1e-3;
inline constexpr double kMaxStallTimeoutS = 3600.0;

struct GpuOptions {
  // A counter wait longer than this (a shared-memory wait: an eighth more) aborts the launch with a report.
  double stall_timeout_s = kDefaultStallTimeoutS;
  bool verify = true;            // false only for tests that feed a deliberately broken schedule
  // Prefill and decode: device memory of the GPU holding every layer's KV cache, stacked as the buffer table stacks
  // kv_cache (GpuKvCache), used instead of a cache of the engine's own so that passes share it. Null: the engine
  // allocates its own.
  void* kv_cache = nullptr;
  // An engine of the same model whose device weights this one uses instead of uploading its own (a decoder's
  // prefill engines use its decode engine's); it must outlive this one, and its RoPE table cover this pass.
  const class GpuEngine* weights_of = nullptr;
  // A diagnostic: every wait on another SM's counter passes at once, so that each SM runs its list back to back on
  // whatever its inputs hold. What the launch then takes, against the real one, is what the dependency waits cost;
  // its output is not the model's. Memory-safe: the indices the kernel reads (tokens, positions) are set before the
  // launch, and the counters still count, so later launches wait as usual.
  bool skip_dependency_waits = false;
};

class GpuEngine {
 public:
  // Uploads weights and schedule, allocates activations. The graph must outlive the engine.
  GpuEngine(const Graph& graph, const Schedule& schedule, const ModelWeights& weights, const GpuOptions& options = {});
  ~GpuEngine();
  GpuEngine(const GpuEngine&) = delete;
  GpuEngine& operator=(const GpuEngine&) = delete;

  void set_input(const ref::ModelInput& input);
  // The input straight from device memory of the engine's GPU (device 0), for callers whose tensors live there (the
  // Python package, through DLPack): no copy through the host. `data` holds the engine's input layout: int32 token
  // ids (batch * seq_len) with an embedding, bf16 hidden states (batch * seq_len, d_model) without. Token ids are not
  // range-checked (that would take them to the host): the caller checks them. Returns when the copy is done.
  void set_input_device(const void* data);
  // One forward pass (one launch). Throws mk::Error naming SM, instruction, task and counter if the kernel reports a
  // stall; the engine is unusable after that.
  void run();
  // `steps` (at most kMaxStepsPerSync) decode steps in one wait for the GPU, each after the first fed the previous
  // one's sampled ids at the next positions on the device (greedy decoding: no host in between); the sampled ids of
  // every step, step after step (steps x batch), kept on the device and read back in one copy in the same wait.
  // The input set last is the first step's.
  std::vector<int32_t> run_steps_and_read_sampled(int steps);
  // Runs `launches` forward passes, each timed with CUDA events; milliseconds per launch.
  std::vector<float> time_runs(int launches);
  // The same passes as one kernel launch per program step (an op of one layer; split_schedule_by_step), back to back
  // on the stream: what the single launch buys. Milliseconds per pass. Not traced.
  std::vector<float> time_runs_per_step(int launches);
  // One forward pass with per-instruction timestamps recorded (tracing costs nothing when this is not called).
  Trace run_traced();
  ref::Matrix output() const;                // the pass's output buffer (logits, hidden states), converted to fp32
  // The output as it is on the device, bf16 (batch * seq_len, N) row-major, copied into `destination`, device memory
  // of the engine's GPU. Returns when the copy is done.
  void copy_output_to_device(void* destination) const;
  std::vector<ref::Matrix> buffers() const;  // every graph buffer (the host-written too), for bisecting
  ref::Matrix buffer(BufferRef ref) const;   // one graph buffer, converted to fp32 (token ids exactly below 2^24)
  size_t device_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mk
