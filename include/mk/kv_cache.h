// The KV cache and how split-KV decode attention divides it: shapes shared by the buffer table, the decode ops, the
// engines and the memory check; and the pair order in which decode buffers store RoPE'd heads.
#pragma once

#include <cstdint>

#include "mk/model_config.h"

namespace mk {

// kv_cache[l] (batch * max_context, 2 kv_dim), one per layer: row b * max_context + p holds sequence b's token at
// position p, its K heads (pair order, below) then its V heads (natural order), RoPE applied to K. Prefill writes the
// prompt's rows, each decode step the row of the token it feeds; attention at position p reads rows 0..p.

// Split-KV decode attention cuts each sequence's cache into blocks of tiles::kDecodeKvBlock keys, the unit of one
// partial (max, sum, unnormalized output per query head). Block j goes to split j % splits as that split's
// (j / splits)-th block, so that whatever a sequence's current length, its blocks spread evenly over its splits.
// Partial rows of a sequence are numbered split by split: row = split * blocks_per_split + j / splits.
struct KvSplit {
  int64_t blocks = 0;            // per sequence: ceil(max_context / kDecodeKvBlock)
  int64_t splits = 0;            // attention tasks per (sequence, kv head)
  int64_t blocks_per_split = 0;  // ceil(blocks / splits)
  int64_t rows_per_sequence() const { return splits * blocks_per_split; }
  int64_t row_of_block(int64_t block) const { return (block % splits) * blocks_per_split + block / splits; }
  int64_t block_of_row(int64_t row) const { return (row % blocks_per_split) * splits + row / blocks_per_split; }
};
// NOTE: splits = as many (sequence, kv head, split) tasks as fit in shape.decode_spread (one round), at most
// one per block: at batch 1 the 8 kv heads of Llama 3 alone would leave most SMs idle while the cache streams, and
// one task past the round is a second round on the critical path (batch 8: 3 splits made 192 tasks of 16 us each;
// docs/perf.md, fifth session, run 2).
KvSplit kv_split(const ModelConfig& config, const RunShape& shape);

// Pair order: decode buffers store each RoPE'd head (decode q, the K half of the cache) with rotation partners side
// by side, stored column j holding natural column natural_column(j): 0, d/2, 1, d/2 + 1, ... Any even-aligned run
// of columns then holds whole pairs, so decode GEMM tiles narrower than a head can apply RoPE in their epilogue.
inline int64_t natural_column(int64_t pair_column, int64_t head_dim) {
  return pair_column % 2 == 0 ? pair_column / 2 : head_dim / 2 + pair_column / 2;
}

// Output columns per decode GEMM tile for an output of n columns, at most `spread` tiles where the widest allow
// (RunShape::decode_spread, tiles::kDecodeSpreadTasks).
int32_t decode_block_n(int64_t n, int64_t spread);

// Throws mk::Error naming the problem when a pass of this shape cannot run on the model: sizes positive, sequences
// within a RoPE model's positions, and for prefill and decode an embedding and an LM head, a cache within the model's
// positions, prefill rows that fit it, one token per sequence for decode.
void check_pass_shape(const ModelConfig& config, const RunShape& shape);

// Bytes of the whole cache (every layer's K and V) at `element_bytes` per value.
double kv_cache_bytes(const ModelConfig& config, int64_t batch, int64_t max_context, int64_t element_bytes);

}  // namespace mk
