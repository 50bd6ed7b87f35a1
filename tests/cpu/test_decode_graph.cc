// Tests of the prefill and decode graphs: their buffers, the regions of their ops (the cache included), the
// verifier and the race detector on decode schedules, schedule files, and the tiling that spreads a decode step.
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

// Weight streaming at batch 1 is the whole cost of a decode step: the cost model puts the step near the bandwidth
// floor only because every decode GEMM's tiles spread over the SMs in one round.
TEST(DecodeGraph, ALlama1BStepSpreadsOverEverySm) {
  const ModelConfig config = find_preset("llama-3.2-1b").config;
  const RunShape shape{1, 1, PassKind::kDecode, 1024};
  const Graph graph(config, shape);
  std::map<Opcode, int64_t> tasks_of_layer_0;
  int32_t widest_qkv_tile = 0;
  for (const Task& t : graph.tasks()) {
    if (t.layer == 0) ++tasks_of_layer_0[t.opcode];
    if (t.opcode == Opcode::kDecodeQ || t.opcode == Opcode::kDecodeKv) {
      EXPECT_EQ((t.col_end - t.col_begin) % 8, 0) << "whole units of 8 columns (RoPE pairs)";
      widest_qkv_tile = std::max(widest_qkv_tile, t.col_end - t.col_begin);
    }
  }
  // q and kv share one round of 132 tiles in proportion to their columns (88 and 44), 16 or 24 columns each.
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeQ], 88);
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeKv], 44);
  EXPECT_EQ(widest_qkv_tile, 24);
  // The others: one round on 132 SMs per GEMM, the narrowest power-of-two width giving at most 132 tiles.
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeOProj], 2048 / 16);
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeGateUp], 8192 / 64);
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeDown], 2048 / 16);
  EXPECT_EQ(tasks_of_layer_0[Opcode::kDecodeAttention], 8 * 8) << "8 kv heads x 8 blocks of 1024 positions";
  const Schedule schedule = make_schedule(graph, derive_dependencies(graph), SchedulePolicy::kCostModel, 132);
  // The LM head's 8016 units of 16 columns, 60 or 61 an SM (1002 tiles of 128 gave 54 SMs 56 units, 78 SMs 64).
  std::vector<int64_t> lm_head_units(132, 0);
  for (int32_t sm = 0; sm < schedule.num_sms; ++sm) {
    for (uint32_t i = schedule.sm_begin[size_t(sm)]; i < schedule.sm_begin[size_t(sm) + 1]; ++i) {
      const Instruction& in = schedule.instructions[i];
      if (in.opcode == Opcode::kDecodeLmHead) lm_head_units[size_t(sm)] += (in.col_end - in.col_begin) / 16;
    }
  }
  EXPECT_EQ(*std::min_element(lm_head_units.begin(), lm_head_units.end()), 60);
  EXPECT_EQ(*std::max_element(lm_head_units.begin(), lm_head_units.end()), 61);
  const double floor_ns = forward_cost(config, shape).weights_read / 4200.0;  // 4.2 TB/s: 4200 bytes per ns
  const double makespan_ns = estimate_schedule(graph, schedule).makespan_ns;
  EXPECT_GT(makespan_ns, floor_ns);
  EXPECT_LT(makespan_ns, 1.6 * floor_ns) << "estimated " << makespan_ns / 1e3 << " us, floor " << floor_ns / 1e3;
}

// Llama-3.1-8B's gate_up (14336 columns) made 112 uniform tiles of 128 columns, 20 SMs idle in its phase, and its q
// and kv 96 of 64: they take one round of 132 spread tiles, in units of 8 columns at batch 1 (the CUDA cores) and 16
// above (the tensor cores), wide passes and several passes included.
TEST(DecodeGraph, ALlama8BSpreadsItsGateUpAndQkvOverEverySm) {
  const ModelConfig config = find_preset("llama-3.1-8b").config;
  using Widths = std::map<int32_t, int64_t>;  // tile width -> tiles of layer 0
  const auto widths_of = [&](int64_t batch, Opcode opcode) {
    Widths widths;
    const Graph graph(config, {batch, 1, PassKind::kDecode, 1024});
    for (const Task& t : graph.tasks())
      if (t.layer == 0 && t.opcode == opcode && t.row_begin == 0) ++widths[t.col_end - t.col_begin];
    return widths;
  };
  EXPECT_EQ(widths_of(1, Opcode::kDecodeGateUp), (Widths{{104, 56}, {112, 76}}));
  EXPECT_EQ(widths_of(8, Opcode::kDecodeGateUp), (Widths{{96, 28}, {112, 104}}));
  EXPECT_EQ(widths_of(16, Opcode::kDecodeGateUp), (Widths{{96, 28}, {112, 104}}));
  EXPECT_EQ(widths_of(17, Opcode::kDecodeGateUp), (Widths{{96, 28}, {112, 104}}));
  EXPECT_EQ(widths_of(64, Opcode::kDecodeGateUp), (Widths{{96, 28}, {112, 104}}));
  EXPECT_EQ(widths_of(8, Opcode::kDecodeQ), (Widths{{32, 8}, {48, 80}}));
  EXPECT_EQ(widths_of(8, Opcode::kDecodeKv), (Widths{{32, 4}, {48, 40}}));
  EXPECT_EQ(widths_of(64, Opcode::kDecodeQ), (Widths{{32, 8}, {48, 80}}));
  EXPECT_EQ(widths_of(8, Opcode::kDecodeDown), (Widths{{32, 128}})) << "spreading would not narrow it";
}

// Above batch 1 the 1B shape's q and kv keep uniform tiles of 32 columns: spread units of kDecodeMinBlockN columns
// (the tensor cores' two groups; batch 2 too, measured so) would not narrow them.
TEST(DecodeGraph, ALlama1BSpreadsQAndKvOnlyAtBatch1) {
  const ModelConfig config = find_preset("llama-3.2-1b").config;
  for (int64_t batch : {2, 8}) {
    const Graph graph(config, {batch, 1, PassKind::kDecode, 1024});
    int64_t qkv_tiles = 0;
    for (const Task& t : graph.tasks()) {
      if (t.layer != 0 || (t.opcode != Opcode::kDecodeQ && t.opcode != Opcode::kDecodeKv)) continue;
      ++qkv_tiles;
      EXPECT_EQ(t.col_end - t.col_begin, 32) << "batch " << batch;
    }
    EXPECT_EQ(qkv_tiles, 3072 / 32) << "batch " << batch;
  }
}

// Both tiling rules keep a decode phase to one round of RunShape::decode_spread tasks where they can: 132 by default
// (the H200's SMs), what the gpu engine's GPU has otherwise (an H100 PCIe's 114).
TEST(DecodeGraph, TilesAndSplitsFitOneRoundOfSms) {
  EXPECT_EQ(decode_block_n(132 * 16, 132), 16);       // exactly 132 tiles of the narrowest width
  EXPECT_EQ(decode_block_n(132 * 16 + 1, 132), 32);   // one column more would make a 133rd
  EXPECT_EQ(decode_block_n(132 * 128, 132), 128);
  EXPECT_EQ(decode_block_n(132 * 128 + 8, 132), 128);  // wider than one round of the widest tiles: the widest
  EXPECT_EQ(decode_block_n(132 * 16, 114), 32);        // 132 tiles of 16 would be a round and 18 more on 114 SMs
  const ModelConfig config = find_preset("llama-3.2-1b").config;  // 8 kv heads
  const auto splits = [&](int64_t batch, int64_t context, int64_t spread = 132) {
    return kv_split(config, {batch, 1, PassKind::kDecode, context, spread}).splits;
  };
  EXPECT_EQ(splits(1, 1024), 8) << "132 / 8 pairs allows 16, but there are only 8 blocks";
  EXPECT_EQ(splits(1, 4096), 16);
  EXPECT_EQ(splits(1, 4096, 114), 14);
  EXPECT_EQ(splits(8, 1024), 2) << "64 pairs: 3 splits would make 192 tasks, two rounds";
  EXPECT_EQ(splits(17, 1024), 1) << "136 pairs: one split, more than one round is then unavoidable";
  EXPECT_EQ(kv_split(config, {8, 1, PassKind::kDecode, 1024}).blocks_per_split, 4);
  // A step for 114 SMs: every phase of a layer, and the LM head, one round of at most 114 tasks.
  for (int64_t batch : {1, 8}) {
    const Graph graph(config, RunShape{batch, 1, PassKind::kDecode, 4096, 114});
    std::map<Opcode, int64_t> tasks;  // opcode -> tasks of layer 0 (the LM head: of the whole step)
    for (const Task& t : graph.tasks())
      if (t.layer == 0 || t.opcode == Opcode::kDecodeLmHead) ++tasks[t.opcode];
    for (const auto& [opcode, count] : tasks) EXPECT_LE(count, 114) << opcode_name(opcode) << ", batch " << batch;
    EXPECT_EQ(tasks[Opcode::kDecodeLmHead], 114) << "batch " << batch;
  }
}

// The LM head's decode tiles of `config` at `batch`: each row block's tiles cover every logit once, in whole
// 16-column units but for a narrower last tile, widths within a unit of each other and the wider first, as many as
// the units allow up to one round of 132. Returns the count of tiles of each width.
std::map<int32_t, int64_t> expect_balanced_lm_head_tiles(const ModelConfig& config, int64_t batch) {
  SCOPED_TRACE(fmt::format("vocab {}, batch {}", config.vocab_size, batch));
  const RunShape shape{batch, 1, PassKind::kDecode, 64};
  const Graph graph(config, shape);
  const int64_t n = config.vocab_size, units = (n + 15) / 16, row_blocks = (batch + 127) / 128;
  std::vector<std::vector<const Task*>> of_block(static_cast<size_t>(row_blocks));
  for (const Task& t : graph.tasks())
    if (t.opcode == Opcode::kDecodeLmHead) of_block[size_t(t.row_begin / 128)].push_back(&t);
  const OpContext ctx{config, shape, graph.buffer_table()};
  EXPECT_EQ(op_descriptor(Opcode::kDecodeLmHead).num_tasks(ctx), row_blocks * int64_t(of_block[0].size()));
  const int64_t count = int64_t(of_block[0].size());
  EXPECT_EQ(count, std::min<int64_t>(units, 132));
  std::map<int32_t, int64_t> widths;
  for (int64_t block = 0; block < row_blocks; ++block) {
    const std::vector<const Task*>& tiles = of_block[size_t(block)];
    EXPECT_EQ(int64_t(tiles.size()), count) << "row block " << block;
    int32_t next = 0;
    for (size_t i = 0; i < tiles.size(); ++i) {
      const Task& t = *tiles[i];
      EXPECT_EQ(t.row_begin, block * 128);
      EXPECT_EQ(t.row_end, std::min<int64_t>(batch, (block + 1) * 128));
      EXPECT_EQ(t.col_begin, next) << "tile " << i << " leaves a gap or overlaps";
      next = t.col_end;
      const int32_t width = t.col_end - t.col_begin, widest = tiles[0]->col_end - tiles[0]->col_begin;
      EXPECT_GT(width, widest - 2 * 16) << "tile " << i;
      if (i + 1 < tiles.size()) {
        EXPECT_EQ(width % 16, 0) << "tile " << i;
        EXPECT_GE(width, widest - 16) << "tile " << i;
      }
      if (i > 0) {
        EXPECT_LE(width, tiles[i - 1]->col_end - tiles[i - 1]->col_begin) << "tile " << i;
      }
      if (block == 0) ++widths[width];
    }
    EXPECT_EQ(next, n);
  }
  return widths;
}

// NOTE: 1002 tiles of 128 on 132 SMs left 54 SMs a tile short of the rest (~17 us idle a step, GPU trace), and 1056
// balanced ones left 1.4-1.7 us between an SM's 8 tiles without weight bytes in flight (decode_ops.h).
TEST(DecodeGraph, LmHeadTilesAreOneBalancedRound) {
  using Widths = std::map<int32_t, int64_t>;
  EXPECT_EQ(expect_balanced_lm_head_tiles(find_preset("llama-3.2-1b").config, 1), (Widths{{960, 36}, {976, 96}}));
  ModelConfig tiny = find_preset("tiny").config;
  EXPECT_EQ(expect_balanced_lm_head_tiles(tiny, 2), (Widths{{16, 24}})) << "384 logits: too few units for 132 tiles";
  tiny.vocab_size = 1000;
  EXPECT_EQ(expect_balanced_lm_head_tiles(tiny, 130), (Widths{{8, 1}, {16, 62}}));
  tiny.vocab_size = 50257;
  EXPECT_EQ(expect_balanced_lm_head_tiles(tiny, 130), (Widths{{353, 1}, {368, 25}, {384, 106}}));
  tiny.vocab_size = 132 * 16 + 16;  // a unit more than a round of the narrowest: a round, one tile of 32
  EXPECT_EQ(expect_balanced_lm_head_tiles(tiny, 1), (Widths{{16, 131}, {32, 1}}));
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
