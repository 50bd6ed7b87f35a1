// Descriptors of the forward pass's ops: embedding, the RMSNorms, the GEMMs (qkv with RoPE, o_proj, gate_up with
// SwiGLU, down, the LM head) and causal attention. Included by src/ops/ only: the decode ops reuse some of them.
#pragma once

#include "op_families.h"

namespace mk::ops {

struct EmbedOp : RowwiseOp<EmbedOp> {
  static constexpr Opcode kOpcode = Opcode::kEmbed;
  static constexpr const char* kName = "embed";
  static BufferRef output(uint16_t) { return {BK::kHidden, 0}; }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) { r.read(full_rows(ctx, {BK::kTokens}, t)); }
  // The table is gathered, not streamed: only the tokens' rows are read.
  static OpTraffic traffic(const OpContext& ctx) { return {2.0 * double(ctx.shape.tokens()) * ctx.config.d_model, 0}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    ref::embedding_rows(cpu.input.tokens, cpu.operands.weights.embedding, out, rows_of(t));
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
  static int64_t num_tasks(const OpContext& ctx) {
    return ctx.shape.batch * blocks(ctx.shape.seq_len, tiles::kBlockQ) * ctx.config.n_heads;
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
    // NOTE: traced tiles: ~4 TFLOP/s a SM while computing (the softmax is not in the FLOPs) and ~1.5 us of Q load,
    // first blocks and epilogue (seed: 4.7 us a tile at S=256, 34.2 at S=4096; sixth session, run 3).
    work.flops_per_ns = 4000;
    work.fixed_ns = 1500;
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

}  // namespace mk::ops
