// Tests of the trace: the cpu-vm records one, the Chrome JSON is well formed, and the summary adds up.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "mk/cpu_vm.h"
#include "mk/trace.h"

namespace mk {
namespace {

class CpuVmTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = find_preset("tiny").config;
    graph_ = std::make_unique<Graph>(config_, shape_);
    // NOTE: forward, where every SM starts on a layer-0 tile that waits for the embedding, so the observed critical
    // path reaches back to it; backward (which the policy may pick) can run a layer-0 tile after the embedding on
    // its SM, without a wait.
    schedule_ = make_list_schedule(*graph_, derive_dependencies(*graph_), 6, ListDirection::kForward);
    CpuVmOptions options;
    options.record_trace = true;
    options.max_delay_us = 100;
    // Random delays alone left layer 0's attention never waiting on qkv on a loaded CI machine (the ninth session's
    // CI failure); slow qkv tiles make that wait certain, so the test cannot depend on the host's timing.
    for (uint32_t task = 0; task < graph_->tasks().size(); ++task)
      if (graph_->tasks()[task].opcode == Opcode::kQkv && graph_->tasks()[task].layer == 0)
        options.slow_tasks.push_back(task);
    options.slow_task_delay_ms = 5;
    trace_ = run_cpu_vm(*graph_, schedule_, random_weights(config_, 1), ref::random_input(config_, shape_, 2), options)
                 .trace;
  }
  ModelConfig config_;
  RunShape shape_{2, 100};
  std::unique_ptr<Graph> graph_;
  Schedule schedule_;
  Trace trace_;
};

TEST_F(CpuVmTrace, RecordsEveryInstructionInOrder) {
  ASSERT_EQ(trace_.records.size(), schedule_.instructions.size());
  EXPECT_EQ(trace_.engine, "cpu-vm");
  for (size_t i = 0; i < trace_.records.size(); ++i) {
    const TraceRecord& r = trace_.records[i];
    EXPECT_EQ(r.task, schedule_.instructions[i].task);
    EXPECT_LE(r.start, r.waits_done);
    EXPECT_LE(r.waits_done, r.math_done);
    EXPECT_LE(r.math_done, r.end);
    EXPECT_LE(r.end, trace_.launch_ns);
    if (r.index > 0) {
      EXPECT_GE(r.start, trace_.records[i - 1].end) << "SM lists run in order";
    }
  }
}

TEST_F(CpuVmTrace, ChromeJsonHasOneTrackPerSmAndNamedSlices) {
  const nlohmann::json document = nlohmann::json::parse(trace_to_chrome_json(*graph_, trace_));
  ASSERT_TRUE(document.contains("traceEvents"));
  std::set<int> processes;
  size_t op_slices = 0;
  std::set<std::string> names;
  for (const nlohmann::json& event : document["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph") && event.contains("pid")) << event.dump();
    if (event["ph"] == "M" && event["name"] == "process_name") processes.insert(event["pid"].get<int>());
    if (event["ph"] != "X") continue;
    for (const char* field : {"name", "ts", "dur", "tid"}) ASSERT_TRUE(event.contains(field)) << event.dump();
    EXPECT_GE(event["dur"].get<double>(), 0.0);
    if (event["tid"] == 0 && event["name"] != "wait") {
      ++op_slices;
      names.insert(event["name"].get<std::string>());
    }
  }
  EXPECT_EQ(processes.size(), size_t(schedule_.num_sms));
  EXPECT_EQ(op_slices, schedule_.instructions.size());
  EXPECT_TRUE(names.count("qkv L1"));
  EXPECT_TRUE(names.count("attention L0"));
  EXPECT_TRUE(names.count("lm_head"));
}

TEST_F(CpuVmTrace, SummaryAddsUpToTheSpan) {
  const TraceSummary summary = summarize_trace(*graph_, schedule_, trace_);
  ASSERT_EQ(summary.sms.size(), size_t(schedule_.num_sms));
  for (const TraceSummary::Sm& sm : summary.sms) {
    EXPECT_NEAR(sm.busy_ns + sm.waiting_ns + sm.idle_ns, summary.span_ns, 1e-6 * summary.span_ns);
    EXPECT_GE(sm.idle_ns, -1e-6 * summary.span_ns);
  }
  size_t counted = 0;
  for (const TraceSummary::Op& op : summary.ops) counted += op.count;
  EXPECT_EQ(counted, schedule_.instructions.size());
  EXPECT_LE(summary.span_ns, trace_.launch_ns);
  // The observed critical path runs from the first layer to the LM head, each step ordered in time.
  ASSERT_FALSE(summary.critical_path.empty());
  EXPECT_EQ(graph_->tasks()[summary.critical_path.back()].opcode, Opcode::kLmHead);
  EXPECT_EQ(graph_->tasks()[summary.critical_path.front()].opcode, Opcode::kEmbed);
  EXPECT_FALSE(summary.longest_waits.empty());
  EXPECT_NE(format_trace_summary(*graph_, summary, trace_).find("observed critical path"), std::string::npos);
}

// What each wait ended on: only ops the waiting op depends on, never published after the wait ended.
TEST_F(CpuVmTrace, WaitsEndOnTheirOwnInputsAfterThoseArePublished) {
  std::vector<std::set<Opcode>> signalers(schedule_.num_counters);
  for (const Instruction& in : schedule_.instructions) signalers[in.signal_counter].insert(in.opcode);
  std::set<std::pair<std::string, std::string>> edges;
  for (const Instruction& in : schedule_.instructions)
    for (uint32_t k = 0; k < in.num_waits; ++k)
      for (Opcode input : signalers[schedule_.waits[in.wait_begin + k].counter])
        edges.insert({opcode_name(in.opcode), opcode_name(input)});
  const TraceSummary summary = summarize_trace(*graph_, schedule_, trace_);
  ASSERT_FALSE(summary.waited_on.empty());
  bool attention_on_qkv = false;
  for (const TraceSummary::WaitedOn& w : summary.waited_on) {
    EXPECT_TRUE(edges.count({w.op, w.input})) << w.op << " is said to wait on " << w.input;
    EXPECT_GE(w.hop_ns, 0.0) << w.op << " <- " << w.input << ": a wait cannot end before its input is published";
    EXPECT_GE(w.late_ns, 0.0);
    attention_on_qkv |= w.op == "attention" && w.input == "qkv";
  }
  EXPECT_TRUE(attention_on_qkv);
  EXPECT_NE(format_trace_summary(*graph_, summary, trace_).find("what the waits ended on"), std::string::npos);
}

}  // namespace
}  // namespace mk

namespace mk {
namespace {

// A gpu-style trace of one GEMM tile: the producer waits on the counters, the storer publishes. The summary must
// put each span in its phase, so that an op's math excludes the time spent waiting for other SMs.
TEST(TraceSummary, SplitsDependencyWaitDataWaitMathEpilogueAndStore) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {1, 32});
  Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 1);
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = 1;
  double clock = 0;
  size_t gemm_records = 0;
  double gemm_flops = 0, gemm_bytes = 0;
  for (size_t i = 0; i < schedule.instructions.size(); ++i) {
    TraceRecord r;
    r.index = uint32_t(i);
    r.task = schedule.instructions[i].task;
    r.start = clock;
    if (schedule.instructions[i].opcode == Opcode::kQkv) {
      ++gemm_records;
      const TaskWork work = graph.work(graph.tasks()[r.task]);
      gemm_flops += work.flops;
      gemm_bytes += work.bytes;
      r.producer_start = clock;
      r.producer_waits_done = clock + 100;  // dependency wait 100
      r.producer_loads_issued = clock + 150;
      r.waits_done = clock;
      r.data_ready = clock + 300;           // data wait 300
      r.math_done = clock + 1300;           // math 1000
      r.tile_free = clock + 1320;           // of which tile wait 20
      r.end = clock + 1350;                 // epilogue 50
      r.published = clock + 2350;           // store 1000
    } else {
      r.waits_done = clock + 10;
      r.math_done = clock + 30;
      r.end = clock + 40;
    }
    clock = r.end;
    trace.records.push_back(r);
  }
  trace.launch_ns = clock;
  const TraceSummary summary = summarize_trace(graph, schedule, trace);
  bool found = false;
  for (const TraceSummary::Op& op : summary.ops) {
    if (op.name != "qkv") continue;
    found = true;
    ASSERT_EQ(op.count, gemm_records);
    const double n = double(gemm_records);
    EXPECT_DOUBLE_EQ(op.dependency_wait_ns, 100 * n);
    EXPECT_DOUBLE_EQ(op.data_wait_ns, 300 * n);
    EXPECT_DOUBLE_EQ(op.math_ns, 1000 * n);
    EXPECT_DOUBLE_EQ(op.epilogue_ns, 50 * n);
    EXPECT_DOUBLE_EQ(op.tile_wait_ns, 20 * n);
    EXPECT_DOUBLE_EQ(op.store_ns, 1000 * n);
    EXPECT_GT(gemm_bytes, 0.0);
    EXPECT_DOUBLE_EQ(op.flops, gemm_flops);
    EXPECT_DOUBLE_EQ(op.bytes, gemm_bytes);
    EXPECT_DOUBLE_EQ(op.delivery_ns, 1200 * n);
  }
  EXPECT_TRUE(found);
  const std::string text = format_trace_summary(graph, summary, trace);
  EXPECT_NE(text.find("dep.wait"), std::string::npos);
  // qkv's rates from its counter wait's end (100 ns after the consumers' start) to math done (1300 after): 1200 a tile
  const double working_ns = 1200.0 * double(gemm_records);
  EXPECT_NE(text.find(fmt::format("{:>6.2f} {:>5.0f}\n", gemm_flops / working_ns / 1e3, gemm_bytes / working_ns)),
            std::string::npos)
      << text;
  const nlohmann::json json = trace_summary_json(summary);
  EXPECT_EQ(json.at("sms"), 1);
  bool found_in_json = false;
  for (const nlohmann::json& op : json.at("ops")) {
    if (op.at("name") != "qkv") continue;
    found_in_json = true;
    EXPECT_EQ(op.at("count"), gemm_records);
    EXPECT_DOUBLE_EQ(op.at("data_wait_ns").get<double>(), 300.0 * double(gemm_records));
    EXPECT_DOUBLE_EQ(op.at("math_ns").get<double>(), 1000.0 * double(gemm_records));
    EXPECT_DOUBLE_EQ(op.at("epilogue_ns").get<double>(), 50.0 * double(gemm_records));
    EXPECT_DOUBLE_EQ(op.at("tile_wait_ns").get<double>(), 20.0 * double(gemm_records));
  }
  EXPECT_TRUE(found_in_json);
}

}  // namespace
}  // namespace mk

namespace mk {
namespace {

// The "what the waits ended on" table from a hand-timed gpu-style trace: the qkv tiles of layer 0 wait (producer)
// for their attn_norm tile, published 300 ns after their consumers turned to them and 300 ns before their wait ends;
// layer 1's qkv tiles wait as long, but for their ring, their input having been published long before: not counted.
TEST(TraceSummary, WaitsCountOnlyInputsPublishedWhileTheyWaited) {
  const Graph graph(find_preset("tiny").config, {1, 32});
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 1);
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = 1;
  size_t waiting_tiles = 0;
  for (size_t i = 0; i < schedule.instructions.size(); ++i) {
    const Instruction& in = schedule.instructions[i];
    TraceRecord r;
    r.index = uint32_t(i);
    r.task = in.task;
    r.start = r.waits_done = 10.0 * double(i);
    r.math_done = r.start + 5;
    r.end = r.start + 10;
    const double at = 1e6 * (1 + in.layer);  // layer 0's qkv phase at 1 ms, layer 1's at 2 ms
    if (in.opcode == Opcode::kAttnNorm && in.layer == 0) {
      r.start = r.waits_done = at;
      r.math_done = at + 390;
      r.end = at + 400;
    }
    if (in.opcode == Opcode::kQkv) {
      waiting_tiles += in.layer == 0;
      r.producer_start = at;
      r.producer_waits_done = at + 700;
      r.producer_loads_issued = at + 750;
      r.start = at + 100;
      r.waits_done = at + 150;
      r.data_ready = at + 800;
      r.math_done = at + 900;
      r.end = at + 950;
      r.published = at + 1000;
    }
    trace.records.push_back(r);
  }
  trace.launch_ns = 3e6;
  const TraceSummary summary = summarize_trace(graph, schedule, trace);
  ASSERT_GT(waiting_tiles, 0u);
  ASSERT_EQ(summary.waited_on.size(), 1u);
  const TraceSummary::WaitedOn& w = summary.waited_on[0];
  EXPECT_EQ(w.op, "qkv");
  EXPECT_EQ(w.input, "attn_norm");
  EXPECT_EQ(w.tiles, waiting_tiles);
  EXPECT_DOUBLE_EQ(w.late_ns, 300);
  EXPECT_DOUBLE_EQ(w.hop_ns, 300);
  // The longest waits are the producer's for GEMM tiles (the consumers' here lasted 50 ns).
  ASSERT_FALSE(summary.longest_waits.empty());
  EXPECT_DOUBLE_EQ(summary.longest_waits[0].wait_ns, 700);
  EXPECT_EQ(graph.tasks()[summary.longest_waits[0].task].opcode, Opcode::kQkv);
}

}  // namespace
}  // namespace mk

namespace mk {
namespace {

// One SM running every instruction of the schedule for 1 us, back to back.
Trace back_to_back(const Schedule& schedule) {
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = 1;
  for (size_t i = 0; i < schedule.instructions.size(); ++i) {
    TraceRecord r;
    r.index = uint32_t(i);
    r.task = schedule.instructions[i].task;
    r.start = r.waits_done = 1000.0 * double(i);
    r.math_done = r.start + 900;
    r.end = r.start + 1000;
    trace.records.push_back(r);
  }
  trace.launch_ns = trace.records.back().end;
  return trace;
}

// The per-layer phases on a hand-timed trace: every tile of an (op, layer) starts at one time and takes 1 us, but
// those on SM 2 take 3 us. An op whose tiles in every layer are at least 3 with fewer than half on SM 2 then has a
// body of 1 us (first start to median end), a tail of 2 us, and SM 2 last in every layer.
TEST(TraceSummary, FindsEachLayersStragglerSm) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {2, 1, PassKind::kDecode, 256});
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 3);
  std::map<std::pair<Opcode, uint16_t>, double> base;  // (op, layer) -> its tiles' start
  std::map<std::pair<Opcode, uint16_t>, std::pair<int, int>> tiles;  // (op, layer) -> (tiles, on SM 2)
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = schedule.num_sms;
  for (int32_t sm = 0; sm < schedule.num_sms; ++sm) {
    for (uint32_t i = schedule.sm_begin[sm]; i < schedule.sm_begin[sm + 1]; ++i) {
      const Task& task = graph.tasks()[schedule.instructions[i].task];
      const auto key = std::make_pair(task.opcode, task.layer);
      if (!base.count(key)) base[key] = 10000.0 * double(base.size());
      tiles[key].first += 1;
      tiles[key].second += sm == 2;
      TraceRecord r;
      r.sm = uint32_t(sm);
      r.index = i - schedule.sm_begin[sm];
      r.task = schedule.instructions[i].task;
      r.start = r.waits_done = base[key];
      r.math_done = r.start + 500;
      r.end = r.start + (sm == 2 ? 3000 : 1000);
      trace.records.push_back(r);
    }
  }
  trace.launch_ns = 10000.0 * double(base.size());
  std::map<Opcode, bool> straggled;  // every layer: at least 3 tiles, fewer than half (and some) on SM 2
  for (const auto& [key, count] : tiles) {
    const bool ok = count.first >= 3 && count.second > 0 && 2 * count.second < count.first;
    straggled[key.first] = straggled.count(key.first) ? straggled[key.first] && ok : ok;
  }
  const TraceSummary summary = summarize_trace(graph, schedule, trace);
  size_t checked = 0;
  for (const TraceSummary::LayerPhase& phase : summary.layer_phases) {
    ASSERT_GT(phase.layers, 0u);
    EXPECT_LE(phase.last_sm_layers, phase.layers);
    for (const auto& [opcode, ok] : straggled) {
      if (!ok || opcode_name(opcode) != phase.op) continue;
      EXPECT_DOUBLE_EQ(phase.body_ns, 1000) << phase.op;
      EXPECT_DOUBLE_EQ(phase.tail_ns, 2000) << phase.op;
      EXPECT_EQ(phase.last_sm, 2u) << phase.op;
      EXPECT_EQ(phase.last_sm_layers, phase.layers) << phase.op;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u) << "no op with a straggler to check: change the schedule";
  EXPECT_EQ(summary.layer_phases.size(), straggled.size());
  EXPECT_NE(format_trace_summary(graph, summary, trace).find("per layer"), std::string::npos);
}

// A decode step's HBM-idle gaps on a hand-timed trace: with every tile 1 us back to back, the gaps are exactly the
// runs of tiles that stream nothing from HBM (the embedding, the combines, the sample), each named by its op and
// added up by the streaming ops around it (a combine's between attention and o_proj in every layer); a forward pass
// has none.
TEST(TraceSummary, NamesTheHbmIdleGapsOfADecodeStep) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {2, 1, PassKind::kDecode, 256});
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 1);
  const Trace trace = back_to_back(schedule);
  size_t gaps = 0, idle_tiles = 0;
  bool previous_idle = false;
  for (const Instruction& in : schedule.instructions) {
    const bool idle = in.opcode == Opcode::kEmbed || in.opcode == Opcode::kDecodeCombine || in.opcode == Opcode::kSample;
    idle_tiles += idle;
    gaps += idle && !previous_idle;
    previous_idle = idle;
  }
  const TraceSummary summary = summarize_trace(graph, schedule, trace);
  ASSERT_GT(gaps, 2u);
  EXPECT_EQ(summary.hbm_gaps, gaps);
  EXPECT_DOUBLE_EQ(summary.hbm_idle_ns, 1000.0 * double(idle_tiles));
  ASSERT_FALSE(summary.longest_hbm_gaps.empty());
  for (const TraceSummary::HbmGap& gap : summary.longest_hbm_gaps) {
    ASSERT_FALSE(gap.during.empty());
    EXPECT_TRUE(gap.during[0] == "embed" || gap.during[0].rfind("decode_combine", 0) == 0 || gap.during[0] == "sample")
        << gap.during[0];
  }
  std::map<std::pair<std::string, std::string>, size_t> between;  // (before, after) -> gaps
  size_t gaps_between = 0;
  double idle_between = 0;
  for (const TraceSummary::HbmGapsBetween& t : summary.hbm_gaps_between) {
    between[{t.before, t.after}] = t.gaps;
    gaps_between += t.gaps;
    idle_between += t.idle_ns;
  }
  EXPECT_EQ(gaps_between, gaps);
  EXPECT_DOUBLE_EQ(idle_between, summary.hbm_idle_ns);
  ASSERT_EQ(between.size(), 3u) << "the embedding's gap, the combines' and the sample's";
  EXPECT_EQ(between.count({"(start)", "decode_q"}) + between.count({"(start)", "decode_kv"}), 1u);
  EXPECT_EQ(between.at({"decode_attention", "decode_o_proj"}), size_t(config.n_layers));
  EXPECT_EQ(between.at({"decode_lm_head", "(end)"}), 1u);
  const std::string text = format_trace_summary(graph, summary, trace);
  EXPECT_NE(text.find("HBM-idle gaps"), std::string::npos);
  EXPECT_NE(text.find("gaps: decode_attention -> decode_o_proj"), std::string::npos) << text;

  const Graph forward(config, {1, 32});
  const Schedule forward_schedule =
      make_schedule(forward, derive_dependencies(forward), SchedulePolicy::kRoundRobin, 1);
  EXPECT_TRUE(summarize_trace(forward, forward_schedule, back_to_back(forward_schedule)).longest_hbm_gaps.empty());
}

// A decode step's attention chain on a hand-timed trace: in layer l the tiles of q end by 10 l + 1 us, kv by + 1.2
// (the chain starts at the later), attention by + 3, the combines by + 4.5, o_proj by + 8, each op's tiles of its own
// length, and in each op the second tile listed is the one that ends last; so the chain takes 1.8, 1.5 and 3.5 us a
// layer. A forward pass has none.
TEST(TraceSummary, MeasuresTheAttentionChainOfEachLayer) {
  const ModelConfig config = find_preset("tiny").config;
  const Graph graph(config, {2, 1, PassKind::kDecode, 256});
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 3);
  struct Timing {
    double last_end, length;
  };
  const std::map<Opcode, Timing> timing = {{Opcode::kDecodeQ, {1000, 700}},
                                           {Opcode::kDecodeKv, {1200, 900}},
                                           {Opcode::kDecodeAttention, {3000, 1300}},
                                           {Opcode::kDecodeCombine, {4500, 400}},
                                           {Opcode::kDecodeOProj, {8000, 2100}}};
  Trace trace = back_to_back(schedule);
  std::map<std::pair<Opcode, uint16_t>, int> seen;  // (op, layer) -> its tiles so far
  for (TraceRecord& r : trace.records) {
    const Task& task = graph.tasks()[r.task];
    if (task.layer == kNoLayer || !timing.count(task.opcode)) continue;
    const int n = seen[{task.opcode, task.layer}]++;
    r.end = 10000.0 * task.layer + timing.at(task.opcode).last_end - (n == 1 ? 0.0 : 100.0 + n);
    r.start = r.waits_done = r.end - timing.at(task.opcode).length;
    r.math_done = r.end - 100;
  }
  for (const auto& [key, tiles] : seen) ASSERT_GE(tiles, 2) << opcode_name(key.first) << " L" << key.second;
  const TraceSummary summary = summarize_trace(graph, schedule, trace);
  EXPECT_EQ(summary.attention_chain.layers, size_t(config.n_layers));
  EXPECT_DOUBLE_EQ(summary.attention_chain.to_attention_ns, 1800);
  EXPECT_DOUBLE_EQ(summary.attention_chain.to_combine_ns, 1500);
  EXPECT_DOUBLE_EQ(summary.attention_chain.to_o_proj_ns, 3500);
  EXPECT_NE(format_trace_summary(graph, summary, trace).find("6.80 in all"), std::string::npos);

  const Graph forward(config, {1, 32});
  const Schedule forward_schedule =
      make_schedule(forward, derive_dependencies(forward), SchedulePolicy::kRoundRobin, 1);
  const Trace forward_trace = back_to_back(forward_schedule);
  const TraceSummary forward_summary = summarize_trace(forward, forward_schedule, forward_trace);
  EXPECT_EQ(forward_summary.attention_chain.layers, 0u);
  EXPECT_EQ(format_trace_summary(forward, forward_summary, forward_trace).find("attention chain"), std::string::npos);
}

// A linked decode combine runs on the SM of its group's last attention task: its record keeps its place in its listing
// SM's list but is counted, and drawn, on the SM that ran it.
TEST(TraceSummary, ACombineCountsOnTheSmThatRanIt) {
  const Graph graph(find_preset("tiny").config, {2, 1, PassKind::kDecode, 256});
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kRoundRobin, 3);
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = schedule.num_sms;
  size_t combine = SIZE_MAX;
  for (int32_t sm = 0; sm < schedule.num_sms; ++sm) {
    for (uint32_t i = schedule.sm_begin[sm]; i < schedule.sm_begin[sm + 1]; ++i) {
      TraceRecord r;
      r.sm = uint32_t(sm);
      r.index = i - schedule.sm_begin[sm];
      r.task = schedule.instructions[i].task;
      r.start = r.waits_done = 1000.0 * double(r.index);
      r.math_done = r.start + 500;
      r.end = r.start + 1000;
      if (combine == SIZE_MAX && sm == 1 && schedule.instructions[i].opcode == Opcode::kDecodeCombine)
        combine = trace.records.size();
      trace.records.push_back(r);
    }
  }
  ASSERT_NE(combine, SIZE_MAX) << "no combine on SM 1: change the schedule";
  trace.launch_ns = 1e9;
  const TraceSummary listed = summarize_trace(graph, schedule, trace);
  trace.records[combine].ran_on_sm = 2;
  const TraceSummary ran = summarize_trace(graph, schedule, trace);
  EXPECT_DOUBLE_EQ(ran.sms[1].busy_ns, listed.sms[1].busy_ns - 1000);
  EXPECT_DOUBLE_EQ(ran.sms[2].busy_ns, listed.sms[2].busy_ns + 1000);
  size_t moved = 0;
  const nlohmann::json document = nlohmann::json::parse(trace_to_chrome_json(graph, trace));
  for (const nlohmann::json& event : document["traceEvents"]) {
    if (event["ph"] != "X" || !event["args"].contains("listed_on_sm")) continue;
    EXPECT_EQ(event["pid"], 2);
    EXPECT_EQ(event["args"]["listed_on_sm"], 1);
    ++moved;
  }
  EXPECT_GT(moved, 0u);
  // Made the step's last record, the combine's critical path steps to what ran before it on SM 2, not on SM 1.
  TraceRecord& combine_record = trace.records[combine];
  combine_record.start = combine_record.waits_done = 1e7;
  combine_record.math_done = combine_record.end = 1e7 + 1000;
  const TraceRecord* before = nullptr;
  for (const TraceRecord& r : trace.records)
    if (&r != &combine_record && ran_on(r) == 2 && (before == nullptr || r.end > before->end)) before = &r;
  ASSERT_NE(before, nullptr);
  const std::vector<uint32_t> path = summarize_trace(graph, schedule, trace).critical_path;
  ASSERT_GE(path.size(), 2u);
  EXPECT_EQ(path.back(), combine_record.task);
  EXPECT_EQ(path[path.size() - 2], before->task);
}

}  // namespace
}  // namespace mk
