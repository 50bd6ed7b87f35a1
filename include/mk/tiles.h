// Tile sizes: defined once here, read by the graph (how ops tile their outputs) and by the megakernel (shared-memory
// layout, static_asserts in src/cuda/device/config.cuh). Plain constexpr, no includes, so nvcc and g++ read the same.
#pragma once

#include <cstdint>

namespace mk::tiles {

constexpr int32_t kBlockM = 128;  // token rows per GEMM tile
constexpr int32_t kBlockN = 128;  // output columns per GEMM tile (gate_up: 128 gate and 128 up weight rows)
// NOTE: per FLOP, a warpgroup's m64n128 wgmma reads more shared memory than an m64n256 one (the A slice is read once
// per 128 columns instead of per 256), and 128 x 128 tiles ran at 5.7 TFLOP/s per SM against gate_up's 128 x 256 at 6.6
// (d_model 3072, docs/perf.md, eighth session). Plain GEMMs (gate_up's tiles are 256 weight rows already) take
// kWideBlockN-column tiles when there are enough of them: two rounds of kWideGemmRoundTiles (the H200's SM count, a
// tiling hint), or, at K >= kWideGemmLongK, kWideGemmLongKTiles (a round but for 4 SMs: one layer of d_model 2048 makes
// 128 o_proj and down tiles, which as 256 narrow ones take two rounds). A wide tile's epilogue is longer (its two
// output halves leave one after the other), which the main loop repays only at long K or when rounds are many:
// measured, the seed's qkv (192 tiles, K 1024) +0.9% slower wide, the one-layer d_model 3072's o_proj and down (192
// tiles, K 3072 and 12288) 12-15% faster per column.
constexpr int32_t kWideBlockN = 256;
constexpr int32_t kWideGemmRoundTiles = 132;
constexpr int32_t kWideGemmLongK = 2048;
constexpr int32_t kWideGemmLongKTiles = 128;
constexpr int32_t kBlockK = 64;   // K step: one 128-byte swizzled row of bf16; K dimensions must be multiples of it
constexpr int32_t kBlockQ = 128;  // queries per attention tile
constexpr int32_t kBlockKv = 128;  // keys per attention K or V stage
// NOTE: row-wise tasks (embedding, norms) move bytes, not FLOPs: 32 rows spread a norm over 4x more SMs than a GEMM
// row block and shorten the norm -> GEMM hop on the critical path.
constexpr int32_t kBlockRows = 32;  // token rows per embedding and norm task
// NOTE: a GEMM whose weights do not fit in L2 emits its tiles in groups of kGroupM row blocks, column by column
// within a group, so that the ~132 tiles in flight share weight tiles through L2 instead of each streaming its own
// from HBM (measured: 1 layer of d_model 4096, 2.17 -> 1.64 ms). Smaller GEMMs go row block by row block, which
// finishes rows earliest for the next op (measured: the seed preset, 1.288 -> 1.276 ms).
constexpr int32_t kGroupM = 8;
constexpr int64_t kL2ResidentWeightBytes = int64_t(24) << 20;  // half the H200's 50 MB L2 (60 MB reported)

// ---- decode (one token per sequence): weight streaming at M = batch rows ----
// NOTE: a decode step reads every weight once for a handful of rows, so its time is weight bytes / bandwidth only
// if every SM streams; and each GEMM waits for the whole previous op, so a second round of its tiles on some SMs is a
// second tile's latency on the critical path (measured: qkv's 192 tiles of 16 columns, 1B shape). GEMM tiles are
// the narrowest power of two of kDecodeMinBlockN..kDecodeMaxBlockN columns that makes at most one round of them
// (RunShape::decode_spread: the SM count the gpu engine's GPU has, kDecodeSpreadTasks, the H200's, by default and on
// the CPU engines); wider outputs get tiles of kDecodeMaxBlockN, but the LM head, which takes one round of tiles as
// wide as it needs (balanced_decode_columns). NOTE: tiled for 132 on 120 SMs, every phase ran a second round on 12 of
// them: the 1B and 8B steps took 55% longer (docs/perf.md, thirty-second session, run 6).
constexpr int32_t kDecodeSpreadTasks = 132;
constexpr int32_t kDecodeMinBlockN = 16;
constexpr int32_t kDecodeMaxBlockN = 128;
// Columns of a unit of the spread tiles at batch 1 (narrowest_decode_columns): whole RoPE pairs, 4 of them.
constexpr int32_t kDecodeSpreadUnit = 8;
// Split-KV attention: each sequence's cache is cut into blocks of kDecodeKvBlock keys, the unit of one partial
// (max, sum, unnormalized output); the reference's full-sequence attention uses the same blocks, so the two agree
// bit for bit.
constexpr int32_t kDecodeKvBlock = 128;
// Floats after each query head's partial output in the partial buffer: its max, its sum and two of padding, which
// keep every head's record 16-byte aligned.
constexpr int32_t kDecodePartialStats = 4;
// Sequences per combine task (one kv head's query heads each). NOTE: one: a combine thread's loads are a dependent
// chain over the blocks, so a task's time grows with its outputs (8 sequences a task took 25 us at batch 8 against
// 3.2 us for one; docs/perf.md, fifth session, run 2), and the combine is on every layer's critical path.
constexpr int32_t kDecodeCombineRows = 1;

}  // namespace mk::tiles
