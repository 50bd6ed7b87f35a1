// The cpu-vm engine: one thread per virtual SM runs that SM's instruction list with the GPU's counter protocol
// (acquire waits, release signals), computing each tile with the reference ops.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mk/graph.h"
#include "mk/reference.h"
#include "mk/schedule.h"
#include "mk/trace.h"
#include "mk/weights.h"

namespace mk {

// The longest random delay before an instruction: a shake, not a stop (2^31 us per instruction was a hang).
constexpr int kMaxCpuVmDelayUs = 100'000;

struct CpuVmOptions {
  int max_delay_us = 0;  // sleep a random 0..max_delay_us (<= kMaxCpuVmDelayUs) before each instruction
  uint64_t delay_seed = 1;
  // Happens-before race detector: each read must be ordered after its writers by counter waits and program order
  // (vector clocks); otherwise the run fails naming both tasks. Timing-independent, so a missing wait is caught
  // even when the writer happened to finish first.
  bool detect_races = true;
  int launches = 1;  // run the schedule this many times without resetting counters (epochs 1..launches)
  double stall_timeout_s = 60.0;  // a wait longer than this is reported as a stall, never a hang
  std::vector<uint32_t> slow_tasks;  // fault injection for tests: these tasks sleep slow_task_delay_ms first
  int slow_task_delay_ms = 0;
  bool record_trace = false;  // fill CpuVmRun::trace (of the last launch), in the gpu engine's format
};

struct CpuVmRun {
  std::vector<ref::Matrix> buffers;  // one per graph buffer, fp32; unwritten elements stay NaN
  Trace trace;                       // when CpuVmOptions::record_trace
  const ref::Matrix& output(const Graph& graph) const { return buffers[graph.output_buffer()]; }
};

// A schedule bound to its weights and buffers, launched again and again as the gpu engine launches it: counters are
// never reset (launch e waits for e x target) and buffers persist between launches, NaN until first written.
// Prefill and decode passes read and write `cache` (one matrix per layer, ref::make_kv_cache), which the sessions of
// one generation share; without one the session keeps its own. The graph and the schedule (verified by the
// caller) must outlive the session.
class CpuVmSession {
 public:
  CpuVmSession(const Graph& graph, const Schedule& schedule, const ModelWeights& weights, const CpuVmOptions& options,
               std::vector<ref::Matrix>* cache = nullptr);
  ~CpuVmSession();
  CpuVmSession(const CpuVmSession&) = delete;
  CpuVmSession& operator=(const CpuVmSession&) = delete;

  void set_input(const ref::ModelInput& input);  // of the graph's shape; read by the launches that follow
  // One launch. Throws mk::Error on a stall or a detected race; the session is unusable after that.
  void launch();
  const ref::Matrix& buffer(uint32_t id) const;  // a graph buffer as the last launch left it
  const Trace& trace() const;                    // of the last launch, when CpuVmOptions::record_trace
  CpuVmRun release();                            // every buffer and the trace; the session is spent

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs a verified schedule (it calls verify_schedule first and refuses one that fails). Throws mk::Error on a
// stall or a detected race.
CpuVmRun run_cpu_vm(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                    const ref::ModelInput& input, const CpuVmOptions& options = {});

// Without verification: for a schedule the caller has verified already, or for tests that feed a deliberately
// broken one to see the cpu-vm expose it.
CpuVmRun run_cpu_vm_unverified(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                               const ref::ModelInput& input, const CpuVmOptions& options);

}  // namespace mk
