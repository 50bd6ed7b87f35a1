// Tests of the op descriptors, the buffer table and the layer program: what the graph, the engines and bisect derive
// from them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "mk/check.h"
#include "mk/compare.h"
#include "mk/cpu_vm.h"
#include "mk/graph.h"
#include "mk/program.h"
#include "mk/random.h"
#include "mk/tiles.h"
#include "graph_text.h"
#include "test_models.h"

namespace mk {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Ops, EveryOpcodeHasExactlyOneDescriptor) {
  ASSERT_EQ(op_descriptors().size(), size_t(Opcode::kNumOpcodes) - 1);
  std::set<std::string> names;
  for (int value = 1; value < int(Opcode::kNumOpcodes); ++value) {
    const OpDescriptor& op = op_descriptor(Opcode(value));
    EXPECT_EQ(op.opcode, Opcode(value));
    EXPECT_EQ(&op, &op_descriptors()[size_t(value) - 1]);
    EXPECT_STREQ(opcode_name(Opcode(value)), op.name);
    EXPECT_TRUE(names.insert(op.name).second) << "two ops named " << op.name;
  }
  EXPECT_STREQ(opcode_name(Opcode::kNop), "nop");
  EXPECT_STREQ(opcode_name(Opcode::kNumOpcodes), "invalid");
  EXPECT_THAT([] { op_descriptor(Opcode::kNop); }, testing::ThrowsMessage<Error>(HasSubstr("no op has opcode 0")));
}

using testing_util::regions_of;

TEST(Ops, RegionsOfTheTinyModel) {
  // tiny: d_model 256, d_ff 512, 4 query heads and 2 kv heads of 64 (q | k | v = 256 | 128 | 128), vocab 384.
  const Graph graph(find_preset("tiny").config, {2, 40});
  EXPECT_THAT(regions_of(graph, Opcode::kEmbed, kNoLayer, 64, 0),
              ElementsAre("write hidden[0] rows [64,80) cols [0,256)", "read tokens rows [64,80) cols [0,1)"));
  EXPECT_THAT(regions_of(graph, Opcode::kAttnNorm, 1, 32, 0),
              ElementsAre("write attn_norm[1] rows [32,64) cols [0,256)", "read hidden[1] rows [32,64) cols [0,256)"));
  EXPECT_THAT(regions_of(graph, Opcode::kQkv, 1, 0, 384),
              ElementsAre("write qkv[1] rows [0,80) cols [384,512)", "read attn_norm[1] rows [0,80) cols [0,256)"));
  // Sequence 1, head 3: q columns [192, 256); kv head 1: k at 256 + 64, v at 384 + 64; keys of sequence 1 only.
  EXPECT_THAT(regions_of(graph, Opcode::kAttention, 0, 40, 192),
              ElementsAre("write attn[0] rows [40,80) cols [192,256)", "read qkv[0] rows [40,80) cols [192,256)",
                          "read qkv[0] rows [40,80) cols [320,384)", "read qkv[0] rows [40,80) cols [448,512)"));
  EXPECT_THAT(regions_of(graph, Opcode::kOProj, 0, 0, 128),
              ElementsAre("write hidden_mid[0] rows [0,80) cols [128,256)", "read attn[0] rows [0,80) cols [0,256)",
                          "read hidden[0] rows [0,80) cols [128,256)"));
  EXPECT_THAT(regions_of(graph, Opcode::kGateUp, 1, 0, 384),
              ElementsAre("write act[1] rows [0,80) cols [384,512)", "read mlp_norm[1] rows [0,80) cols [0,256)"));
  EXPECT_THAT(regions_of(graph, Opcode::kDown, 1, 0, 0),
              ElementsAre("write hidden[2] rows [0,80) cols [0,128)", "read act[1] rows [0,80) cols [0,512)",
                          "read hidden_mid[1] rows [0,80) cols [0,128)"));
  EXPECT_THAT(regions_of(graph, Opcode::kFinalNorm, kNoLayer, 0, 0),
              ElementsAre("write final_norm rows [0,32) cols [0,256)", "read hidden[2] rows [0,32) cols [0,256)"));
  EXPECT_THAT(regions_of(graph, Opcode::kLmHead, kNoLayer, 0, 256),
              ElementsAre("write logits rows [0,80) cols [256,384)", "read final_norm rows [0,80) cols [0,256)"));
}

TEST(Ops, GraphTilesTheProgramStepByStepWithTheTileSizes) {
  Random random(3);
  for (int trial = 0; trial < 20; ++trial) {
    const Graph graph{random_small_config(random), random_shape(random, 3, 300)};  // braces: in this order
    const ModelConfig& config = graph.config();
    const OpContext ctx = graph.context();
    SCOPED_TRACE(describe(config) + fmt::format(" batch {} seq {}", graph.shape().batch, graph.shape().seq_len));
    size_t next = 0;
    for_each_step(config, [&](const OpDescriptor& op, uint16_t layer) {
      // The step's tasks come next in the graph and tile the step's whole output exactly once.
      const Buffer& out = graph.buffers()[graph.buffer_table().id(op.output(layer))];
      double area = 0, flops = 0;
      for (; next < graph.tasks().size() && graph.tasks()[next].opcode == op.opcode &&
             graph.tasks()[next].layer == layer;
           ++next) {
        const Task& t = graph.tasks()[next];
        EXPECT_LE(t.row_end - t.row_begin, std::max(tiles::kBlockM, tiles::kBlockRows));
        EXPECT_LE(t.col_end - t.col_begin, std::max<int64_t>(tiles::kWideBlockN, config.d_model));
        area += double(t.row_end - t.row_begin) * double(t.col_end - t.col_begin);
        flops += graph.work(t).flops;
      }
      EXPECT_EQ(area, double(out.rows) * double(out.cols)) << op.name << " L" << layer;
      // Work is additive: the tiles of a step cost what its whole output costs.
      EXPECT_NEAR(flops, op.work(ctx, whole_output(op, ctx, layer)).flops, 1e-9 * flops) << op.name;
    });
    EXPECT_EQ(next, graph.tasks().size()) << "tasks the program does not account for";
  }
}

TEST(Ops, PlainGemmsTakeWideTilesWhenThereAreEnoughOfThem) {
  // The seed (d_model 1024, d_ff 4096, 8 heads of 128): width of each GEMM op's tiles, and every tile that wide.
  auto widths = [](const RunShape& shape) {
    const Graph graph(find_preset("seed").config, shape);
    std::map<std::string, std::set<int32_t>> widths;
    for (const Task& t : graph.tasks()) {
      const std::string name = op_descriptor(t.opcode).name;
      if (name == "qkv" || name == "o_proj" || name == "gate_up" || name == "down")
        widths[name].insert(t.col_end - t.col_begin);
    }
    return widths;
  };
  using Widths = std::map<std::string, std::set<int32_t>>;
  const int32_t narrow = tiles::kBlockN, wide = tiles::kWideBlockN;
  // 16 row blocks: qkv makes 16 x 12 wide tiles (K 1024: fewer than two rounds of 132), o_proj and down 16 x 4;
  // gate_up is always 128 columns.
  EXPECT_EQ(widths({8, 256}),
            (Widths{{"qkv", {narrow}}, {"o_proj", {narrow}}, {"gate_up", {narrow}}, {"down", {narrow}}}));
  // 36 row blocks: qkv 432 wide tiles (two rounds), o_proj 144 at K 1024 (one round: narrow), down 144 at K 4096.
  EXPECT_EQ(widths({18, 256}),
            (Widths{{"qkv", {wide}}, {"o_proj", {narrow}}, {"gate_up", {narrow}}, {"down", {wide}}}));
  EXPECT_EQ(widths({8, 4096}), (Widths{{"qkv", {wide}}, {"o_proj", {wide}}, {"gate_up", {narrow}}, {"down", {wide}}}));
  EXPECT_EQ(widths({1, 128}),
            (Widths{{"qkv", {narrow}}, {"o_proj", {narrow}}, {"gate_up", {narrow}}, {"down", {narrow}}}));
  // One layer of d_model 2048 (the benchmark's embed sweep): 16 row blocks x 8 o_proj and down tiles, K >= 2048.
  const ModelConfig d2048 = preset_config("seed", {1, 2048, 16, 16, 8192});
  std::map<std::string, std::set<int32_t>> d2048_widths;
  const Graph d2048_graph(d2048, {8, 256});
  for (const Task& t : d2048_graph.tasks())
    d2048_widths[op_descriptor(t.opcode).name].insert(t.col_end - t.col_begin);
  EXPECT_EQ(d2048_widths["o_proj"], std::set<int32_t>{wide});
  EXPECT_EQ(d2048_widths["down"], std::set<int32_t>{wide});
}

TEST(Buffers, KindsAreNumberedKindByKindWithStackedOffsets) {
  const ModelConfig config = find_preset("tiny").config;  // 2 layers
  const BufferTable table(config, {2, 40});
  std::vector<std::string> names;
  for (const Buffer& b : table.buffers()) names.push_back(b.name());
  EXPECT_THAT(names, ElementsAre("tokens", "hidden[0]", "hidden[1]", "hidden[2]", "attn_norm[0]", "attn_norm[1]",
                                 "qkv[0]", "qkv[1]", "attn[0]", "attn[1]", "hidden_mid[0]", "hidden_mid[1]",
                                 "mlp_norm[0]", "mlp_norm[1]", "act[0]", "act[1]", "final_norm", "logits"));
  const Buffer& qkv1 = table.buffers()[table.id(BufferKind::kQkv, 1)];
  EXPECT_EQ(qkv1.name(), "qkv[1]");
  EXPECT_EQ(qkv1.cols, 512);
  EXPECT_EQ(qkv1.offset_in_kind, 80 * 512);
  EXPECT_EQ(table.kind_elements(BufferKind::kHidden), 3 * 80 * 256);
  EXPECT_EQ(table.buffers()[table.id(BufferKind::kHidden, 2)].offset_in_kind, 2 * 80 * 256);
  EXPECT_EQ(table.device_bytes(), 4.0 * 80 + 2.0 * 80 * (3 * 256 + 2 * (256 + 512 + 256 + 256 + 256 + 512) + 256 + 384));
  for (const Buffer& b : table.buffers()) EXPECT_EQ(b.host_written, b.kind == BufferKind::kTokens) << b.name();

  // The seed model: hidden states in and out, no token ids.
  const BufferTable seed(find_preset("seed").config, {1, 8});
  EXPECT_FALSE(seed.has(BufferKind::kTokens));
  EXPECT_FALSE(seed.has(BufferKind::kLogits));
  for (const Buffer& b : seed.buffers()) EXPECT_EQ(b.host_written, b.name() == "hidden[0]") << b.name();
  EXPECT_THAT([&] { seed.id(BufferKind::kLogits); }, testing::ThrowsMessage<Error>(HasSubstr("no buffer logits")));
}

// The seed blog's count: GEMMs 2 T d (qkv + q + 3 ff) per layer, causal attention 4 B S^2 q_dim / 2 per layer, and
// the LM head; the minimum bytes: weights once, input once, output and K/V once.
TEST(ForwardCost, EqualsTheClosedFormAndTheSumOverTheGraph) {
  Random random(5);
  std::vector<std::pair<ModelConfig, RunShape>> cases = {{find_preset("seed").config, {8, 256}},
                                                          {find_preset("tiny").config, {2, 40}}};
  for (int trial = 0; trial < 6; ++trial)
    cases.push_back({random_small_config(random), {int64_t(1 + trial % 3), int64_t(1 + random.next_u64() % 200)}});
  for (const auto& [c, shape] : cases) {
    SCOPED_TRACE(describe(c));
    const double T = double(shape.tokens()), S = double(shape.seq_len), L = double(c.n_layers);
    const double d = double(c.d_model), ff = double(c.d_ff), vocab = double(c.vocab_size);
    double flops = L * (2 * T * d * double(c.qkv_dim() + c.q_dim() + 3 * c.d_ff) + 2 * double(shape.batch) * S * S * double(c.q_dim()));
    if (c.has_lm_head) flops += 2 * T * d * vocab;
    const double layer_weights = d * double(c.qkv_dim() + c.q_dim()) + 3 * d * ff + 2 * d;
    double min_bytes = 2 * L * layer_weights + 2 * L * T * 2 * double(c.kv_dim());
    min_bytes += c.has_embedding ? T * (4 + 2 * d) : 2 * T * d;
    min_bytes += c.has_lm_head ? 2 * (d + vocab * d) + 2 * T * vocab : 2 * T * d;

    const ForwardCost cost = forward_cost(c, shape);
    EXPECT_NEAR(cost.flops, flops, 1e-12 * flops);
    EXPECT_NEAR(cost.min_bytes, min_bytes, 1e-12 * min_bytes);
    EXPECT_EQ(cost.weight_bytes, 2.0 * double(parameter_count(c)));
    const Graph graph(c, shape);
    double graph_flops = 0;
    for (const Task& t : graph.tasks()) graph_flops += graph.work(t).flops;
    EXPECT_NEAR(graph_flops, flops, 1e-9 * flops);
    EXPECT_EQ(cost.activation_bytes, graph.buffer_table().device_bytes());
  }
}

TEST(Program, OutputIsTheLastStepsBuffer) {
  ModelConfig config = find_preset("tiny").config;
  EXPECT_EQ(output_of_pass(config).kind, BufferKind::kLogits);
  const Graph graph(config, {1, 8});
  EXPECT_EQ(graph.buffers()[graph.output_buffer()].name(), "logits");
  config = find_preset("seed").config;
  const Graph seed(config, {1, 8});
  EXPECT_EQ(seed.buffers()[seed.output_buffer()].name(), "hidden[8]");
  std::vector<std::string> first_layer;
  for_each_step(config, [&](const OpDescriptor& op, uint16_t layer) {
    if (layer == 0 || layer == kNoLayer) first_layer.push_back(op.name);
  });
  EXPECT_THAT(first_layer, ElementsAre("attn_norm", "qkv", "attention", "o_proj", "mlp_norm", "gate_up", "down"));
}

class Bisect : public ::testing::Test {
 protected:
  void SetUp() override {
    schedule_ = make_schedule(graph_, derive_dependencies(graph_), SchedulePolicy::kCostModel, 5);
    run_ = run_cpu_vm(graph_, schedule_, weights_, input_);
  }
  ModelConfig config_ = find_preset("tiny").config;
  RunShape shape_{2, 40};
  Graph graph_{config_, shape_};
  ModelWeights weights_ = random_weights(config_, 1);
  ref::ModelInput input_ = ref::random_input(config_, shape_, 2);
  Schedule schedule_;
  CpuVmRun run_;
};

TEST_F(Bisect, WalksTheProgramAndFindsTheFirstBadOp) {
  // The cpu-vm against itself: every op recomputed alone gives the same bits.
  std::vector<BufferComparison> rows = bisect_buffers(graph_, weights_, input_, run_.buffers, run_.buffers);
  std::vector<std::string> names;
  for (const BufferComparison& row : rows) {
    names.push_back(row.buffer);
    EXPECT_TRUE(row.op_passed) << row.buffer;
    EXPECT_EQ(row.op_alone.rel_l2_error, 0.0) << row.buffer;
  }
  EXPECT_THAT(names, ElementsAre("hidden[0]", "attn_norm[0]", "qkv[0]", "attn[0]", "hidden_mid[0]", "mlp_norm[0]",
                                 "act[0]", "hidden[1]", "attn_norm[1]", "qkv[1]", "attn[1]", "hidden_mid[1]",
                                 "mlp_norm[1]", "act[1]", "hidden[2]", "final_norm", "logits"));
  // Up to layer 0: the embedding and layer 0's steps, down's hidden[1] included.
  EXPECT_EQ(bisect_buffers(graph_, weights_, input_, run_.buffers, run_.buffers, 0).size(), 8u);

  // A wrong attention output in layer 1 is the first op to fail; the ops after it are judged on its output.
  std::vector<ref::Matrix> broken = run_.buffers;
  for (float& value : broken[graph_.buffer_id(BufferKind::kAttn, 1)].data) value *= 1.5f;
  rows = bisect_buffers(graph_, weights_, input_, broken, run_.buffers);
  const auto first_failure =
      std::find_if(rows.begin(), rows.end(), [](const BufferComparison& row) { return !row.op_passed; });
  ASSERT_NE(first_failure, rows.end());
  EXPECT_EQ(first_failure->buffer, "attn[1]");
}

}  // namespace
}  // namespace mk
