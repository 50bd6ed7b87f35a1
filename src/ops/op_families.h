// Op families for the descriptors of src/ops/: helpers for task regions, the row-wise and GEMM templates, and the
// HostOp concept with which src/ops/ops.cc turns each op struct into an OpDescriptor. Included by src/ops/ only.
#pragma once

#include <algorithm>
#include <concepts>

#include "mk/check.h"
#include "mk/ops.h"
#include "mk/tiles.h"

namespace mk::ops {

using BK = BufferKind;

inline ref::Range rows_of(const Task& t) { return {t.row_begin, t.row_end}; }
inline ref::Range cols_of(const Task& t) { return {t.col_begin, t.col_end}; }
inline double area(const Task& t) { return double(t.row_end - t.row_begin) * double(t.col_end - t.col_begin); }
inline int64_t blocks(int64_t extent, int64_t block) { return (extent + block - 1) / block; }

// The task's rows of buffer `ref`, columns [col_begin, col_end).
inline Region rows_of(const OpContext& ctx, BufferRef ref, const Task& t, int64_t col_begin, int64_t col_end) {
  return {ctx.buffers.id(ref), t.row_begin, t.row_end, int32_t(col_begin), int32_t(col_end)};
}
inline Region full_rows(const OpContext& ctx, BufferRef ref, const Task& t) { return rows_of(ctx, ref, t, 0, ctx.cols(ref)); }
inline Region own_columns(const OpContext& ctx, BufferRef ref, const Task& t) {
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
  static int64_t num_tasks(const OpContext& ctx) { return blocks(ctx.shape.tokens(), tiles::kBlockRows); }
  // bf16 rows in and out. NOTE: latency-bound (rows in trips to L2): traced 5.8 us for 32 rows of 1024, 19 us of
  // 3072 (eighth session), ~25 B/ns a SM.
  static TaskWork work(const OpContext&, const Task& t) {
    TaskWork work{0.0, 4.0 * area(t)};
    work.bytes_per_ns = 25;
    return work;
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

// ---- GEMM ops: out (T, n) <- a (T, k) @ w^T, tiles of kBlockM rows x gemm_block_n columns ----

struct GemmShape {
  int64_t n;                  // output columns
  int64_t k;                  // reduction length
  int64_t weight_rows_per_col;  // gate_up reads a gate and an up row per output column
  const char* k_field;        // the config field k comes from, for errors
};

// Output columns per tile: kWideBlockN for a plain GEMM with enough such tiles, else kBlockN (tiles.h).
inline int64_t gemm_block_n(int64_t tokens, const GemmShape& g) {
  if (g.weight_rows_per_col != 1 || g.n % tiles::kWideBlockN != 0) return tiles::kBlockN;
  const int64_t wide_tiles = blocks(tokens, tiles::kBlockM) * (g.n / tiles::kWideBlockN);
  const int64_t needed = g.k >= tiles::kWideGemmLongK ? tiles::kWideGemmLongKTiles : 2 * tiles::kWideGemmRoundTiles;
  return wide_tiles >= needed ? tiles::kWideBlockN : tiles::kBlockN;
}

inline void gemm_tiles(const OpContext& ctx, Opcode opcode, uint16_t layer, const GemmShape& g, std::vector<Task>& tasks) {
  const int64_t T = ctx.shape.tokens();
  const int64_t block_n = gemm_block_n(T, g);
  const int32_t num_m_blocks = int32_t((T + tiles::kBlockM - 1) / tiles::kBlockM);
  const int64_t weight_bytes = 2 * g.n * g.weight_rows_per_col * g.k;
  const int32_t group_m = weight_bytes > tiles::kL2ResidentWeightBytes ? tiles::kGroupM : 1;
  for (int32_t group = 0; group < num_m_blocks; group += group_m) {
    const int32_t group_end = std::min(num_m_blocks, group + group_m);
    for (int64_t col_begin = 0; col_begin < g.n; col_begin += block_n) {
      const int32_t col_end = int32_t(std::min<int64_t>(g.n, col_begin + block_n));
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
  static int64_t num_tasks(const OpContext& ctx) {
    const GemmShape g = Op::gemm(ctx.config);
    return blocks(ctx.shape.tokens(), tiles::kBlockM) * blocks(g.n, gemm_block_n(ctx.shape.tokens(), g));
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

template <typename Op>
concept HostOp = requires {
  { Op::kOpcode } -> std::convertible_to<Opcode>;
  { Op::kName } -> std::convertible_to<const char*>;
} && std::convertible_to<decltype(&Op::output), decltype(OpDescriptor::output)> &&
    std::convertible_to<decltype(&Op::check), decltype(OpDescriptor::check)> &&
    std::convertible_to<decltype(&Op::tile), decltype(OpDescriptor::tile)> &&
    std::convertible_to<decltype(&Op::num_tasks), decltype(OpDescriptor::num_tasks)> &&
    std::convertible_to<decltype(&Op::reads), decltype(OpDescriptor::reads)> &&
    std::convertible_to<decltype(&Op::work), decltype(OpDescriptor::work)> &&
    std::convertible_to<decltype(&Op::traffic), decltype(OpDescriptor::traffic)> &&
    std::convertible_to<decltype(&Op::run_cpu), decltype(OpDescriptor::run_cpu)>;

template <HostOp Op>
constexpr OpDescriptor descriptor() {
  return {Op::kOpcode, Op::kName,  &Op::output, &Op::check,   &Op::tile,
          &Op::num_tasks, &Op::reads, &Op::work,  &Op::traffic, &Op::run_cpu};
}

}  // namespace mk::ops
