// The op descriptors: one struct per op, checked against the HostOp concept and gathered into one table in opcode
// order. Op families (row-wise, GEMM) share their tiling and cost through a base template; each op adds what is its
// own: buffers, weights, constraints and its CPU tile function.
#include "mk/ops.h"

#include <algorithm>
#include <concepts>

#include "mk/check.h"
#include "mk/tiles.h"

namespace mk {

namespace {

using BK = BufferKind;

ref::Range rows_of(const Task& t) { return {t.row_begin, t.row_end}; }
ref::Range cols_of(const Task& t) { return {t.col_begin, t.col_end}; }
double area(const Task& t) { return double(t.row_end - t.row_begin) * double(t.col_end - t.col_begin); }

// The task's rows of buffer `ref`, columns [col_begin, col_end).
Region rows_of(const OpContext& ctx, BufferRef ref, const Task& t, int64_t col_begin, int64_t col_end) {
  return {ctx.buffers.id(ref), t.row_begin, t.row_end, int32_t(col_begin), int32_t(col_end)};
}
Region full_rows(const OpContext& ctx, BufferRef ref, const Task& t) { return rows_of(ctx, ref, t, 0, ctx.cols(ref)); }
Region own_columns(const OpContext& ctx, BufferRef ref, const Task& t) {
  return rows_of(ctx, ref, t, t.col_begin, t.col_end);
}

// ---- row-wise ops: tasks of kBlockRows whole rows ----

template <typename Op>
struct RowwiseOp {
  static void check(const OpContext&) {}
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    const int64_t T = ctx.shape.tokens();
    const int32_t width = int32_t(ctx.cols(Op::output(layer)));
    for (int64_t row = 0; row < T; row += tiles::kBlockRows) {
      const int32_t row_end = int32_t(std::min<int64_t>(T, row + tiles::kBlockRows));
      tasks.push_back({Op::kOpcode, layer, int32_t(row), row_end, 0, width, -1, -1});
    }
  }
  static TaskWork work(const OpContext&, const Task& t) { return {0.0, 4.0 * area(t)}; }  // bf16 rows in and out
};

struct EmbedOp : RowwiseOp<EmbedOp> {
  static constexpr Opcode kOpcode = Opcode::kEmbed;
  static constexpr const char* kName = "embed";
  static BufferRef output(uint16_t) { return {BK::kHidden, 0}; }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) { r.read(full_rows(ctx, {BK::kTokens}, t)); }
  // The table is gathered, not streamed: only the tokens' rows are read.
  static OpTraffic traffic(const OpContext& ctx) { return {2.0 * double(ctx.shape.tokens()) * ctx.config.d_model, 0}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::embedding_rows(cpu.tokens, cpu.operands.weights.embedding, out, rows_of(t));
  }
};

// The RMSNorm ops differ only in what they normalize and with which weight.
template <typename Op>
struct RmsNormOp : RowwiseOp<Op> {
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    r.read(full_rows(ctx, Op::input(ctx.config, t.layer), t));
  }
  static OpTraffic traffic(const OpContext& ctx) { return {2.0 * ctx.config.d_model, 0}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::rmsnorm_rows(cpu.in(Op::input(cpu.config, t.layer)), Op::weight(cpu.operands.weights, t.layer),
                      cpu.config.rms_norm_eps, out, rows_of(t));
  }
};

struct AttnNormOp : RmsNormOp<AttnNormOp> {
  static constexpr Opcode kOpcode = Opcode::kAttnNorm;
  static constexpr const char* kName = "attn_norm";
  static BufferRef output(uint16_t layer) { return {BK::kAttnNorm, layer}; }
  static BufferRef input(const ModelConfig&, uint16_t layer) { return {BK::kHidden, layer}; }
  static const std::vector<bf16>& weight(const ModelWeights& w, uint16_t layer) { return w.layers[layer].attn_norm; }
};

struct MlpNormOp : RmsNormOp<MlpNormOp> {
  static constexpr Opcode kOpcode = Opcode::kMlpNorm;
  static constexpr const char* kName = "mlp_norm";
  static BufferRef output(uint16_t layer) { return {BK::kMlpNorm, layer}; }
  static BufferRef input(const ModelConfig&, uint16_t layer) { return {BK::kHiddenMid, layer}; }
  static const std::vector<bf16>& weight(const ModelWeights& w, uint16_t layer) { return w.layers[layer].mlp_norm; }
};

struct FinalNormOp : RmsNormOp<FinalNormOp> {
  static constexpr Opcode kOpcode = Opcode::kFinalNorm;
  static constexpr const char* kName = "final_norm";
  static BufferRef output(uint16_t) { return {BK::kFinalNorm}; }
  static BufferRef input(const ModelConfig& c, uint16_t) { return {BK::kHidden, int32_t(c.n_layers)}; }
  static const std::vector<bf16>& weight(const ModelWeights& w, uint16_t) { return w.final_norm; }
};

// ---- GEMM ops: out (T, n) <- a (T, k) @ w^T, tiles of kBlockM rows x kBlockN columns ----

struct GemmShape {
  int64_t n;                  // output columns
  int64_t k;                  // reduction length
  int64_t weight_rows_per_col;  // gate_up reads a gate and an up row per output column
  const char* k_field;        // the config field k comes from, for errors
};

void gemm_tiles(const OpContext& ctx, Opcode opcode, uint16_t layer, const GemmShape& g, std::vector<Task>& tasks) {
  const int64_t T = ctx.shape.tokens();
  const int32_t num_m_blocks = int32_t((T + tiles::kBlockM - 1) / tiles::kBlockM);
  const int64_t weight_bytes = 2 * g.n * g.weight_rows_per_col * g.k;
  const int32_t group_m = weight_bytes > tiles::kL2ResidentWeightBytes ? tiles::kGroupM : 1;
  for (int32_t group = 0; group < num_m_blocks; group += group_m) {
    const int32_t group_end = std::min(num_m_blocks, group + group_m);
    for (int64_t col_begin = 0; col_begin < g.n; col_begin += tiles::kBlockN) {
      const int32_t col_end = int32_t(std::min<int64_t>(g.n, col_begin + tiles::kBlockN));
      for (int32_t m = group; m < group_end; ++m) {
        const int32_t row_begin = m * tiles::kBlockM;
        const int32_t row_end = int32_t(std::min<int64_t>(T, row_begin + tiles::kBlockM));
        tasks.push_back({opcode, layer, row_begin, row_end, int32_t(col_begin), col_end, -1, -1});
      }
    }
  }
}

template <typename Op>
struct GemmOp {
  // out = residual + a @ w^T. A function, so that it is asked once Op is complete.
  static constexpr bool has_residual() { return requires { Op::residual(uint16_t{}); }; }

  static void check(const OpContext& ctx) {
    const GemmShape g = Op::gemm(ctx.config);
    MK_CHECK(g.k % tiles::kBlockK == 0,
             "model '{}': {} ({}) must be a multiple of {} (the K step of the {} GEMM); these tiles cannot serve it",
             ctx.config.name, g.k_field, g.k, tiles::kBlockK, Op::kName);
  }
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    gemm_tiles(ctx, Op::kOpcode, layer, Op::gemm(ctx.config), tasks);
  }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    r.read(full_rows(ctx, Op::a(t.layer), t));
    if constexpr (has_residual()) r.read(own_columns(ctx, Op::residual(t.layer), t));
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    const GemmShape g = Op::gemm(ctx.config);
    const double rows = t.row_end - t.row_begin;
    const double weight_rows = double(t.col_end - t.col_begin) * double(g.weight_rows_per_col);
    const double k = double(g.k);
    return {2.0 * rows * weight_rows * k, 2.0 * (rows + weight_rows) * k + 2.0 * area(t) * (has_residual() ? 2 : 1)};
  }
  static OpTraffic traffic(const OpContext& ctx) {
    const GemmShape g = Op::gemm(ctx.config);
    return {2.0 * double(g.n * g.weight_rows_per_col) * double(g.k), 0};
  }
};

struct QkvOp : GemmOp<QkvOp> {
  static constexpr Opcode kOpcode = Opcode::kQkv;
  static constexpr const char* kName = "qkv";
  static BufferRef output(uint16_t layer) { return {BK::kQkv, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kAttnNorm, layer}; }
  static GemmShape gemm(const ModelConfig& c) { return {c.qkv_dim(), c.d_model, 1, "hidden_size"}; }
  static void check(const OpContext& ctx) {
    GemmOp::check(ctx);
    const ModelConfig& c = ctx.config;
    if (c.rope.type == RopeType::kNone) return;
    MK_CHECK(tiles::kBlockN % c.head_dim == 0,
             "model '{}': head_dim {} does not divide the {}-column qkv tiles: RoPE in the QKV epilogue needs whole "
             "heads",
             c.name, c.head_dim, tiles::kBlockN);
    MK_CHECK(ctx.shape.seq_len <= c.max_position_embeddings,
             "sequence length {} exceeds the model's max_position_embeddings {}", ctx.shape.seq_len,
             c.max_position_embeddings);
  }
  // The K and V columns are what a KV cache keeps for decoding.
  static OpTraffic traffic(const OpContext& ctx) {
    OpTraffic traffic = GemmOp::traffic(ctx);
    traffic.kept_bytes = 2.0 * double(ctx.shape.tokens()) * 2.0 * double(ctx.config.kv_dim());
    return traffic;
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::linear_tile(cpu.in(a(t.layer)), cpu.operands.layers[t.layer].qkv, out, rows_of(t), cols_of(t));
    if (cpu.config.rope.type != RopeType::kNone)
      ref::rope_tile(cpu.config, cpu.operands.rope, cpu.operands.seq_len, out, rows_of(t), cols_of(t));
  }
};

struct OProjOp : GemmOp<OProjOp> {
  static constexpr Opcode kOpcode = Opcode::kOProj;
  static constexpr const char* kName = "o_proj";
  static BufferRef output(uint16_t layer) { return {BK::kHiddenMid, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kAttn, layer}; }
  static BufferRef residual(uint16_t layer) { return {BK::kHidden, layer}; }
  static GemmShape gemm(const ModelConfig& c) { return {c.d_model, c.q_dim(), 1, "num_heads * head_dim"}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::linear_residual_tile(cpu.in(a(t.layer)), cpu.operands.layers[t.layer].o, cpu.in(residual(t.layer)), out,
                              rows_of(t), cols_of(t));
  }
};

struct GateUpOp : GemmOp<GateUpOp> {
  static constexpr Opcode kOpcode = Opcode::kGateUp;
  static constexpr const char* kName = "gate_up";
  static BufferRef output(uint16_t layer) { return {BK::kAct, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kMlpNorm, layer}; }
  static GemmShape gemm(const ModelConfig& c) { return {c.d_ff, c.d_model, 2, "hidden_size"}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const ref::ModelOperands::Layer& w = cpu.operands.layers[t.layer];
    ref::swiglu_tile(cpu.in(a(t.layer)), w.gate, w.up, out, rows_of(t), cols_of(t));
  }
};

struct DownOp : GemmOp<DownOp> {
  static constexpr Opcode kOpcode = Opcode::kDown;
  static constexpr const char* kName = "down";
  static BufferRef output(uint16_t layer) { return {BK::kHidden, layer + 1}; }
  static BufferRef a(uint16_t layer) { return {BK::kAct, layer}; }
  static BufferRef residual(uint16_t layer) { return {BK::kHiddenMid, layer}; }
  static GemmShape gemm(const ModelConfig& c) { return {c.d_model, c.d_ff, 1, "intermediate_size"}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::linear_residual_tile(cpu.in(a(t.layer)), cpu.operands.layers[t.layer].down, cpu.in(residual(t.layer)), out,
                              rows_of(t), cols_of(t));
  }
};

struct LmHeadOp : GemmOp<LmHeadOp> {
  static constexpr Opcode kOpcode = Opcode::kLmHead;
  static constexpr const char* kName = "lm_head";
  static BufferRef output(uint16_t) { return {BK::kLogits}; }
  static BufferRef a(uint16_t) { return {BK::kFinalNorm}; }
  static GemmShape gemm(const ModelConfig& c) { return {c.vocab_size, c.d_model, 1, "hidden_size"}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::linear_tile(cpu.in(a(t.layer)), cpu.operands.lm_head, out, rows_of(t), cols_of(t));
  }
};

// ---- attention: causal, one (sequence, kBlockQ queries, query head) per task ----

struct AttentionOp {
  static constexpr Opcode kOpcode = Opcode::kAttention;
  static constexpr const char* kName = "attention";
  static BufferRef output(uint16_t layer) { return {BK::kAttn, layer}; }
  static BufferRef qkv(uint16_t layer) { return {BK::kQkv, layer}; }

  static void check(const OpContext& ctx) {
    MK_CHECK(ctx.config.head_dim == 64 || ctx.config.head_dim == 128,
             "model '{}': head_dim {} is not supported: attention tiles and the RoPE epilogue need 64 or 128",
             ctx.config.name, ctx.config.head_dim);
  }
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    const ModelConfig& c = ctx.config;
    const int64_t S = ctx.shape.seq_len;
    for (int32_t b = 0; b < ctx.shape.batch; ++b) {
      for (int64_t q = 0; q < S; q += tiles::kBlockQ) {
        const int32_t row_begin = int32_t(b * S + q);
        const int32_t row_end = int32_t(b * S + std::min<int64_t>(S, q + tiles::kBlockQ));
        for (int32_t h = 0; h < c.n_heads; ++h) {
          const int32_t col_begin = int32_t(h * c.head_dim);
          tasks.push_back({kOpcode, layer, row_begin, row_end, col_begin, int32_t(col_begin + c.head_dim), b, h});
        }
      }
    }
  }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const ModelConfig& c = ctx.config;
    const uint32_t id = ctx.buffers.id(qkv(t.layer));
    const int32_t kv_head = t.head / int32_t(c.group_size());
    const int32_t k_col = int32_t(c.q_dim() + kv_head * c.head_dim);
    const int32_t v_col = int32_t(c.q_dim() + c.kv_dim() + kv_head * c.head_dim);
    const int32_t sequence_begin = int32_t(t.sequence * ctx.shape.seq_len);
    const int32_t hd = int32_t(c.head_dim);
    r.read(own_columns(ctx, qkv(t.layer), t));                      // q of this head and query block
    r.read({id, sequence_begin, t.row_end, k_col, k_col + hd});  // causal: keys up to the last query
    r.read({id, sequence_begin, t.row_end, v_col, v_col + hd});
  }
  // Calls visit(sequence, first query, end query) for each sequence the task's rows cover.
  template <typename Visit>
  static void for_each_sequence(int64_t seq_len, const Task& t, Visit&& visit) {
    for (int64_t s = t.row_begin / seq_len; s * seq_len < t.row_end; ++s) {
      const int64_t first = s * seq_len;
      visit(s, std::max<int64_t>(t.row_begin, first) - first, std::min<int64_t>(t.row_end, first + seq_len) - first);
    }
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    const double hd = double(ctx.config.head_dim);
    const double heads = double(t.col_end - t.col_begin) / hd;
    TaskWork work;
    for_each_sequence(ctx.shape.seq_len, t, [&](int64_t, int64_t first_query, int64_t end_query) {
      const double rows = double(end_query - first_query);
      // Causal counted half, as the seed benchmark counts it: query i sees i + 1/2 keys on average.
      const double keys = double(first_query) + rows / 2;
      work.flops += heads * 4.0 * rows * keys * hd;
      work.bytes += heads * 2.0 * hd * (2.0 * rows + 2.0 * double(end_query));  // q in, out; K and V up to the end
    });
    return work;
  }
  static OpTraffic traffic(const OpContext&) { return {}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const int64_t hd = cpu.config.head_dim;
    const ref::Matrix& qkv_buffer = cpu.in(qkv(t.layer));
    for (int64_t head = t.col_begin / hd; head < t.col_end / hd; ++head) {
      for_each_sequence(cpu.operands.seq_len, t, [&](int64_t sequence, int64_t first_query, int64_t end_query) {
        ref::attention_tile(cpu.config, cpu.operands.seq_len, qkv_buffer, out, sequence, {first_query, end_query},
                            head);
      });
    }
  }
};

// ---- the table ----

template <typename Op>
concept HostOp = requires {
  { Op::kOpcode } -> std::convertible_to<Opcode>;
  { Op::kName } -> std::convertible_to<const char*>;
} && std::convertible_to<decltype(&Op::output), decltype(OpDescriptor::output)> &&
    std::convertible_to<decltype(&Op::check), decltype(OpDescriptor::check)> &&
    std::convertible_to<decltype(&Op::tile), decltype(OpDescriptor::tile)> &&
    std::convertible_to<decltype(&Op::reads), decltype(OpDescriptor::reads)> &&
    std::convertible_to<decltype(&Op::work), decltype(OpDescriptor::work)> &&
    std::convertible_to<decltype(&Op::traffic), decltype(OpDescriptor::traffic)> &&
    std::convertible_to<decltype(&Op::run_cpu), decltype(OpDescriptor::run_cpu)>;

template <HostOp Op>
constexpr OpDescriptor descriptor() {
  return {Op::kOpcode, Op::kName, &Op::output, &Op::check, &Op::tile, &Op::reads, &Op::work, &Op::traffic, &Op::run_cpu};
}

constexpr OpDescriptor kOps[] = {
    descriptor<EmbedOp>(), descriptor<AttnNormOp>(), descriptor<QkvOp>(),    descriptor<AttentionOp>(),
    descriptor<OProjOp>(), descriptor<MlpNormOp>(),  descriptor<GateUpOp>(), descriptor<DownOp>(),
    descriptor<FinalNormOp>(), descriptor<LmHeadOp>(),
};
static_assert(std::size(kOps) == size_t(Opcode::kNumOpcodes) - 1, "every opcode but kNop has exactly one descriptor");
static_assert([] {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (kOps[i].opcode != Opcode(i + 1)) return false;
  return true;
}(), "descriptors in opcode order: op_descriptor indexes the table by opcode");

}  // namespace

const OpDescriptor& op_descriptor(Opcode opcode) {
  const size_t index = size_t(opcode);
  MK_CHECK(index >= 1 && index <= std::size(kOps), "no op has opcode {}", index);
  return kOps[index - 1];
}

std::span<const OpDescriptor> op_descriptors() { return kOps; }

const char* opcode_name(Opcode opcode) {
  if (opcode == Opcode::kNop) return "nop";
  const size_t index = size_t(opcode);
  return index <= std::size(kOps) ? kOps[index - 1].name : "invalid";
}

Task whole_output(const OpDescriptor& op, const OpContext& ctx, uint16_t layer) {
  const Buffer& out = ctx.buffers.buffers()[ctx.buffers.id(op.output(layer))];
  return {op.opcode, layer, 0, int32_t(out.rows), 0, int32_t(out.cols), -1, -1};
}

}  // namespace mk
