// Descriptors of split-KV decode attention (flash-decoding: a sequence's KV blocks spread over several tasks per kv
// head, each writing partial outputs, maxima and sums), the combine that merges the partials, and sampling.
// Layouts are in include/mk/kv_cache.h. Included by src/ops/ops.cc only.
#pragma once

#include "decode_ops.h"

namespace mk::ops {

// Floats of one query head's partial record: unnormalized output, then max, sum and padding.
inline int64_t partial_stride(const ModelConfig& c) { return c.head_dim + tiles::kDecodePartialStats; }

// One task per (sequence, split, kv head): the split's blocks for the kv head's query heads.
struct DecodeAttentionOp {
  static constexpr Opcode kOpcode = Opcode::kDecodeAttention;
  static constexpr const char* kName = "decode_attention";
  static BufferRef output(uint16_t layer) { return {BK::kAttnPartial, layer}; }
  static void check(const OpContext& ctx) { AttentionOp::check(ctx); }
  // Splits of one sequence in turn, all kv heads of a split together: they share the split's rows and counter.
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    const ModelConfig& c = ctx.config;
    const KvSplit split = kv_split(c, ctx.shape);
    const int64_t width = c.group_size() * partial_stride(c);
    for (int64_t b = 0; b < ctx.shape.batch; ++b) {
      for (int64_t s = 0; s < split.splits; ++s) {
        const int64_t row = b * split.rows_per_sequence() + s * split.blocks_per_split;
        for (int64_t g = 0; g < c.n_kv_heads; ++g) {
          tasks.push_back({kOpcode, layer, int32_t(row), int32_t(row + split.blocks_per_split), int32_t(g * width),
                           int32_t((g + 1) * width), int32_t(b), int32_t(g)});
        }
      }
    }
  }
  static int64_t num_tasks(const OpContext& ctx) {
    return ctx.shape.batch * kv_split(ctx.config, ctx.shape).splits * ctx.config.n_kv_heads;
  }
  // q of the kv head's query heads, and the sequence's whole cache of the kv head: which rows a split reads depends
  // on the positions, known only when the step runs.
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const ModelConfig& c = ctx.config;
    const int64_t C = ctx.shape.max_context, hd = c.head_dim, q_width = c.group_size() * hd;
    const uint32_t cache = ctx.buffers.id({BK::kKvCache, t.layer});
    r.read({ctx.buffers.id({BK::kDecodeQ, t.layer}), t.sequence, t.sequence + 1, int32_t(t.head * q_width),
            int32_t((t.head + 1) * q_width)});
    r.read({cache, int32_t(t.sequence * C), int32_t((t.sequence + 1) * C), int32_t(t.head * hd),
            int32_t((t.head + 1) * hd)});
    r.read({cache, int32_t(t.sequence * C), int32_t((t.sequence + 1) * C), int32_t(c.kv_dim() + t.head * hd),
            int32_t(c.kv_dim() + (t.head + 1) * hd)});
    r.read(positions_of(ctx, t.sequence, t.sequence + 1));
  }
  // At the full max context: the schedule is built for the longest the cache can be.
  static TaskWork work(const OpContext& ctx, const Task& t) {
    const ModelConfig& c = ctx.config;
    const double blocks = double(t.row_end - t.row_begin), hd = double(c.head_dim);
    const double heads = double(t.col_end - t.col_begin) / double(partial_stride(c));
    const double keys = blocks * tiles::kDecodeKvBlock;
    const double kv_bytes = 2.0 * 2.0 * keys * hd * heads / double(c.group_size());  // K and V once per kv head
    return {4.0 * keys * hd * heads, kv_bytes + 2.0 * heads * hd + 4.0 * area(t), kv_bytes};
  }
  static OpTraffic traffic(const OpContext& ctx) {
    OpTraffic traffic;
    traffic.cache_bytes = 2.0 * 2.0 * double(ctx.shape.batch * ctx.shape.max_context) * double(ctx.config.kv_dim());
    return traffic;
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const KvSplit split = kv_split(cpu.config, cpu.input.shape);
    const int64_t width = cpu.config.group_size() * partial_stride(cpu.config);
    const ref::Matrix& q = cpu.in({BK::kDecodeQ, t.layer});
    const ref::Matrix& cache = cpu.in({BK::kKvCache, t.layer});
    for (int64_t row = t.row_begin; row < t.row_end; ++row) {
      for (int64_t g = t.col_begin / width; g < t.col_end / width; ++g) {
        ref::decode_attention_partial(cpu.config, split, cpu.input.shape.max_context, q, cache, cpu.input.positions,
                                      out, row, g);
      }
    }
  }
};

// One task per sequence and kv head: the kv head's query heads, their partials merged. Its sequence and head name
// the attention tasks whose partials it merges (the group link_decode_combines links it to).
struct DecodeCombineOp {
  static constexpr Opcode kOpcode = Opcode::kDecodeCombine;
  static constexpr const char* kName = "decode_combine";
  static BufferRef output(uint16_t layer) { return {BK::kAttn, layer}; }
  static void check(const OpContext&) {}
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    static_assert(tiles::kDecodeCombineRows == 1, "a combine task merges one attention group: one sequence");
    const ModelConfig& c = ctx.config;
    const int64_t width = c.group_size() * c.head_dim;
    for (int64_t b = 0; b < ctx.shape.batch; ++b) {
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        tasks.push_back({kOpcode, layer, int32_t(b), int32_t(b + 1), int32_t(g * width), int32_t((g + 1) * width),
                         int32_t(b), int32_t(g)});
    }
  }
  static int64_t num_tasks(const OpContext& ctx) {
    return blocks(ctx.shape.batch, tiles::kDecodeCombineRows) * ctx.config.n_kv_heads;
  }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const int64_t per_sequence = kv_split(ctx.config, ctx.shape).rows_per_sequence();
    const int64_t stride = partial_stride(ctx.config), hd = ctx.config.head_dim;
    r.read({ctx.buffers.id({BK::kAttnPartial, t.layer}), int32_t(t.row_begin * per_sequence),
            int32_t(t.row_end * per_sequence), int32_t(t.col_begin / hd * stride), int32_t(t.col_end / hd * stride)});
    r.read(positions_of(ctx, t.row_begin, t.row_end));
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    const KvSplit split = kv_split(ctx.config, ctx.shape);
    const double heads = double(t.col_end - t.col_begin) / double(ctx.config.head_dim);
    const double records = double(t.row_end - t.row_begin) * double(split.blocks) * heads;
    return {0.0, 4.0 * records * double(partial_stride(ctx.config)) + 2.0 * area(t)};
  }
  static OpTraffic traffic(const OpContext&) { return {}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const KvSplit split = kv_split(cpu.config, cpu.input.shape);
    const ref::Matrix& partial = cpu.in({BK::kAttnPartial, t.layer});
    const int64_t hd = cpu.config.head_dim;
    for (int64_t b = t.row_begin; b < t.row_end; ++b)
      for (int64_t head = t.col_begin / hd; head < t.col_end / hd; ++head)
        ref::decode_attention_combine(cpu.config, split, partial, cpu.input.positions, out, b, head);
  }
};

// decode_o_proj with the combine fused: each tile merges the partials of its rows (every head) itself, then projects.
// One dependent hop a layer less than decode_combine then decode_o_proj, for the same bits.
struct DecodeOProjCombineOp : DecodeGemmOp<DecodeOProjCombineOp, OProjOp> {
  static constexpr Opcode kOpcode = Opcode::kDecodeOProjCombine;
  static constexpr const char* kName = "decode_o_proj_combine";
  static BufferRef partials(uint16_t layer) { return {BK::kAttnPartial, layer}; }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    const int64_t per_sequence = kv_split(ctx.config, ctx.shape).rows_per_sequence();
    r.read({ctx.buffers.id(partials(t.layer)), int32_t(t.row_begin * per_sequence), int32_t(t.row_end * per_sequence),
            0, int32_t(ctx.cols(partials(t.layer)))});
    r.read(own_columns(ctx, residual(t.layer), t));
    r.read(positions_of(ctx, t.row_begin, t.row_end));
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    TaskWork work = DecodeGemmOp::work(ctx, t);
    const double records = double(t.row_end - t.row_begin) * double(kv_split(ctx.config, ctx.shape).rows_per_sequence());
    work.bytes += 4.0 * records * double(ctx.cols(partials(t.layer)));
    return work;
  }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const KvSplit split = kv_split(cpu.config, cpu.input.shape);
    ref::Matrix attn(out.rows, cpu.config.q_dim());
    for (int64_t b = t.row_begin; b < t.row_end; ++b)
      for (int64_t head = 0; head < cpu.config.n_heads; ++head)
        ref::decode_attention_combine(cpu.config, split, cpu.in(partials(t.layer)), cpu.input.positions, attn, b, head);
    ref::linear_residual_tile(attn, cpu.operands.layers[t.layer].o, cpu.in(residual(t.layer)), out, rows_of(t),
                              cols_of(t));
  }
};

// One task per sequence: the next token from its logits row. The CPU engines hold the id as a float (exact below
// 2^24).
struct SampleOp {
  static constexpr Opcode kOpcode = Opcode::kSample;
  static constexpr const char* kName = "sample";
  static BufferRef output(uint16_t) { return {BK::kSampled}; }
  static void check(const OpContext&) {}
  static void tile(const OpContext& ctx, uint16_t layer, std::vector<Task>& tasks) {
    for (int64_t b = 0; b < ctx.shape.batch; ++b)
      tasks.push_back({kOpcode, layer, int32_t(b), int32_t(b + 1), 0, 1, -1, -1});
  }
  static int64_t num_tasks(const OpContext& ctx) { return ctx.shape.batch; }
  static void reads(const OpContext& ctx, const Task& t, TaskRegions& r) {
    r.read(full_rows(ctx, {BK::kLogits}, t));
    r.read(positions_of(ctx, t.row_begin, t.row_end));
  }
  static TaskWork work(const OpContext& ctx, const Task& t) {
    return {0.0, 2.0 * double(t.row_end - t.row_begin) * double(ctx.config.vocab_size)};
  }
  static OpTraffic traffic(const OpContext&) { return {}; }
  static void run_cpu(const CpuTile& cpu, const Task& t, ref::Matrix& out) {
    const ref::Matrix& logits = cpu.in({BK::kLogits});
    const ref::SamplingParams& sampling = cpu.input.sampling;
    for (int64_t b = t.row_begin; b < t.row_end; ++b) {
      const float uniform = ref::sampling_uniform(sampling.seed, b, cpu.input.positions[size_t(b)]);
      out.row(b)[0] = float(ref::sample_token(logits.row(b), logits.cols, sampling, uniform));
    }
  }
};

}  // namespace mk::ops
