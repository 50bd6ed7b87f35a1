// Tests of the tiling that spreads a decode step: each decode GEMM phase, the LM head and the kv splits in one round
// of the SMs the step runs on (RunShape::decode_spread).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "mk/generate.h"
#include "mk/kv_cache.h"
#include "mk/ops.h"
#include "mk/program.h"
#include "mk/tiles.h"

namespace mk {
namespace {

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
// above (the tensor cores and wgmma), several passes included.
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

// The GPU's decode GEMMs take output pair p of a tile as its columns col_begin + 2p and + 1, one RoPE pair's even and
// odd column (decode_weight_rows): every such tile must start at an even column, at every batch and context.
TEST(DecodeGraph, PairedGemmTilesStartAtEvenColumns) {
  for (const char* preset : {"tiny", "llama-3.2-1b", "llama-3.1-8b"}) {
    const ModelConfig config = find_preset(preset).config;
    for (const int64_t batch : {1, 2, 8, 17, 32, 64, 70}) {
      for (const int64_t context : {128, 1024}) {
        const Graph graph(config, RunShape{batch, 1, PassKind::kDecode, context});
        int64_t paired = 0;
        for (const Task& t : graph.tasks()) {
          if (t.opcode != Opcode::kDecodeQ && t.opcode != Opcode::kDecodeKv && t.opcode != Opcode::kDecodeOProj &&
              t.opcode != Opcode::kDecodeDown && t.opcode != Opcode::kDecodeLmHead)
            continue;
          ++paired;
          ASSERT_EQ(t.col_begin % 2, 0) << preset << " batch " << batch << " context " << context << ": "
                                        << opcode_name(t.opcode) << " tile at column " << t.col_begin;
        }
        EXPECT_GT(paired, 0) << preset << " batch " << batch;
      }
    }
  }
}

}  // namespace
}  // namespace mk
