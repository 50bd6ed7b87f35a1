// Per-SM timelines of one forward pass: what each instruction did when, recorded by the gpu engine (clock64 and
// globaltimer) or the cpu-vm (steady_clock); written as Chrome trace-event JSON for ui.perfetto.dev and summarized.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mk/graph.h"
#include "mk/schedule.h"

namespace mk {

// One instruction's phases, in ns since the launch began (negative where not recorded). Consumer: fetched ->
// counters satisfied (row-wise ops; the producer waits for GEMM and attention) -> first operands landed (gpu GEMM and
// attention) -> math done -> output published (gpu GEMM and attention: staged for the storer). Producer (gpu GEMM
// and attention): started the instruction -> the counter poller reported its counters satisfied (a GEMM looks for
// the report after claiming each of its first ring stages, so this includes waiting for the ring) -> last load
// issued. Storer (gpu GEMM and attention):
// TMA store landed and counter released.
struct TraceRecord {
  uint32_t sm = 0;
  uint32_t index = 0;  // within the SM's list
  uint32_t task = 0;
  double start = 0;
  double waits_done = 0;
  double data_ready = -1;
  double math_done = 0;
  double end = 0;
  double producer_start = -1;
  double producer_waits_done = -1;
  double producer_loads_issued = -1;
  double published = -1;
  double tile_free = -1;  // gpu GEMM: the epilogue found the output tile free (and its residual loaded)
  int32_t ran_on_sm = -1;  // the SM that ran it, where that is not `sm` (a linked decode combine); -1: `sm`
};

// The SM whose time line the record belongs on.
inline uint32_t ran_on(const TraceRecord& r) { return r.ran_on_sm >= 0 ? uint32_t(r.ran_on_sm) : r.sm; }

struct Trace {
  std::string engine;
  int32_t num_sms = 0;
  double launch_ns = 0;                // the launch's duration measured outside the trace (events or wall clock)
  std::vector<TraceRecord> records;    // in schedule order: SM 0's list, then SM 1's, ...
};

// Chrome trace-event JSON ("X" events): one process per SM, one thread per role, slices named by op, layer and tile.
std::string trace_to_chrome_json(const Graph& graph, const Trace& trace);

struct TraceSummary {
  double span_ns = 0;  // first start to last end
  // Where each op's time goes, summed over its tiles. The waits are split from the work: the dependency wait (for
  // other SMs' results: the producer's wait for the poller's report where it waits, else the consumers'), the data
  // wait (consumers waiting for their first operands: dependency wait plus load latency), math, epilogue, and store
  // (the storer's TMA store and publication, which overlaps the consumers' next instruction).
  struct Op {
    std::string name;
    size_t count = 0;
    double total_ns = 0;            // consumer start (after its counter waits) to end
    double dependency_wait_ns = 0;
    double data_wait_ns = 0;
    double math_ns = 0;             // first operands landed (or counters satisfied) to math done
    double epilogue_ns = 0;         // math done to end
    double tile_wait_ns = 0;        // of the epilogue: math done to the output tile free (gpu GEMM)
    double store_ns = 0;            // end to published
    // Its tiles' FLOPs and bytes (TaskWork: operands, output and residual), and the time from the tile's inputs being
    // published (or the consumers turning to it, if later) to math done: the rates an SM ran them at. A GEMM tile bound
    // by the delivery of its operands shows the same bytes per ns however it is shaped.
    double flops = 0;
    double bytes = 0;
    double delivery_ns = 0;
  };
  std::vector<Op> ops;
  struct Sm {
    double busy_ns = 0;     // executing (waits done to end)
    double waiting_ns = 0;  // in counter waits
    double idle_ns = 0;     // the rest of the span: before the first, between and after its instructions
  };
  std::vector<Sm> sms;
  struct LongWait {
    uint32_t sm, index, task;
    double wait_ns;    // GEMM and attention tiles: the producer's wait for the poller's report; else the consumers'
    uint32_t counter;  // the wait that was satisfied last
  };
  std::vector<LongWait> longest_waits;  // the 10 longest
  std::vector<uint32_t> critical_path;  // tasks, first to last: each released its successor's last wait
  // Per (op, input op): the tiles of op that waited (over 200 ns) for an input published while they waited, the
  // input being the op of the tile whose publication released the wait satisfied last. late: how long after the
  // tile's consumers turned to it the input was published (0 when before), the consumers' idle time it caused; hop:
  // from that publication to the end of the wait (the counter's release, the poll, the backoff). Means per tile.
  struct WaitedOn {
    std::string op, input;
    size_t tiles = 0;
    double late_ns = 0;
    double hop_ns = 0;
  };
  std::vector<WaitedOn> waited_on;
  // A decode step's HBM-idle gaps: stretches of the span in which no SM runs a tile that streams from HBM (a decode
  // GEMM's weights, decode attention's cache) past its counter waits. Empty for a forward pass.
  struct HbmGap {
    double begin_ns, end_ns;
    std::vector<std::string> during;  // the ops (with layer) whose tiles filled most of the gap, longest first
  };
  double hbm_idle_ns = 0;
  size_t hbm_gaps = 0;
  std::vector<HbmGap> longest_hbm_gaps;  // the 8 longest
  // Every gap's idle time by the streaming ops around it: the op whose tile ended the covered stretch before the gap
  // ("(start)" at the span's start) and the op whose tile began the next ("(end)" at its end), without layers, so
  // that a gap every layer repeats adds up. Most idle time first.
  struct HbmGapsBetween {
    std::string before, after;
    size_t gaps = 0;
    double idle_ns = 0;
  };
  std::vector<HbmGapsBetween> hbm_gaps_between;
  // Each op's phase in a layer, from its tiles' first start (past their counter waits) to their median end (body)
  // and on to the last end (tail), means over the layers the op runs in; and the SM that ended the op's phase last
  // in the most layers: a straggler the schedule repeats holds back everything after the phase. In program order.
  struct LayerPhase {
    std::string op;
    size_t layers = 0;
    double body_ns = 0;
    double tail_ns = 0;
    uint32_t last_sm = 0;
    size_t last_sm_layers = 0;  // of `layers`
  };
  std::vector<LayerPhase> layer_phases;
  // A decode step's attention chain in a layer, the dependent stretch from q and kv to o_proj, in which HBM streams
  // only the cache and o_proj's own weights: from the last q or kv tile's end on to the last attention tile's end, the
  // last combine's end and the last o_proj tile's end; means over the layers that run q, attention and o_proj (none:
  // layers 0, as in a forward pass; a layer without combines adds 0 for them).
  struct AttentionChain {
    size_t layers = 0;
    double to_attention_ns = 0;
    double to_combine_ns = 0;
    double to_o_proj_ns = 0;
  };
  AttentionChain attention_chain;
};
TraceSummary summarize_trace(const Graph& graph, const Schedule& schedule, const Trace& trace);
std::string format_trace_summary(const Graph& graph, const TraceSummary& summary, const Trace& trace);
// The span, the SM count and the per-op phases (sums over the op's tiles, ns) for scripts: `mk trace --summary`.
nlohmann::json trace_summary_json(const TraceSummary& summary);

}  // namespace mk
