// Tests of the prefill and decode graphs: their buffers, the regions of their ops (the cache included), the
// verifier and the race detector on decode schedules, schedule files, and the fused o_proj combine (the tiling that
// spreads a decode step: test_decode_tiles.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "graph_text.h"
#include "mk/cpu_vm.h"
#include "mk/generate.h"
#include "mk/kv_cache.h"
#include "mk/ops.h"
#include "mk/tiles.h"
#include "mk/program.h"
#include "mk/random.h"
#include "test_models.h"
#include "test_util.h"

namespace mk {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing_util::regions_of;

const RunShape kTinyDecode{2, 1, PassKind::kDecode, 256};

TEST(DecodeGraph, BuffersOfEachPass) {
  const ModelConfig config = find_preset("tiny").config;
  std::vector<std::string> names;
  const BufferTable decode(config, kTinyDecode);
  for (const Buffer& b : decode.buffers()) names.push_back(b.name() + fmt::format(" {}x{}", b.rows, b.cols));
  // tiny: q_dim 256, kv_dim 128, 2 kv heads of 64; 2 KV blocks of 128 per sequence, one split each.
  EXPECT_THAT(names, ElementsAre("tokens 2x1", "hidden[0] 2x256", "hidden[1] 2x256", "hidden[2] 2x256", "attn[0] 2x256",
                                 "attn[1] 2x256", "hidden_mid[0] 2x256", "hidden_mid[1] 2x256", "act[0] 2x512",
                                 "act[1] 2x512", "logits 2x384", "kv_cache[0] 512x256",
                                 "kv_cache[1] 512x256", "q[0] 2x256", "q[1] 2x256", "attn_partial[0] 4x272",
                                 "attn_partial[1] 4x272", "positions 2x1", "sampled 2x1"));
  const BufferTable prefill(config, {2, 40, PassKind::kPrefill, 256});
  EXPECT_FALSE(prefill.has(BufferKind::kLogits));
  EXPECT_EQ(prefill.buffers()[prefill.id(BufferKind::kKvCache, 1)].rows, 512);
  EXPECT_EQ(prefill.buffers()[prefill.id(BufferKind::kQkv, 1)].rows, 80);
  EXPECT_FALSE(BufferTable(config, {2, 40}).has(BufferKind::kKvCache)) << "a forward pass has no cache";
  EXPECT_EQ(output_of_pass(config, PassKind::kDecode).kind, BufferKind::kSampled);
  EXPECT_EQ(output_of_pass(config, PassKind::kPrefill).kind, BufferKind::kHidden);
}

TEST(DecodeGraph, RegionsOfTheTinyDecodeStep) {
  const Graph graph(find_preset("tiny").config, kTinyDecode);
  // Decode GEMM tiles are 16 columns wide: qkv's 512 columns alone could not spread over 132 SMs otherwise.
  EXPECT_THAT(regions_of(graph, Opcode::kDecodeQ, 0, 0, 16),
              ElementsAre("write q[0] rows [0,2) cols [16,32)", "read hidden[0] rows [0,2) cols [0,256)",
                          "read positions rows [0,2) cols [0,1)"));
  // kv rows are cache rows: the batch's whole cache slices, of which each task writes the fed positions' rows.
  EXPECT_THAT(regions_of(graph, Opcode::kDecodeKv, 1, 0, 0),
              ElementsAre("write kv_cache[1] rows [0,512) cols [0,16)", "read hidden[1] rows [0,2) cols [0,256)",
                          "read positions rows [0,2) cols [0,1)"));
  // Sequence 1, split 1 (block 1), kv head 1: its 2 query heads' records (68 floats each) at column 136; its q
  // heads, and the sequence's whole cache for the kv head: K at 64, V at 128 + 64.
  EXPECT_THAT(regions_of(graph, Opcode::kDecodeAttention, 0, 3, 136),
              ElementsAre("write attn_partial[0] rows [3,4) cols [136,272)", "read q[0] rows [1,2) cols [128,256)",
                          "read kv_cache[0] rows [256,512) cols [64,128)",
                          "read kv_cache[0] rows [256,512) cols [192,256)", "read positions rows [1,2) cols [0,1)"));
  EXPECT_THAT(regions_of(graph, Opcode::kDecodeCombine, 0, 0, 128),
              ElementsAre("write attn[0] rows [0,1) cols [128,256)", "read attn_partial[0] rows [0,2) cols [136,272)",
                          "read positions rows [0,1) cols [0,1)"));
  EXPECT_THAT(regions_of(graph, Opcode::kDecodeOProj, 0, 0, 16),
              ElementsAre("write hidden_mid[0] rows [0,2) cols [16,32)", "read attn[0] rows [0,2) cols [0,256)",
                          "read hidden[0] rows [0,2) cols [16,32)"));
  EXPECT_THAT(regions_of(graph, Opcode::kSample, kNoLayer, 1, 0),
              ElementsAre("write sampled rows [1,2) cols [0,1)", "read logits rows [1,2) cols [0,384)",
                          "read positions rows [1,2) cols [0,1)"));
  const Graph prefill(find_preset("tiny").config, {2, 40, PassKind::kPrefill, 256});
  EXPECT_THAT(regions_of(prefill, Opcode::kKvAppend, 0, 256 + 32, 0),
              ElementsAre("write kv_cache[0] rows [288,296) cols [0,256)", "read qkv[0] rows [72,80) cols [256,512)"));
}

TEST(DecodeGraph, TasksTileEachDecodeStepAndTheirWorkAddsUp) {
  Random random(29);
  for (int trial = 0; trial < 6; ++trial) {
    ModelConfig config = random_small_config(random);
    config.has_embedding = config.has_lm_head = true;
    const RunShape shape{1 + int64_t(random.next_u64() % 12), 1, PassKind::kDecode,
                         1 + int64_t(random.next_u64() % 700)};
    const Graph graph(config, shape);
    SCOPED_TRACE(describe(config) + " " + describe(shape));
    size_t next = 0;
    double flops = 0;
    for_each_step(config, PassKind::kDecode, [&](const OpDescriptor& op, uint16_t layer) {
      const Buffer& out = graph.buffers()[graph.buffer_table().id(op.output(layer))];
      double area = 0;
      for (;
           next < graph.tasks().size() && graph.tasks()[next].opcode == op.opcode && graph.tasks()[next].layer == layer;
           ++next) {
        const Task& t = graph.tasks()[next];
        area += double(t.row_end - t.row_begin) * double(t.col_end - t.col_begin);
        flops += graph.work(t).flops;
      }
      EXPECT_EQ(area, double(out.rows) * double(out.cols)) << op.name << " L" << layer;
    });
    EXPECT_EQ(next, graph.tasks().size());
    EXPECT_NEAR(flops, forward_cost(config, shape).flops, 1e-9 * flops);
  }
}

TEST(DecodeGraph, SchedulesVerifyAndFilesKeepThePass) {
  Random random(23);
  for (int trial = 0; trial < 6; ++trial) {
    ModelConfig config = random_small_config(random);
    config.has_embedding = config.has_lm_head = true;
    const int64_t batch = 1 + int64_t(random.next_u64() % 9);
    for (const RunShape& shape :
         {RunShape{batch, 1, PassKind::kDecode, 300, 3 + trial}, RunShape{batch, 37, PassKind::kPrefill, 300}}) {
      const Graph graph(config, shape);
      const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy(trial % 2), 3 + trial);
      EXPECT_NO_THROW(verify_schedule(graph, schedule)) << describe(config) << " " << describe(shape);
    }
  }
  testing_util::TempDir dir;
  RunShape shape = kTinyDecode;
  shape.decode_spread = 9;  // tiled for the 9 SMs it is scheduled on
  const Graph graph(find_preset("tiny").config, shape);
  save_schedule(dir.path() / "decode.sched", graph,
                make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 9));
  const LoadedSchedule loaded = load_schedule(dir.path() / "decode.sched");
  EXPECT_EQ(loaded.shape, shape);
  EXPECT_NO_THROW(verify_schedule(graph, loaded.schedule));
  // Refused for the default spread's graph, the mismatch named; a spread outside [1, 4096] is refused by name, and
  // shapes of any pass that differ in the spread alone are described apart.
  const Graph default_spread(find_preset("tiny").config, kTinyDecode);
  EXPECT_THAT([&] { load_schedule(dir.path() / "decode.sched", default_spread); },
              testing::ThrowsMessage<Error>(HasSubstr("a round of 9 tiles, not decode: batch 2, max context 256")));
  for (int64_t spread : {int64_t(0), int64_t(-1), kMaxDecodeSpread + 1}) {
    const RunShape bad{1, 1, PassKind::kDecode, 128, spread};
    EXPECT_THAT([&] { bad.validate(); },
                testing::ThrowsMessage<Error>(HasSubstr(fmt::format("decode spread {} is outside", spread))));
  }
  const RunShape forward{2, 8}, forward_spread{2, 8, PassKind::kForward, 0, 7};
  EXPECT_NE(describe(forward_spread), describe(forward));
}

// Drops the waits of the first layer-1 decode attention task on the decode_kv counter: it may then read the cache
// before this step's K and V are in it.
class PlantedDecodeBug : public ::testing::Test {
 protected:
  void SetUp() override {
    const Dependencies deps = derive_dependencies(graph_);
    schedule_ = make_schedule(graph_, deps, SchedulePolicy::kCostModel, 6);
    uint32_t kv_counter = UINT32_MAX;
    for (const Instruction& in : schedule_.instructions)
      if (in.opcode == Opcode::kDecodeKv && in.layer == 1) kv_counter = in.signal_counter;
    for (Instruction& in : schedule_.instructions) {
      if (in.opcode != Opcode::kDecodeAttention || in.layer != 1) continue;
      std::vector<Wait> kept;
      for (uint32_t k = 0; k < in.num_waits; ++k)
        if (schedule_.waits[in.wait_begin + k].counter != kv_counter)
          kept.push_back(schedule_.waits[in.wait_begin + k]);
      ASSERT_EQ(kept.size() + 1, in.num_waits);
      in.wait_begin = uint32_t(schedule_.waits.size());
      in.num_waits = uint32_t(kept.size());
      schedule_.waits.insert(schedule_.waits.end(), kept.begin(), kept.end());
      break;
    }
  }
  ModelConfig config_ = find_preset("tiny").config;
  Graph graph_{config_, kTinyDecode};
  Schedule schedule_;
};

TEST_F(PlantedDecodeBug, VerifierRejectsIt) {
  EXPECT_THAT(
      [&] { verify_schedule(graph_, schedule_); },
      testing::ThrowsMessage<Error>(testing::AllOf(HasSubstr("decode_attention L1"), HasSubstr("reads kv_cache[1]"),
                                                   HasSubstr("written by"), HasSubstr("decode_kv L1"))));
}

TEST_F(PlantedDecodeBug, RaceDetectorExposesIt) {
  const ModelWeights weights = random_weights(config_, 1);
  std::vector<ref::Matrix> cache = ref::make_kv_cache(config_, kTinyDecode);
  CpuVmSession session(graph_, schedule_, weights, {}, &cache);
  ref::ModelInput input;
  input.shape = kTinyDecode;
  input.tokens = {1, 2};
  input.positions = {0, 0};
  session.set_input(input);
  EXPECT_THAT([&] { session.launch(); }, testing::ThrowsMessage<Error>(HasSubstr("race: reads kv_cache[1]")));
}

// Every decode attention task is linked to the combine of its layer, sequence and kv head, which is flagged to be run
// by the last of them on the GPU; per-op-launch steps keep the links; other passes have none.
TEST(DecodeGraph, CombinesAreLinkedToTheirAttentionTasks) {
  const Graph graph(find_preset("tiny").config, kTinyDecode);
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 5);
  const int64_t splits = kv_split(graph.config(), graph.shape()).splits;
  ASSERT_EQ(splits, 2) << "sequences of 2 KV blocks, a split each: a group of two tickets";
  std::map<uint32_t, int64_t> links;
  int64_t combines = 0;
  for (const Instruction& in : schedule.instructions) {
    if (in.opcode == Opcode::kDecodeCombine) {
      EXPECT_EQ(in.flags, kCombineRunByLastAttention);
      ++combines;
    }
    if (in.opcode != Opcode::kDecodeAttention) {
      EXPECT_EQ(in.flags & kAttentionRunsCombine, 0) << graph.describe(graph.tasks()[in.task]);
      continue;
    }
    ASSERT_EQ(in.flags, kAttentionRunsCombine);
    const Instruction& combine = schedule.instructions.at(in.combine_instruction);
    EXPECT_EQ(combine.opcode, Opcode::kDecodeCombine);
    EXPECT_EQ(std::tuple(combine.layer, combine.sequence, combine.head), std::tuple(in.layer, in.sequence, in.head));
    EXPECT_EQ(in.combine_counter, combine.signal_counter);
    ++links[in.combine_instruction];
  }
  EXPECT_EQ(int64_t(links.size()), combines);
  for (const auto& [combine, count] : links) EXPECT_EQ(count, splits) << "combine instruction " << combine;
  for (const Schedule& step : split_schedule_by_step(graph, schedule)) {
    for (const Instruction& in : step.instructions) {
      EXPECT_EQ(in.flags, in.opcode == Opcode::kDecodeCombine     ? kCombineRunByLastAttention
                          : in.opcode == Opcode::kDecodeAttention ? kAttentionRunsCombine
                                                                  : 0);
    }
  }
  const Graph forward(find_preset("tiny").config, {2, 8});
  const Schedule forward_schedule = make_schedule(forward, derive_dependencies(forward), SchedulePolicy::kCostModel, 5);
  for (const Instruction& in : forward_schedule.instructions) EXPECT_EQ(in.flags, 0);
}

// On the GPU nothing but a linked combine, which runs inside the group's last attention task instead of waiting, waits
// on a linked attention task's own counter, and no other op signals it: the group's ticket is what carries the
// partials (run_combine_if_last), so the tasks' publication orders nothing another SM reads. Checked on tiny and on the
// 1B shape at batches 1 and 8 (kv heads split 8 and 2 ways at 1k positions).
TEST(DecodeGraph, LinkedAttentionCountersAreWaitedOnByTheirCombinesAlone) {
  const std::pair<const char*, RunShape> shapes[] = {{"tiny", kTinyDecode},
                                                     {"llama-3.2-1b", {1, 1, PassKind::kDecode, 1024}},
                                                     {"llama-3.2-1b", {8, 1, PassKind::kDecode, 1024}}};
  for (const auto& [preset, shape] : shapes) {
    SCOPED_TRACE(fmt::format("{} {}", preset, describe(shape)));
    const Graph graph(find_preset(preset).config, shape);
    const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 132);
    ASSERT_GT(kv_split(graph.config(), graph.shape()).splits, 1) << "groups of several tickets";
    std::map<uint32_t, int64_t> attention_signals;  // a linked attention counter: the tasks that signal it
    for (const Instruction& in : schedule.instructions)
      if (in.flags & kAttentionRunsCombine) ++attention_signals[in.signal_counter];
    ASSERT_FALSE(attention_signals.empty());
    int64_t waits_on_attention = 0;
    for (const Instruction& in : schedule.instructions) {
      if (attention_signals.contains(in.signal_counter)) {
        EXPECT_NE(in.flags & kAttentionRunsCombine, 0) << graph.describe(graph.tasks()[in.task]) << " signals it";
      }
      for (uint32_t w = in.wait_begin; w < in.wait_begin + in.num_waits; ++w) {
        if (!attention_signals.contains(schedule.waits.at(w).counter)) continue;
        ++waits_on_attention;
        EXPECT_EQ(in.flags, kCombineRunByLastAttention) << graph.describe(graph.tasks()[in.task]) << " waits on it";
      }
    }
    EXPECT_GT(waits_on_attention, 0) << "the combines wait on their attention tasks' counters (the verifier's model)";
  }
}

// A broken link would have the GPU run a combine before its partials are written, signal the wrong counter, or run it
// never: the verifier names each.
TEST(DecodeGraph, VerifierRejectsBrokenCombineLinks) {
  const Graph graph(find_preset("tiny").config, kTinyDecode);
  const Schedule linked = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 5);
  auto first = [&](Schedule& s, Opcode opcode, int32_t sequence) -> Instruction& {
    for (Instruction& in : s.instructions)
      if (in.opcode == opcode && (sequence < 0 || in.sequence == sequence)) return in;
    throw Error("no such instruction");
  };
  const struct {
    const char* broken;
    std::function<void(Schedule&)> edit;
    const char* message;
  } cases[] = {
      {"another group's combine",
       [&](Schedule& s) {
         const uint32_t other = first(s, Opcode::kDecodeAttention, 1).combine_instruction;
         first(s, Opcode::kDecodeAttention, 0).combine_instruction = other;
       },
       "the combine of another layer, sequence or kv head"},
      {"another counter", [&](Schedule& s) { first(s, Opcode::kDecodeAttention, 0).combine_counter += 1; },
       "links counter"},
      {"a combine past the end",
       [&](Schedule& s) {
         first(s, Opcode::kDecodeAttention, 0).combine_instruction = uint32_t(s.instructions.size());
       },
       "links combine instruction"},
      {"an unlinked task of a linked combine's group",
       [&](Schedule& s) { first(s, Opcode::kDecodeAttention, 0).flags = 0; },
       "but 1 of the 2 tasks of its group link it"},
      {"a link to another op",
       [&](Schedule& s) {
         Instruction& attention = first(s, Opcode::kDecodeAttention, 0);
         attention.combine_instruction = uint32_t(&first(s, Opcode::kDecodeOProj, -1) - s.instructions.data());
       },
       "which is not a decode combine"},
      {"an unlinked combine", [&](Schedule& s) { first(s, Opcode::kDecodeCombine, -1).flags = 0; },
       "a decode combine not linked to its attention tasks"},
      {"a flag on a GEMM", [&](Schedule& s) { first(s, Opcode::kDecodeOProj, -1).flags = kCombineRunByLastAttention; },
       "which its opcode cannot have"},
      {"a combine that waits for more than its sequence's attention",
       [&](Schedule& s) {
         Instruction& combine = first(s, Opcode::kDecodeCombine, -1);
         std::vector<Wait> waits(s.waits.begin() + combine.wait_begin,
                                 s.waits.begin() + combine.wait_begin + combine.num_waits);
         const uint32_t q_counter = first(s, Opcode::kDecodeQ, -1).signal_counter;
         waits.push_back({q_counter, 1});
         combine.wait_begin = uint32_t(s.waits.size());
         combine.num_waits = uint32_t(waits.size());
         s.waits.insert(s.waits.end(), waits.begin(), waits.end());
       },
       "which not only its sequence's attention tasks signal"},

  };
  for (const auto& c : cases) {
    Schedule schedule = linked;
    c.edit(schedule);
    EXPECT_THAT([&] { verify_schedule(graph, schedule); }, testing::ThrowsMessage<Error>(HasSubstr(c.message)))
        << c.broken;
  }
  EXPECT_NO_THROW(verify_schedule(graph, linked));
  // The gpu engine checks the links of unverified schedules too, where nothing else checked an instruction's fields.
  Schedule unfaithful = linked;
  first(unfaithful, Opcode::kDecodeAttention, 0).head += 1;
  EXPECT_THAT([&] { check_combine_links(graph, unfaithful); },
              testing::ThrowsMessage<Error>(HasSubstr("whose fields are not its task's")));
}

// decode_o_proj_combine is decode_combine then decode_o_proj in one task: the same bits from the same partials.
TEST(DecodeOps, OProjCombineEqualsCombineThenOProjBitForBit) {
  const ModelConfig config = find_preset("tiny").config;
  const ModelWeights weights = random_weights(config, 5);
  const BufferTable table(config, kTinyDecode);
  const ref::ModelOperands operands(weights, 1, kTinyDecode.max_context);
  ref::ModelInput input;
  input.shape = kTinyDecode;
  input.positions = {200, 7};  // a sequence over several KV blocks, and one in its first
  Random random(6);
  std::vector<ref::Matrix> buffers;
  for (const Buffer& buffer : table.buffers()) {
    ref::Matrix values(buffer.rows, buffer.cols);
    for (float& value : values.data) value = float(random.next_u64() % 2001) / 1000.0f - 1.0f;
    buffers.push_back(std::move(values));
  }
  // Partial records need a sum > 0 after their max: blocks read by the combine hold positive sums.
  const int64_t stride = config.head_dim + tiles::kDecodePartialStats;
  for (uint16_t layer = 0; layer < config.n_layers; ++layer) {
    ref::Matrix& partial = buffers[table.id({BufferKind::kAttnPartial, layer})];
    for (int64_t r = 0; r < partial.rows; ++r)
      for (int64_t c = config.head_dim + 1; c < partial.cols; c += stride) partial.row(r)[c] += 2.0f;
  }
  CpuTile cpu{config, operands, input, table, {}};
  for (const ref::Matrix& buffer : buffers) cpu.buffers.push_back(&buffer);
  const OpContext ctx{config, kTinyDecode, table};
  const uint16_t layer = 1;
  ref::Matrix& attn = buffers[table.id({BufferKind::kAttn, layer})];
  const OpDescriptor& combine = op_descriptor(Opcode::kDecodeCombine);
  combine.run_cpu(cpu, whole_output(combine, ctx, layer), attn);
  const OpDescriptor& o_proj = op_descriptor(Opcode::kDecodeOProj);
  ref::Matrix unfused(kTinyDecode.batch, config.d_model), fused(kTinyDecode.batch, config.d_model);
  o_proj.run_cpu(cpu, whole_output(o_proj, ctx, layer), unfused);
  const OpDescriptor& o_proj_combine = op_descriptor(Opcode::kDecodeOProjCombine);
  EXPECT_STREQ(o_proj_combine.name, "decode_o_proj_combine");
  for (int32_t col = 0; col < config.d_model; col += 32) {  // tiles of any width give the same elements
    Task task = whole_output(o_proj_combine, ctx, layer);
    task.col_begin = col;
    task.col_end = col + 32;
    o_proj_combine.run_cpu(cpu, task, fused);
  }
  EXPECT_EQ(fused.data, unfused.data);
  TaskRegions regions;
  o_proj_combine.reads(ctx, whole_output(o_proj_combine, ctx, layer), regions);
  ASSERT_EQ(regions.num_reads, 3);
  EXPECT_EQ(regions.reads[0].buffer, table.id({BufferKind::kAttnPartial, layer}));
  EXPECT_EQ(regions.reads[2].buffer, table.id({BufferKind::kPositions}));
}

}  // namespace
}  // namespace mk
