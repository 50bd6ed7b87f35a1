// Trace output: Chrome trace-event JSON and the summary (per op, per SM, longest waits, observed critical path).
#include "mk/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "mk/check.h"
#include "trace_chain.h"

namespace mk {

namespace {

std::string slice_name(const Task& task) {
  return task.layer == kNoLayer ? opcode_name(task.opcode) : fmt::format("{} L{}", opcode_name(task.opcode), task.layer);
}

const Instruction& instruction_of(const Schedule& schedule, const TraceRecord& r) {
  return schedule.instructions[schedule.sm_begin[r.sm] + r.index];
}

// The record that ended last, before r started, on the SM that ran r; null if none.
const TraceRecord* ran_before(const Trace& trace, const TraceRecord& r) {
  const TraceRecord* before = nullptr;
  for (const TraceRecord& x : trace.records)
    if (&x != &r && ran_on(x) == ran_on(r) && x.end <= r.start && (before == nullptr || x.end > before->end))
      before = &x;
  return before;
}

// When a tile's output could be read by others: its publication (the storer's, for GEMM and attention tiles), else
// the end of its consumers' work.
double output_ready(const TraceRecord& r) { return r.published >= 0 ? r.published : r.end; }

// The wait that held a tile back: the producer's for GEMM and attention tiles, else the consumers'.
double wait_start(const TraceRecord& r) { return r.producer_start >= 0 ? r.producer_start : r.start; }
double wait_end(const TraceRecord& r) { return r.producer_start >= 0 ? r.producer_waits_done : r.waits_done; }

// Which tile released each counter last, for finding what a wait ended on.
struct Signals {
  std::vector<std::pair<double, uint32_t>> last;  // per counter: (latest output_ready of its tasks, that task)
  std::vector<const TraceRecord*> record_of_task;

  Signals(const Graph& graph, const Schedule& schedule, const Trace& trace)
      : last(schedule.num_counters, {-1e300, UINT32_MAX}), record_of_task(graph.tasks().size(), nullptr) {
    for (const TraceRecord& r : trace.records) {
      auto& done = last[instruction_of(schedule, r).signal_counter];
      if (output_ready(r) > done.first) done = {output_ready(r), r.task};
      record_of_task[r.task] = &r;
    }
  }
  // The wait satisfied last is the one that held the instruction back.
  uint32_t binding_counter(const Schedule& schedule, const TraceRecord& r) const {
    const Instruction& in = instruction_of(schedule, r);
    uint32_t counter = UINT32_MAX;
    double latest = -1e300;
    for (uint32_t k = 0; k < in.num_waits; ++k) {
      const uint32_t c = schedule.waits[in.wait_begin + k].counter;
      if (last[c].first > latest) {
        latest = last[c].first;
        counter = c;
      }
    }
    return counter;
  }
  // The tile whose publication ended r's wait, or null.
  const TraceRecord* binding_record(const Schedule& schedule, const TraceRecord& r) const {
    const uint32_t counter = binding_counter(schedule, r);
    return counter == UINT32_MAX || last[counter].second == UINT32_MAX ? nullptr : record_of_task[last[counter].second];
  }
  // The tile that held r back: the binding one, if r waited and that tile was published while it did; else null
  // (a GEMM producer's wait includes claiming ring stages before its first poll, which no input explains).
  const TraceRecord* held_back_by(const Schedule& schedule, const TraceRecord& r) const {
    constexpr double kWaitThresholdNs = 200;  // shorter waits are polling noise, not dependencies
    if (wait_end(r) - wait_start(r) <= kWaitThresholdNs) return nullptr;
    const TraceRecord* input = binding_record(schedule, r);
    return input != nullptr && output_ready(*input) > wait_start(r) ? input : nullptr;
  }
};

// Per (op, the op of the tile that held it back), in opcode order: how late that input came and how long its
// publication took to end the wait.
std::vector<TraceSummary::WaitedOn> summarize_waited_on(const Graph& graph, const Schedule& schedule,
                                                        const Trace& trace, const Signals& signals) {
  std::map<std::pair<Opcode, Opcode>, TraceSummary::WaitedOn> by_pair;
  for (const TraceRecord& r : trace.records) {
    const TraceRecord* input = signals.held_back_by(schedule, r);
    if (input == nullptr) continue;
    const Opcode op = graph.tasks()[r.task].opcode, input_op = graph.tasks()[input->task].opcode;
    TraceSummary::WaitedOn& w = by_pair[{op, input_op}];
    w.op = opcode_name(op);
    w.input = opcode_name(input_op);
    ++w.tiles;
    w.late_ns += std::max(0.0, output_ready(*input) - r.start);
    w.hop_ns += wait_end(r) - output_ready(*input);
  }
  std::vector<TraceSummary::WaitedOn> out;
  for (auto& [pair, w] : by_pair) {
    w.late_ns /= double(w.tiles);
    w.hop_ns /= double(w.tiles);
    out.push_back(w);
  }
  return out;
}

// Tiles that stream from HBM while they run: a decode step's weights and cache.
bool streams_from_hbm(Opcode opcode) {
  switch (opcode) {
    case Opcode::kDecodeQ:
    case Opcode::kDecodeKv:
    case Opcode::kDecodeAttention:
    case Opcode::kDecodeOProj:
    case Opcode::kDecodeOProjCombine:
    case Opcode::kDecodeGateUp:
    case Opcode::kDecodeDown:
    case Opcode::kDecodeLmHead:
      return true;
    default:
      return false;
  }
}

// Gaps shorter than this between streaming tiles are the tiles' own start-up, not the step's structure.
constexpr double kHbmGapThresholdNs = 500;

// The ops (with layer) whose records cover most of [begin, end), longest first, at most two.
std::vector<std::string> ops_during(const Graph& graph, const Trace& trace, double begin, double end) {
  std::map<std::string, double> covered;
  for (const TraceRecord& r : trace.records) {
    const double overlap = std::min(end, r.end) - std::max(begin, r.start);
    if (overlap > 0) covered[slice_name(graph.tasks()[r.task])] += overlap;
  }
  std::vector<std::pair<double, std::string>> by_time;
  for (const auto& [name, ns] : covered) by_time.push_back({-ns, name});
  std::sort(by_time.begin(), by_time.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < by_time.size() && i < 2; ++i) names.push_back(by_time[i].second);
  return names;
}

// Fills the summary's per-layer phases (TraceSummary::LayerPhase) and, from their last ends, its attention chain.
void summarize_layer_phases(const Graph& graph, const Trace& trace, TraceSummary& summary) {
  struct Phase {
    double first_start = std::numeric_limits<double>::infinity();
    std::vector<double> ends;
    double last_end = -std::numeric_limits<double>::infinity();
    uint32_t last_sm = 0;
  };
  std::map<std::pair<Opcode, uint16_t>, Phase> phases;  // (op, layer)
  for (const TraceRecord& r : trace.records) {
    const Task& task = graph.tasks()[r.task];
    Phase& phase = phases[{task.opcode, task.layer}];
    phase.first_start = std::min(phase.first_start, r.waits_done >= 0 ? r.waits_done : r.start);
    phase.ends.push_back(r.end);
    if (r.end > phase.last_end) {
      phase.last_end = r.end;
      phase.last_sm = ran_on(r);
    }
  }
  std::map<Opcode, std::pair<TraceSummary::LayerPhase, std::map<uint32_t, size_t>>> by_op;  // and last-SM counts
  for (auto& [key, phase] : phases) {
    auto& [out, last_sms] = by_op[key.first];
    auto median = phase.ends.begin() + phase.ends.size() / 2;
    std::nth_element(phase.ends.begin(), median, phase.ends.end());
    out.op = opcode_name(key.first);
    out.layers += 1;
    out.body_ns += *median - phase.first_start;
    out.tail_ns += phase.last_end - *median;
    last_sms[phase.last_sm] += 1;
  }
  for (auto& [opcode, entry] : by_op) {
    auto& [out, last_sms] = entry;
    out.body_ns /= double(out.layers);
    out.tail_ns /= double(out.layers);
    for (const auto& [sm, layers] : last_sms) {
      if (layers <= out.last_sm_layers) continue;
      out.last_sm = sm;
      out.last_sm_layers = layers;
    }
    summary.layer_phases.push_back(out);
  }
  std::map<std::pair<Opcode, uint16_t>, double> last_ends;
  for (const auto& [key, phase] : phases) last_ends[key] = phase.last_end;
  summary.attention_chain = attention_chain_of(last_ends);
}

// Adds a gap to the summary's totals by the streaming ops around it.
void add_gap_between(std::string before, std::string after, double idle_ns, TraceSummary& summary) {
  auto& totals = summary.hbm_gaps_between;
  auto it = std::find_if(totals.begin(), totals.end(), [&](const auto& t) {
    return t.before == before && t.after == after;
  });
  if (it == totals.end()) it = totals.insert(totals.end(), {std::move(before), std::move(after)});
  it->gaps += 1;
  it->idle_ns += idle_ns;
}

// Fills the summary's HBM-idle gaps: the complement, within the span, of the union of streaming tiles' run times.
void summarize_hbm_gaps(const Graph& graph, const Trace& trace, double first, double last, TraceSummary& summary) {
  struct Streaming {
    double begin, end;
    Opcode opcode;
    bool operator<(const Streaming& other) const { return begin < other.begin; }
  };
  std::vector<Streaming> streaming;
  for (const TraceRecord& r : trace.records) {
    const Opcode opcode = graph.tasks()[r.task].opcode;
    if (streams_from_hbm(opcode) && r.end > r.waits_done) streaming.push_back({r.waits_done, r.end, opcode});
  }
  if (streaming.empty()) return;
  std::stable_sort(streaming.begin(), streaming.end());
  std::vector<TraceSummary::HbmGap> gaps;
  double covered_until = first;
  std::string covered_by = "(start)";  // the op whose tile ended the covered stretch last
  for (const Streaming& s : streaming) {
    if (s.begin - covered_until >= kHbmGapThresholdNs) {
      gaps.push_back({covered_until, s.begin, {}});
      add_gap_between(covered_by, opcode_name(s.opcode), s.begin - covered_until, summary);
    }
    if (s.end > covered_until) {
      covered_until = s.end;
      covered_by = opcode_name(s.opcode);
    }
  }
  if (last - covered_until >= kHbmGapThresholdNs) {
    gaps.push_back({covered_until, last, {}});
    add_gap_between(covered_by, "(end)", last - covered_until, summary);
  }
  std::sort(summary.hbm_gaps_between.begin(), summary.hbm_gaps_between.end(), [](const auto& a, const auto& b) {
    return std::tie(b.idle_ns, a.before, a.after) < std::tie(a.idle_ns, b.before, b.after);
  });
  summary.hbm_gaps = gaps.size();
  for (const auto& gap : gaps) summary.hbm_idle_ns += gap.end_ns - gap.begin_ns;
  std::sort(gaps.begin(), gaps.end(),
            [](const auto& a, const auto& b) { return a.end_ns - a.begin_ns > b.end_ns - b.begin_ns; });
  if (gaps.size() > 8) gaps.resize(8);
  for (auto& gap : gaps) gap.during = ops_during(graph, trace, gap.begin_ns, gap.end_ns);
  summary.longest_hbm_gaps = std::move(gaps);
}

}  // namespace

std::string trace_to_chrome_json(const Graph& graph, const Trace& trace) {
  nlohmann::json events = nlohmann::json::array();
  for (int32_t sm = 0; sm < trace.num_sms; ++sm) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", sm}, {"args", {{"name", fmt::format("SM {}", sm)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", sm}, {"args", {{"sort_index", sm}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", sm}, {"tid", 0}, {"args", {{"name", "consumers"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", sm}, {"tid", 1}, {"args", {{"name", "producer"}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", sm}, {"tid", 2}, {"args", {{"name", "consumer phases"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", sm}, {"tid", 3}, {"args", {{"name", "storer"}}}});
  }
  auto slice = [&](const std::string& name, const std::string& category, uint32_t sm, int tid, double begin_ns,
                   double end_ns, nlohmann::json args) {
    events.push_back({{"name", name}, {"cat", category}, {"ph", "X"}, {"pid", sm}, {"tid", tid},
                      {"ts", begin_ns / 1e3}, {"dur", std::max(0.0, end_ns - begin_ns) / 1e3}, {"args", std::move(args)}});
  };
  for (const TraceRecord& r : trace.records) {
    const Task& task = graph.tasks()[r.task];
    const std::string name = slice_name(task);
    const std::string category = opcode_name(task.opcode);
    nlohmann::json args = {{"task", r.task},
                           {"instruction", r.index},
                           {"rows", fmt::format("[{},{})", task.row_begin, task.row_end)},
                           {"cols", fmt::format("[{},{})", task.col_begin, task.col_end)}};
    if (ran_on(r) != r.sm) args["listed_on_sm"] = r.sm;  // a linked decode combine, run by its last attention task
    if (task.sequence >= 0) {
      args["sequence"] = task.sequence;
      args["head"] = task.head;
    }
    if (r.waits_done > r.start) slice("wait", "wait", ran_on(r), 0, r.start, r.waits_done, {{"task", r.task}});
    slice(name, category, ran_on(r), 0, r.waits_done, r.end, args);
    const double work_start = r.data_ready >= 0 ? r.data_ready : r.waits_done;
    if (r.data_ready > r.start) slice("data wait", "wait", ran_on(r), 2, r.start, r.data_ready, {{"task", r.task}});
    if (r.math_done > work_start && r.math_done < r.end) {
      slice("math", category, ran_on(r), 2, work_start, r.math_done, {{"task", r.task}});
      slice("epilogue", category, ran_on(r), 2, r.math_done, r.end, {{"task", r.task}});
    }
    if (r.published > r.end) slice("store " + name, category, ran_on(r), 3, r.end, r.published, {{"task", r.task}});
    if (r.producer_start >= 0) {
      if (r.producer_waits_done > r.producer_start)
        slice("wait", "wait", ran_on(r), 1, r.producer_start, r.producer_waits_done, {{"task", r.task}});
      slice("load " + name, category, ran_on(r), 1, r.producer_waits_done, r.producer_loads_issued, {{"task", r.task}});
    }
  }
  const nlohmann::json document = {{"traceEvents", events},
                                   {"displayTimeUnit", "ns"},
                                   {"otherData", {{"engine", trace.engine}, {"launch_us", trace.launch_ns / 1e3},
                                                  {"model", graph.config().name}}}};
  return document.dump();
}

TraceSummary summarize_trace(const Graph& graph, const Schedule& schedule, const Trace& trace) {
  MK_CHECK(trace.records.size() == schedule.instructions.size(), "trace has {} records for {} instructions",
           trace.records.size(), schedule.instructions.size());
  TraceSummary summary;
  double first = 1e300, last = -1e300;
  for (const TraceRecord& r : trace.records) {
    first = std::min(first, r.start);
    last = std::max(last, r.end);
  }
  summary.span_ns = trace.records.empty() ? 0 : last - first;

  std::map<Opcode, TraceSummary::Op> ops;
  summary.sms.resize(size_t(trace.num_sms));
  for (const TraceRecord& r : trace.records) {
    const Task& task = graph.tasks()[r.task];
    TraceSummary::Op& op = ops[task.opcode];
    op.name = opcode_name(task.opcode);
    ++op.count;
    op.total_ns += r.end - r.waits_done;
    op.dependency_wait_ns += wait_end(r) - wait_start(r);
    const double work_start = r.data_ready >= 0 ? r.data_ready : r.waits_done;
    op.data_wait_ns += r.data_ready >= 0 ? r.data_ready - r.start : 0.0;
    op.math_ns += r.math_done - work_start;
    op.epilogue_ns += r.end - r.math_done;
    op.tile_wait_ns += r.tile_free >= 0 ? r.tile_free - r.math_done : 0.0;
    op.store_ns += r.published >= 0 ? r.published - r.end : 0.0;
    const TaskWork work = graph.work(task);
    op.flops += work.flops;
    op.bytes += work.bytes;
    // NOTE: from the later of the consumers' start and the end of the counter wait, so that a tile held up by other
    // SMs does not read as one starved of bandwidth.
    op.delivery_ns += std::max(0.0, r.math_done - std::max(r.start, wait_end(r)));
    TraceSummary::Sm& sm = summary.sms[ran_on(r)];
    sm.busy_ns += r.end - r.waits_done;
    sm.waiting_ns += r.waits_done - r.start;
  }
  for (auto& [opcode, op] : ops) summary.ops.push_back(op);
  for (TraceSummary::Sm& sm : summary.sms) sm.idle_ns = summary.span_ns - sm.busy_ns - sm.waiting_ns;

  const Signals signals(graph, schedule, trace);
  for (const TraceRecord& r : trace.records) {
    if (wait_end(r) <= wait_start(r)) continue;
    summary.longest_waits.push_back(
        {r.sm, r.index, r.task, wait_end(r) - wait_start(r), signals.binding_counter(schedule, r)});
  }
  std::sort(summary.longest_waits.begin(), summary.longest_waits.end(),
            [](const auto& a, const auto& b) { return a.wait_ns > b.wait_ns; });
  if (summary.longest_waits.size() > 10) summary.longest_waits.resize(10);

  // Observed critical path: from the last instruction to finish, step to whatever released it: the tile that held it
  // back, else its predecessor on the same SM (for a linked decode combine, the task it ran after on the SM that
  // ran it: its group's last attention task).
  const TraceRecord* at = nullptr;
  for (const TraceRecord& r : trace.records)
    if (at == nullptr || r.end > at->end) at = &r;
  while (at != nullptr) {
    summary.critical_path.push_back(at->task);
    const TraceRecord* next = signals.held_back_by(schedule, *at);
    if (next == nullptr && ran_on(*at) != at->sm) {
      next = ran_before(trace, *at);
    } else if (next == nullptr && at->index > 0) {
      next = &trace.records[schedule.sm_begin[at->sm] + at->index - 1];
    }
    at = next;
  }
  std::reverse(summary.critical_path.begin(), summary.critical_path.end());
  summary.waited_on = summarize_waited_on(graph, schedule, trace, signals);
  summarize_hbm_gaps(graph, trace, first, last, summary);
  summarize_layer_phases(graph, trace, summary);
  return summary;
}

nlohmann::json trace_summary_json(const TraceSummary& summary) {
  nlohmann::json ops = nlohmann::json::array();
  for (const TraceSummary::Op& op : summary.ops)
    ops.push_back({{"name", op.name},
                   {"count", op.count},
                   {"total_ns", op.total_ns},
                   {"dependency_wait_ns", op.dependency_wait_ns},
                   {"data_wait_ns", op.data_wait_ns},
                   {"math_ns", op.math_ns},
                   {"epilogue_ns", op.epilogue_ns},
                   {"tile_wait_ns", op.tile_wait_ns},
                   {"store_ns", op.store_ns},
                   {"flops", op.flops},
                   {"bytes", op.bytes},
                   {"delivery_ns", op.delivery_ns}});
  return {{"span_ns", summary.span_ns}, {"sms", summary.sms.size()}, {"ops", ops}};
}

std::string format_trace_summary(const Graph& graph, const TraceSummary& s, const Trace& trace) {
  std::string out = fmt::format("trace ({}): span {:.1f} us, launch measured {:.1f} us\n", trace.engine,
                                s.span_ns / 1e3, trace.launch_ns / 1e3);
  out += "per op: count, busy total (consumer, counter waits excluded), and the mean us per tile of each phase; then\n"
         "the rates an SM ran its tiles at from their inputs' publication to math done: TFLOP/s, bytes moved per ns\n";
  out += fmt::format("  {:<11} {:>7} {:>18}  {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>6} {:>5}\n", "op", "count", "busy",
                     "dep.wait", "data.wait", "math", "epilogue", "tile.wait", "store", "TF/s", "B/ns");
  double busy_total = 0;
  for (const TraceSummary::Op& op : s.ops) busy_total += op.total_ns;
  for (const TraceSummary::Op& op : s.ops) {
    const double tiles = double(op.count) * 1e3;  // mean per tile, in us
    const bool timed = op.delivery_ns > 0;
    const std::string rates = timed ? fmt::format("{:>6.2f} {:>5.0f}", op.flops / op.delivery_ns / 1e3,
                                                  op.bytes / op.delivery_ns)
                                    : fmt::format("{:>6} {:>5}", "-", "-");
    out += fmt::format("  {:<11} {:>7} {:>10.1f} us {:>4.1f}%  ", op.name, op.count, op.total_ns / 1e3,
                       100.0 * op.total_ns / busy_total);
    out += fmt::format("{:>9.2f} {:>9.2f} {:>8.2f} {:>8.2f} {:>9.2f} {:>8.2f} {}\n", op.dependency_wait_ns / tiles,
                       op.data_wait_ns / tiles, op.math_ns / tiles, op.epilogue_ns / tiles, op.tile_wait_ns / tiles,
                       op.store_ns / tiles, rates);
  }
  double busy = 0, waiting = 0, idle = 0;
  for (const TraceSummary::Sm& sm : s.sms) {
    busy += sm.busy_ns;
    waiting += sm.waiting_ns;
    idle += sm.idle_ns;
  }
  const double all = busy + waiting + idle;
  out += fmt::format("SMs: busy {:.1f}%, waiting {:.1f}%, idle {:.1f}% of {} SMs x {:.1f} us\n", 100 * busy / all,
                     100 * waiting / all, 100 * idle / all, s.sms.size(), s.span_ns / 1e3);
  auto least = std::min_element(s.sms.begin(), s.sms.end(), [](auto& a, auto& b) { return a.busy_ns < b.busy_ns; });
  auto most = std::max_element(s.sms.begin(), s.sms.end(), [](auto& a, auto& b) { return a.busy_ns < b.busy_ns; });
  if (!s.sms.empty()) {
    out += fmt::format("  least busy SM {} ({:.1f}%), most busy SM {} ({:.1f}%)\n", least - s.sms.begin(),
                       100 * least->busy_ns / s.span_ns, most - s.sms.begin(), 100 * most->busy_ns / s.span_ns);
  }
  out += "longest waits:\n";
  for (const auto& w : s.longest_waits) {
    out += fmt::format("  {:>8.2f} us  SM {} instruction {} ({}) on counter {}\n", w.wait_ns / 1e3, w.sm, w.index,
                       graph.describe(graph.tasks()[w.task]), w.counter);
  }
  out += "what the waits ended on (tiles that waited, the op of the input published last; mean us: late, how long\n"
         "after the consumers turned to the tile it was published; hop, from its publication to the wait's end)\n";
  out += fmt::format("  {:<17} {:<17} {:>7} {:>8} {:>8}\n", "op", "input", "tiles", "late", "hop");
  for (const auto& w : s.waited_on)
    out += fmt::format("  {:<17} {:<17} {:>7} {:>8.2f} {:>8.2f}\n", w.op, w.input, w.tiles, w.late_ns / 1e3,
                       w.hop_ns / 1e3);
  if (!s.longest_hbm_gaps.empty()) {
    out += fmt::format("HBM-idle gaps (no decode GEMM or attention tile past its waits on any SM, {:.1f} us or more): "
                       "{}, {:.1f} us ({:.1f}% of the span); the longest, with the ops that filled them:\n",
                       kHbmGapThresholdNs / 1e3, s.hbm_gaps, s.hbm_idle_ns / 1e3, 100 * s.hbm_idle_ns / s.span_ns);
    for (const auto& gap : s.longest_hbm_gaps)
      out += fmt::format("  {:>8.2f} us at {:.1f} us: {}\n", (gap.end_ns - gap.begin_ns) / 1e3, gap.begin_ns / 1e3,
                         gap.during.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(gap.during, ", ")));
    out += "  all of them by the streaming ops around them (the op whose tile ended last before, the op after):\n";
    for (const auto& t : s.hbm_gaps_between)
      out += fmt::format("  {:>8.2f} us in {:>3} gaps: {} -> {}\n", t.idle_ns / 1e3, t.gaps, t.before, t.after);
  }
  out += "per layer (means over the layers an op runs in, us): its tiles' first start past their waits to their\n"
         "median end, on to the last end, and the SM that ended it last in the most layers\n";
  out += fmt::format("  {:<17} {:>7} {:>9} {:>8}   {}\n", "op", "layers", "to median", "tail", "last SM");
  for (const auto& phase : s.layer_phases)
    out += fmt::format("  {:<17} {:>7} {:>9.2f} {:>8.2f}   SM {} ({} of {})\n", phase.op, phase.layers,
                       phase.body_ns / 1e3, phase.tail_ns / 1e3, phase.last_sm, phase.last_sm_layers, phase.layers);
  out += format_attention_chain(s);
  out += fmt::format("observed critical path ({} tasks):", s.critical_path.size());
  std::string previous;
  size_t run = 0;
  auto flush = [&] {
    if (run > 0) out += fmt::format(" {}{}", previous, run > 1 ? fmt::format(" x{}", run) : "");
  };
  for (uint32_t t : s.critical_path) {
    const std::string name = slice_name(graph.tasks()[t]);
    if (name != previous) {
      flush();
      previous = name;
      run = 0;
    }
    ++run;
  }
  flush();
  out += "\n";
  return out;
}

}  // namespace mk
