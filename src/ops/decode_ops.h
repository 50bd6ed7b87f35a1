// Descriptors of the prefill and decode ops: the cache append, the decode GEMMs (M = batch rows, narrow N tiles,
// RMSNorm fused where a norm precedes them), split-KV attention and its combine, and sampling. Layouts are in
// include/mk/kv_cache.h. Included by src/ops/ops.cc only.
#pragma once

#include "forward_ops.h"
#include "mk/kv_cache.h"
#include "op_families.h"

namespace mk::ops {

inline Region positions_of(const OpContext& ctx, int64_t first_sequence, int64_t end_sequence) {
  return {ctx.buffers.id({BK::kPositions}), int32_t(first_sequence), int32_t(end_sequence), 0, 1};
}

// rmsnorm(x) of rows [rows), in a scratch matrix of x's shape: the norm a decode GEMM fuses, computed as the
// forward's norm op computes it.
inline ref::Matrix normalized(const ref::Matrix& x, const std::vector<bf16>& weight, float eps, ref::Range rows) {
  ref::Matrix normed(x.rows, x.cols);
  ref::rmsnorm_rows(x, weight, eps, normed, rows);
  return normed;
}

// ---- prefill: K and V of each prompt row into the cache ----

struct KvAppendOp {
  static constexpr Opcode kOpcode = Opcode::kKvAppend;
  static constexpr const char* kName = "kv_append";
  static BufferRef output(uint16_t layer) { return {BK::kKvCache, layer}; }
  static void check(const OpContext&) {}
  // Per sequence, kBlockRows rows at a time: a sequence's cache rows are contiguous, the next sequence's are not.
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    const int64_t S = ctx.shape.seq_len, C = ctx.shape.max_context;
    for (int64_t b = 0; b < ctx.shape.batch; ++b) {
      for (int64_t s = 0; s < S; s += tiles::kBlockRows) {
        const int64_t end = std::min(S, s + tiles::kBlockRows);
        tasks.push_back(
            {kOpcode, layer, int32_t(b * C + s), int32_t(b * C + end), 0, int32_t(2 * ctx.config.kv_dim()), -1, -1});
      }
    }
  }
  static int64_t num_tasks(const OpContext& ctx) {
    return ctx.shape.batch * blocks(ctx.shape.seq_len, tiles::kBlockRows);
  }
  // The qkv rows of the task's cache rows (of the sequences they span, for a rectangle across sequences).
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const int64_t S = ctx.shape.seq_len, C = ctx.shape.max_context, b = t.row_begin / C;
    const bool one_sequence = b == (t.row_end - 1) / C;
    const int64_t first = one_sequence ? b * S + t.row_begin % C : b * S;
    const int64_t end =
        one_sequence ? b * S + std::min<int64_t>(S, (t.row_end - 1) % C + 1) : ((t.row_end - 1) / C + 1) * S;
    r.read({ctx.buffers.id({BK::kQkv, t.layer}), int32_t(first), int32_t(end), int32_t(ctx.config.q_dim()),
            int32_t(ctx.config.qkv_dim())});
  }
  static TaskWork work(const OpContext&, const Task& t) { return {0.0, 4.0 * area(t)}; }  // bf16 in and out
  static OpTraffic traffic(const OpContext&) { return {}; }  // qkv's traffic counts the K and V kept
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const int64_t S = cpu.input.shape.seq_len, C = cpu.input.shape.max_context;
    const ref::Matrix& qkv = cpu.in({BK::kQkv, t.layer});
    for (int64_t row = t.row_begin; row < t.row_end; ++row)
      if (row % C < S) ref::kv_append_row(cpu.config, qkv.row(row / C * S + row % C), out.row(row));
  }
};

// ---- decode GEMMs: out (B, n) <- a (B, k) @ w^T ----

// Column tiles [begin(i), begin(i + 1)), i < count, of a decode GEMM output of n columns: whole `unit`-column units,
// `units` of them a tile, one more in each of the first `wide` tiles; the last tile ends at n (narrower when n is not
// a multiple of the unit).
struct DecodeColumns {
  int64_t n = 0, count = 0, wide = 0, units = 0, unit = tiles::kDecodeMinBlockN;
  int64_t begin(int64_t i) const { return std::min(n, (i * units + std::min(i, wide)) * unit); }
  int64_t widest() const { return std::min(n, (units + (wide > 0 ? 1 : 0)) * unit); }
};

// decode_block_n(spread_n) columns a tile: narrow enough that every SM streams weights. spread: RunShape's.
inline DecodeColumns uniform_decode_columns(int64_t n, int64_t spread_n, int64_t spread) {
  const int32_t width = decode_block_n(spread_n, spread);
  return {n, blocks(n, width), 0, width / tiles::kDecodeMinBlockN};
}

// NOTE: for an output wider than a round of kDecodeMaxBlockN-column tiles (the LM head), uniform tiles leave the last
// round part-full: Llama-3.2-1B's 128256 logits made 1002 tiles of 128 on 132 SMs, 78 SMs running 8 and 54 running
// 7, and the 7-tile SMs sat idle ~17 us (one ~16.5 us tile of weight streaming) of a ~1045 us step (GPU trace).
// Whole rounds of 128-column tiles (1056) fixed that, but each SM still ran 8 tiles one after another with 1.4-1.7 us
// between them in which it had no weight bytes in flight: its ring drains over a tile's last steps and the next
// tile's prologue goes out only when that tile begins (sixteenth session, run 1: ~10-12 us of the phase's 141).
// Instead: one round of RunShape::decode_spread tiles as wide as it takes (fewer where n has fewer units), the units
// spread evenly, so widths differ by one unit: 132 tiles of 960 or 976 columns, each SM's logits one stream. Whole
// 16-column units keep the CUDA-core path's 8 warps at equal shares of output pairs. The wider tiles come first, so
// that schedulers place them first (longest first): the list scheduler ranks them by cost anyway, round-robin by
// task order.
inline DecodeColumns balanced_decode_columns(int64_t n, int64_t spread) {
  const int64_t units = blocks(n, tiles::kDecodeMinBlockN);
  const int64_t count = std::min<int64_t>(units, spread);
  return {n, count, units % count, units / count};
}

// `count` tiles of n columns (at most one a unit) in whole `unit`-column units, spread evenly.
inline DecodeColumns spread_decode_columns(int64_t n, int64_t count, int64_t unit) {
  const int64_t units = blocks(n, unit);
  count = std::clamp<int64_t>(count, 1, units);
  return {n, count, units % count, units / count, unit};
}

// NOTE: each decode tile streams its weights at about one SM's rate, and each op's phase lasts as long as its widest
// tile, so where an op's usual tiles (power-of-two widths) leave SMs of the 132-tile round without one, it takes one
// round of spread tiles instead if that narrows the widest: Llama-3.1-8B's gate_up (14336 columns) made 112 tiles of
// 128 columns (112 at most spread), its q and kv 96 tiles of 64 (48). q and kv, one phase of every layer's chain, share
// the round in proportion to their columns (`tasks`). A spread unit is 8 columns (whole RoPE pairs) at batch 1 (the
// CUDA cores, any count of pairs a warp) and kDecodeMinBlockN above (units of two mma groups on the tensor cores; batch
// 2, still on the CUDA cores, keeps the wider unit, as measured). NOTE: a tile's time follows its busiest warp more
// than its width: 24 columns are 12 pairs, 2 for some of the 8 warps as at 32, and 48 columns on the tensor cores are 6
// groups on 6 warps. So the 1B shape's q and kv gained 0.2% at batch 1 and the 8B shape's batch 8 2.2%, where the cost
// model, which counts columns, said 2.4% and 8.9% (docs/perf.md, twenty-sixth session).
inline DecodeColumns narrowest_decode_columns(const OpContext& ctx, const DecodeColumns& usual, int64_t tasks) {
  const int64_t batch = ctx.shape.batch;
  if (usual.count >= tasks) return usual;
  const int64_t unit = batch == 1 ? tiles::kDecodeSpreadUnit : tiles::kDecodeMinBlockN;
  const DecodeColumns spread = spread_decode_columns(usual.n, tasks, unit);
  return spread.widest() < usual.widest() ? spread : usual;
}

// Tiles of every batch row block (kBlockM) x each column tile. Rows are scaled by row_scale (the cache's max context
// for kDecodeKv, whose rows are cache rows).
inline void decode_gemm_tiles(Opcode opcode, uint16_t layer, int64_t batch, const DecodeColumns& columns,
                              int64_t row_scale, std::vector<Task>& tasks) {
  for (int64_t i = 0; i < columns.count; ++i) {
    for (int64_t row = 0; row < batch; row += tiles::kBlockM) {
      const int64_t row_end = std::min<int64_t>(batch, row + tiles::kBlockM);
      tasks.push_back({opcode, layer, int32_t(row * row_scale), int32_t(row_end * row_scale),
                       int32_t(columns.begin(i)), int32_t(columns.begin(i + 1)), -1, -1});
    }
  }
}

// Base: GemmOp<Op>, or the forward op whose buffers, weights and arithmetic a decode op shares.
template <typename Op, typename Base = GemmOp<Op>>
struct DecodeGemmOp : Base {
  // The columns whose count sets the tile width: q and kv together for the two halves of the qkv projection.
  static int64_t spread_columns(const ModelConfig& c) { return Op::gemm(c).n; }
  static DecodeColumns columns(const ModelConfig& c, int64_t spread) {
    return uniform_decode_columns(Op::gemm(c).n, Op::spread_columns(c), spread);
  }
  // The columns of this pass's tiles, which depend on the batch too; spread, the op's share of a round in proportion
  // to its part of spread_columns (q's and kv's of the qkv projection's).
  static DecodeColumns tile_columns(const OpContext& ctx) {
    const ModelConfig& c = ctx.config;
    const int64_t spread = ctx.shape.decode_spread;
    return narrowest_decode_columns(ctx, Op::columns(c, spread), spread * Op::gemm(c).n / Op::spread_columns(c));
  }
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    decode_gemm_tiles(Op::kOpcode, layer, ctx.shape.batch, Op::tile_columns(ctx), 1, tasks);
  }
  // kDecodeKv tiles its own rows, but as many of them: only their scale differs.
  static int64_t num_tasks(const OpContext& ctx) {
    return Op::tile_columns(ctx).count * blocks(ctx.shape.batch, tiles::kBlockM);
  }
  // Every weight row is read by this task alone: the weight bytes are streamed from HBM.
  static TaskWork work(const OpContext& ctx, const Task& t) {
    TaskWork work = Base::work(ctx, t);
    const GemmShape g = Op::gemm(ctx.config);
    work.streamed_bytes = 2.0 * double(t.col_end - t.col_begin) * double(g.weight_rows_per_col) * double(g.k);
    return work;
  }
};

struct DecodeQOp : DecodeGemmOp<DecodeQOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeQ;
  static constexpr const char* kName = "decode_q";
  static BufferRef output(uint16_t layer) { return {BK::kDecodeQ, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kHidden, layer}; }  // normalized by the task itself
  static GemmShape gemm(const ModelConfig& c) { return {c.q_dim(), c.d_model, 1, "hidden_size"}; }
  static int64_t spread_columns(const ModelConfig& c) { return c.qkv_dim(); }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    GemmOp::reads(ctx, t, r);
    r.read(positions_of(ctx, t.row_begin, t.row_end));
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const ref::Matrix normed = normalized(cpu.in(a(t.layer)), cpu.operands.weights.layers[t.layer].attn_norm,
                                          cpu.config.rms_norm_eps, rows_of(t));
    for (int64_t row = t.row_begin; row < t.row_end; ++row) {
      ref::decode_qkv_row(cpu.config, cpu.operands.rope, normed.row(row), cpu.operands.layers[t.layer].qkv,
                          cpu.input.positions[size_t(row)], cols_of(t), out.row(row) + t.col_begin);
    }
  }
};

// Rows are cache rows [b0 C, b1 C): the batch rows b0..b1, of which it writes each one's row b C + positions[b].
struct DecodeKvOp : DecodeGemmOp<DecodeKvOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeKv;
  static constexpr const char* kName = "decode_kv";
  static BufferRef output(uint16_t layer) { return {BK::kKvCache, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kHidden, layer}; }
  static GemmShape gemm(const ModelConfig& c) { return {2 * c.kv_dim(), c.d_model, 1, "hidden_size"}; }
  static int64_t spread_columns(const ModelConfig& c) { return c.qkv_dim(); }
  static ref::Range batch_rows(int64_t max_context, const Task& t) {
    return {t.row_begin / max_context, (t.row_end + max_context - 1) / max_context};
  }
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    decode_gemm_tiles(kOpcode, layer, ctx.shape.batch, tile_columns(ctx), ctx.shape.max_context, tasks);
  }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const ref::Range rows = batch_rows(ctx.shape.max_context, t);
    r.read({ctx.buffers.id(a(t.layer)), int32_t(rows.begin), int32_t(rows.end), 0, int32_t(ctx.config.d_model)});
    r.read(positions_of(ctx, rows.begin, rows.end));
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    const ref::Range rows = batch_rows(ctx.shape.max_context, t);
    return DecodeGemmOp::work(
        ctx, {t.opcode, t.layer, int32_t(rows.begin), int32_t(rows.end), t.col_begin, t.col_end, -1, -1});
  }
  static OpTraffic traffic(const OpContext& ctx) {
    OpTraffic traffic = GemmOp::traffic(ctx);
    traffic.kept_bytes = 2.0 * double(ctx.shape.batch) * 2.0 * double(ctx.config.kv_dim());
    return traffic;
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const int64_t C = cpu.input.shape.max_context, q_dim = cpu.config.q_dim();
    const ref::Range rows = batch_rows(C, t);
    const ref::Matrix normed =
        normalized(cpu.in(a(t.layer)), cpu.operands.weights.layers[t.layer].attn_norm, cpu.config.rms_norm_eps, rows);
    for (int64_t b = rows.begin; b < rows.end; ++b) {
      const int64_t position = cpu.input.positions[size_t(b)], row = b * C + position;
      if (row < t.row_begin || row >= t.row_end) continue;
      ref::decode_qkv_row(cpu.config, cpu.operands.rope, normed.row(b), cpu.operands.layers[t.layer].qkv, position,
                          {q_dim + t.col_begin, q_dim + t.col_end}, out.row(row) + t.col_begin);
    }
  }
};

// The forward's o_proj, down and LM head, tiled for M = batch rows.
struct DecodeOProjOp : DecodeGemmOp<DecodeOProjOp, OProjOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeOProj;
  static constexpr const char* kName = "decode_o_proj";
};

struct DecodeGateUpOp : DecodeGemmOp<DecodeGateUpOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeGateUp;
  static constexpr const char* kName = "decode_gate_up";
  static BufferRef output(uint16_t layer) { return {BK::kAct, layer}; }
  static BufferRef a(uint16_t layer) { return {BK::kHiddenMid, layer}; }  // normalized by the task itself
  static GemmShape gemm(const ModelConfig& c) { return {c.d_ff, c.d_model, 2, "hidden_size"}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const ref::ModelOperands::Layer& w = cpu.operands.layers[t.layer];
    const ref::Matrix normed = normalized(cpu.in(a(t.layer)), cpu.operands.weights.layers[t.layer].mlp_norm,
                                          cpu.config.rms_norm_eps, rows_of(t));
    ref::swiglu_tile(normed, w.gate, w.up, out, rows_of(t), cols_of(t));
  }
};

struct DecodeDownOp : DecodeGemmOp<DecodeDownOp, DownOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeDown;
  static constexpr const char* kName = "decode_down";
};

// The final norm is fused: each tile normalizes hidden[n_layers] itself, one dependent phase fewer per step.
struct DecodeLmHeadOp : DecodeGemmOp<DecodeLmHeadOp, LmHeadOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeLmHead;
  static constexpr const char* kName = "decode_lm_head";
  static BufferRef input(const ModelConfig& c) { return {BK::kHidden, int32_t(c.n_layers)}; }
  static DecodeColumns columns(const ModelConfig& c, int64_t spread) {
    return balanced_decode_columns(c.vocab_size, spread);
  }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    r.read(full_rows(ctx, input(ctx.config), t));
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const ref::Matrix normed =
        normalized(cpu.in(input(cpu.config)), cpu.operands.weights.final_norm, cpu.config.rms_norm_eps, rows_of(t));
    ref::linear_tile(normed, cpu.operands.lm_head, out, rows_of(t), cols_of(t));
  }
};

}  // namespace mk::ops
