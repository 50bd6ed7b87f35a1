// Split-KV decode attention: one partial per KV block (unnormalized output, max and sum per query head), the blocks'
// K and V staged in shared memory, up to four in flight, the first ones' older keys before the counter wait; the
// math on the tensor cores where head_dim allows (decode_attention_mma.cuh). The combine is decode_combine.cuh.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"
#include "decode_attention_mma.cuh"
#include "mk/tiles.h"
#include "rowwise.cuh"

namespace mk::gpu {

constexpr int kDecodeKvBlock = tiles::kDecodeKvBlock;
constexpr int kPartialStats = tiles::kDecodePartialStats;
constexpr int kMaxGroup = 8;      // query heads per kv head the attention handler serves (checked by the engine)
constexpr int kMaxHeadDim = 256;  // likewise
static_assert(kMaxGroup <= kMmaHeads, "a kv head's query heads are rows of one mma");

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  return value;
}

// Row stride of the K and V blocks (and the bf16 q) in shared memory: 16 bytes of padding spread the rows of
// consecutive keys over the banks, for the CUDA cores' K rows and ldmatrix's 8 rows at one column alike.
__host__ __device__ constexpr int32_t kv_stride(int32_t head_dim) { return head_dim + 8; }

// Keys [key_begin, key_end) of a block's K and V (rows padded) for one kv head into shared memory with cp.async by
// `threads` threads, every 16-byte copy in flight at once, leaving out key `skip` (-1: none). The caller waits for
// the copies.
// NOTE: each thread keeps one chunk of a row and steps over keys (threads past the last whole row of chunks idle): a
// loop over copies divided every copy's index by the run-time chunk count (twentieth session, run 1).
__device__ __forceinline__ void stage_kv_rows(const ModelDims& d, const __nv_bfloat16* k, int32_t key_begin,
                                              int32_t key_end, int32_t skip, __nv_bfloat16* k_block,
                                              __nv_bfloat16* v_block, int thread,
                                              int threads = KernelConfig::kConsumerThreads) {
  const int32_t chunks = d.head_dim / 8, keys_at_once = threads / chunks;
  const int32_t chunk = thread % chunks, first = thread / chunks;
  if (first >= keys_at_once) return;
  const int32_t row_uint4s = 2 * d.kv_dim / 8, stride_uint4s = kv_stride(d.head_dim) / 8;
  const uint4* source = reinterpret_cast<const uint4*>(k) + int64_t(key_begin + first) * row_uint4s + chunk;
  int32_t at = (key_begin + first) * stride_uint4s + chunk;
  for (int32_t key = key_begin + first; key < key_end; key += keys_at_once) {
    if (key != skip) {
      ptx::cp_async_16(reinterpret_cast<uint4*>(k_block) + at, source, 16);
      ptx::cp_async_16(reinterpret_cast<uint4*>(v_block) + at, source + d.kv_dim / 8, 16);
    }
    source += int64_t(keys_at_once) * row_uint4s;
    at += keys_at_once * stride_uint4s;
  }
}

// Where a decode attention tile keeps q, its block's scores or weights and stats, and its staged K and V blocks in the
// (otherwise idle) stage ring: the CUDA-core path's buffers, the tensor-core path's, then as many K and V block
// buffers as fit (a power of two up to kMaxKvBuffers: a block's buffer is then a mask of its index, not a run-time
// modulo, 7% of attention's stall samples at batch 32, twentieth session, run 1), so that later blocks load while
// earlier ones are computed.
constexpr int kMaxKvBuffers = 4;
static_assert((kMaxKvBuffers & (kMaxKvBuffers - 1)) == 0, "a block's buffer is its index masked");
struct DecodeAttentionSmem {
  static constexpr int kFloats = kMaxGroup * kMaxHeadDim + kMaxGroup * kDecodeKvBlock + 2 * kMaxGroup +
                                 2 * KernelConfig::kConsumerWarps * kMmaHeads;
  static constexpr int kBf16s = kMaxGroup * kv_stride(kMaxHeadDim) + 2 * kMmaHeads * kWeightStride;
  static constexpr int kFixedBytes = kFloats * 4 + kBf16s * 2;
  // A K and a V block of kDecodeKvBlock padded rows.
  __host__ __device__ static constexpr int32_t kv_buffer_bytes(int32_t head_dim) {
    return 2 * kDecodeKvBlock * kv_stride(head_dim) * 2;
  }
  __host__ __device__ static constexpr int32_t kv_buffers(int32_t head_dim) {
    const int32_t ring = KernelConfig::kNumStages * KernelConfig::kStageBytes;
    const int32_t fit = (ring - kFixedBytes) / kv_buffer_bytes(head_dim);
    return fit >= kMaxKvBuffers ? kMaxKvBuffers : fit >= 2 ? 2 : fit;
  }
  float* q;                    // (G, head_dim), CUDA cores
  float* scores;               // (G, kDecodeKvBlock), CUDA cores
  float* stats;                // (G, 2): max, sum, CUDA cores
  float* warp_maxima;          // (kConsumerWarps, kMmaHeads), tensor cores
  float* warp_sums;            // (kConsumerWarps, kMmaHeads), tensor cores
  __nv_bfloat16* q_rows;       // (G, kv_stride) bf16, tensor cores
  __nv_bfloat16* weights;      // (2 [halves], kMmaHeads, kWeightStride) bf16, tensor cores
  __nv_bfloat16* kv;           // buffers: (kv_buffers, 2 [K, V], kDecodeKvBlock, kv_stride) bf16
  int32_t stride;              // kv_stride(head_dim)
  int32_t buffers;             // kv_buffers(head_dim)
  __device__ __forceinline__ DecodeAttentionSmem(const SharedState& s, int32_t head_dim)
      : q(reinterpret_cast<float*>(s.stages)),
        scores(q + kMaxGroup * kMaxHeadDim),
        stats(scores + kMaxGroup * kDecodeKvBlock),
        warp_maxima(stats + 2 * kMaxGroup),
        warp_sums(warp_maxima + KernelConfig::kConsumerWarps * kMmaHeads),
        q_rows(reinterpret_cast<__nv_bfloat16*>(warp_sums + KernelConfig::kConsumerWarps * kMmaHeads)),
        weights(q_rows + kMaxGroup * kv_stride(kMaxHeadDim)),
        kv(weights + 2 * kMmaHeads * kWeightStride),
        stride(kv_stride(head_dim)),
        buffers(kv_buffers(head_dim)) {}
  // K and V of block j of the tile (its buffer is j % buffers).
  __device__ __forceinline__ __nv_bfloat16* k_block(int32_t j) const {
    return kv + int64_t(j & (buffers - 1)) * 2 * kDecodeKvBlock * stride;
  }
  __device__ __forceinline__ __nv_bfloat16* v_block(int32_t j) const { return k_block(j) + kDecodeKvBlock * stride; }
};
static_assert(DecodeAttentionSmem::kv_buffers(kMaxHeadDim) >= 1,
              "q, scores or weights, stats, and a K and V block of decode attention fit the stage ring");
static_assert(DecodeAttentionSmem::kv_buffers(64) == kMaxKvBuffers && DecodeAttentionSmem::kv_buffers(128) == 2,
              "the Llama head_dims keep their later blocks loading while one is computed");
static_assert(DecodeAttentionSmem::kFloats * 4 % 16 == 0 && DecodeAttentionSmem::kFixedBytes % 16 == 0 &&
                  kv_stride(kMaxHeadDim) * 2 % 16 == 0 && kWeightStride * 2 % 16 == 0,
              "every bf16 buffer and row starts 16-byte aligned, as cp.async and ldmatrix need");

// Partial rows per sequence, and the row (within its sequence) of KV block `block`: block j is split j % splits's
// (j / splits)-th block, splits numbered in turn (KvSplit, include/mk/kv_cache.h).
__device__ __forceinline__ int32_t partial_rows_per_sequence(const ModelDims& d) {
  return d.kv_splits * d.kv_blocks_per_split;
}
__device__ __forceinline__ int32_t partial_row_of_block(const ModelDims& d, int32_t block) {
  return (block % d.kv_splits) * d.kv_blocks_per_split + block / d.kv_splits;
}

// The keys of one KV block of a decode attention tile: block `first_key / kDecodeKvBlock`, `keys` of them (0 for a
// block past the sequence's position).
struct KvBlockKeys {
  int32_t first_key;
  int32_t keys;
};

// The KV blocks of a decode attention tile: its partial row in.row_begin + j holds block first + j * splits, a tile's
// rows being one split's blocks in order (KvSplit). NOTE: worked out once a tile: per block, the divisions by the
// split's run-time sizes drew 8% of attention's stall samples at batch 32 (twentieth session, run 1).
struct TileKvBlocks {
  int32_t first, splits, blocks, position;
  __device__ __forceinline__ TileKvBlocks(const ModelDims& d, const Instruction& in, int32_t sequence_position)
      : splits(d.kv_splits), blocks(d.kv_blocks), position(sequence_position) {
    const int32_t local = in.row_begin - in.sequence * partial_rows_per_sequence(d);
    first = (local % d.kv_blocks_per_split) * d.kv_splits + local / d.kv_blocks_per_split;
  }
  __device__ __forceinline__ KvBlockKeys keys_of(int32_t j) const {
    const int32_t block = first + j * splits, first_key = block * kDecodeKvBlock;
    return {first_key, block < blocks ? min(kDecodeKvBlock, position + 1 - first_key) : 0};
  }
};

// The cache's K of kv head in.head at `first_key` of the tile's sequence (V is kv_dim further along each row).
__device__ __forceinline__ const __nv_bfloat16* cache_keys(const MegakernelParams& p, const Instruction& in,
                                                           int32_t first_key) {
  const ModelDims& d = p.dims;
  return p.kv_cache + ((int64_t(in.layer) * d.batch + in.sequence) * d.max_context + first_key) * 2 * d.kv_dim +
         in.head * d.head_dim;
}

// Blocks of the tile staged before its loop: all buffers but one, which the loop fills while the others are computed
// (one when there is a single buffer).
__device__ __forceinline__ int32_t prestaged_blocks(const DecodeAttentionSmem& smem, const Instruction& in) {
  return min(max(smem.buffers - 1, 1), in.row_end - in.row_begin);
}

// Stages block j (partial row in.row_begin + j) of the tile into its buffer as one cp.async group of `threads`
// threads (empty past the tile's blocks or the sequence's position, so that every block counts one group).
__device__ __forceinline__ void stage_tile_block(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeAttentionSmem& smem, const TileKvBlocks& tile,
                                                 int32_t j, int thread, int threads = KernelConfig::kConsumerThreads) {
  if (in.row_begin + j < in.row_end) {
    const KvBlockKeys block = tile.keys_of(j);
    if (block.keys > 0)
      stage_kv_rows(p.dims, cache_keys(p, in, block.first_key), 0, block.keys, -1, smem.k_block(j), smem.v_block(j),
                    thread, threads);
  }
  ptx::cp_async_commit();
}

// After the counter wait: the newest key into whichever prestaged block holds it, as one group.
__device__ __forceinline__ void stage_newest_key(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeAttentionSmem& smem, const TileKvBlocks& tile,
                                                 int consumer_thread) {
  for (int32_t j = 0; j < prestaged_blocks(smem, in); ++j) {
    const KvBlockKeys block = tile.keys_of(j);
    const int32_t newest = tile.position - block.first_key;
    if (newest >= 0 && newest < block.keys)
      stage_kv_rows(p.dims, cache_keys(p, in, block.first_key), newest, newest + 1, -1, smem.k_block(j),
                    smem.v_block(j), consumer_thread);
  }
  ptx::cp_async_commit();
}

// Before the tile's counter wait: its first blocks' K and V but the newest key, which this step's decode_kv writes;
// the others were written by earlier steps and the prefill, so they depend on nothing in this launch. One group.
__device__ __forceinline__ void prestage_decode_attention(const MegakernelParams& p, const SharedState& s,
                                                          const Instruction& in, int consumer_thread) {
  const TileKvBlocks tile(p.dims, in, p.positions[in.sequence]);
  const DecodeAttentionSmem smem(s, p.dims.head_dim);
  for (int32_t j = 0; j < prestaged_blocks(smem, in); ++j) {
    const KvBlockKeys block = tile.keys_of(j);
    if (block.keys > 0)
      stage_kv_rows(p.dims, cache_keys(p, in, block.first_key), 0, block.keys, tile.position - block.first_key,
                    smem.k_block(j), smem.v_block(j), consumer_thread);
  }
  ptx::cp_async_commit();
}

// scores[h][key] <- (q_h . k_key) / sqrt(head_dim): one thread per (query head, key).
__device__ __forceinline__ void decode_scores(const ModelDims& d, const float* q, const __nv_bfloat16* k_block,
                                              int32_t keys, float* scores, int consumer_thread) {
  const float scale = rsqrtf(float(d.head_dim));
  for (int32_t i = consumer_thread; i < d.group_size * keys; i += KernelConfig::kConsumerThreads) {
    const int32_t h = i / keys, key = i % keys;
    const float* q_head = q + h * d.head_dim;
    const __nv_bfloat162* k_row = reinterpret_cast<const __nv_bfloat162*>(k_block + key * kv_stride(d.head_dim));
    float acc = 0.0f;
    for (int32_t e = 0; e < d.head_dim / 2; ++e) {
      const float2 k_pair = __bfloat1622float2(k_row[e]);
      acc = fmaf(q_head[2 * e], k_pair.x, acc);
      acc = fmaf(q_head[2 * e + 1], k_pair.y, acc);
    }
    scores[h * kDecodeKvBlock + key] = acc * scale;
  }
}

// Per query head: the block's max and sum, scores turned into exp(score - max) in place. One warp per head.
__device__ __forceinline__ void decode_softmax(const ModelDims& d, int32_t keys, float* scores, float* stats, int warp,
                                               int lane) {
  for (int32_t h = warp; h < d.group_size; h += KernelConfig::kConsumerWarps) {
    float* row = scores + h * kDecodeKvBlock;
    float max = -INFINITY;
    for (int32_t key = lane; key < keys; key += 32) max = fmaxf(max, row[key]);
    max = warp_max(max);
    float sum = 0.0f;
    for (int32_t key = lane; key < keys; key += 32) {
      const float weight = __expf(row[key] - max);
      row[key] = weight;
      sum += weight;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      stats[2 * h] = max;
      stats[2 * h + 1] = sum;
    }
  }
}

// NOTE: the tensor-core path takes head_dim in k16 steps; the engine also accepts head_dims that are multiples of 8
// only, and those keep the CUDA cores.
__device__ __forceinline__ bool decode_attention_on_mma(const ModelDims& d) { return d.head_dim % 16 == 0; }

// One block's partial record on the CUDA cores (q and the block's K and V staged): scores, softmax, P V, and the
// block's max and sum. The next block's scores overwrite this one's only after run_blocks' next barrier.
__device__ __forceinline__ void decode_block_partial_cuda_cores(const ModelDims& d, const DecodeAttentionSmem& smem,
                                                                int32_t j, int32_t keys, float* record, int warp,
                                                                int lane, int consumer_thread) {
  const int32_t G = d.group_size, hd = d.head_dim, stride = hd + kPartialStats;
  const __nv_bfloat16* v_block = smem.v_block(j);
  decode_scores(d, smem.q, smem.k_block(j), keys, smem.scores, consumer_thread);
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  decode_softmax(d, keys, smem.scores, smem.stats, warp, lane);
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  for (int32_t i = consumer_thread; i < G * hd; i += KernelConfig::kConsumerThreads) {
    const int32_t h = i / hd, e = i % hd;
    const float* weights = smem.scores + h * kDecodeKvBlock;
    float acc = 0.0f;
    for (int32_t key = 0; key < keys; ++key)
      acc = fmaf(weights[key], __bfloat162float(v_block[key * smem.stride + e]), acc);
    record[h * stride + e] = acc;
  }
  if (consumer_thread < G) {
    float* tail = record + consumer_thread * stride + hd;
    tail[0] = smem.stats[2 * consumer_thread];
    tail[1] = smem.stats[2 * consumer_thread + 1];
    tail[2] = tail[3] = 0.0f;
  }
}

// The same on the tensor cores (decode_attention_mma.cuh) by a set of warps (BlockWarps): scores, weights (one
// exchange of the set's maxima), P V, and the block's max and sum. A later block's staging overwrites this buffer's K
// and V, and the set's next block the weights and the warps' shares, only after the set's next barrier.
template <int kWarps>
__device__ __forceinline__ void decode_block_partial_mma(const ModelDims& d, const DecodeAttentionSmem& smem,
                                                         int32_t j, int32_t keys, float* record,
                                                         const BlockWarps<kWarps>& set, int lane) {
  const int32_t hd = d.head_dim, stride = smem.stride, record_stride = hd + kPartialStats;
  __nv_bfloat16* v_block = smem.v_block(j);
  __nv_bfloat16* weights = smem.weights + (set.first_warp / kWarps) * kMmaHeads * kWeightStride;
  float score[BlockWarps<kWarps>::kKeyTiles][2];
  mma_block_scores(smem.q_rows, smem.k_block(j), hd, stride, d.group_size, keys, set, lane, score);
  zero_value_tail(v_block, hd, stride, keys, set.thread, BlockWarps<kWarps>::kThreads);
  mma_block_weights(score, weights, smem.warp_maxima, smem.warp_sums, set, lane);
  set.sync();
  mma_block_output(weights, v_block, hd, stride, d.group_size, keys, record, record_stride, set, lane);
  if (set.thread < d.group_size) {
    const float2 stats = mma_block_stats(smem.warp_maxima, smem.warp_sums, set, set.thread);
    *reinterpret_cast<float4*>(record + set.thread * record_stride + hd) = make_float4(stats.x, stats.y, 0.0f, 0.0f);
  }
}

using AllWarps = BlockWarps<KernelConfig::kConsumerWarps>;
using HalfWarps = BlockWarps<KernelConfig::kConsumerWarps / 2>;

// Block j's partial record for the G query heads of the tile (q and the block's K and V staged), on the tensor
// cores where head_dim allows.
__device__ __forceinline__ void decode_block_partial(const ModelDims& d, const DecodeAttentionSmem& smem, int32_t j,
                                                     int32_t keys, float* record, int warp, int lane,
                                                     int consumer_thread) {
  if (decode_attention_on_mma(d))
    decode_block_partial_mma(d, smem, j, keys, record, AllWarps{warp, 0, 1, consumer_thread}, lane);
  else
    decode_block_partial_cuda_cores(d, smem, j, keys, record, warp, lane, consumer_thread);
}

// The tile's G query heads into shared memory: bf16 rows kv_stride apart for the tensor cores' ldmatrix, fp32 for
// the CUDA cores. Read by the blocks after the staging's barrier.
__device__ __forceinline__ void stage_query_heads(const ModelDims& d, const __nv_bfloat16* q_heads,
                                                  const DecodeAttentionSmem& smem, int consumer_thread) {
  const int32_t G = d.group_size, hd = d.head_dim;
  if (!decode_attention_on_mma(d)) {
    for (int32_t i = consumer_thread; i < G * hd; i += KernelConfig::kConsumerThreads)
      smem.q[i] = __bfloat162float(__ldcg(q_heads + i));
    return;
  }
  const int32_t chunks = hd / 8;
  for (int32_t i = consumer_thread; i < G * chunks; i += KernelConfig::kConsumerThreads)
    reinterpret_cast<uint4*>(smem.q_rows + i / chunks * kv_stride(hd))[i % chunks] =
        __ldcg(reinterpret_cast<const uint4*>(q_heads) + i);
}

// A block past the sequence's position: every query head's record is an output of 0 and a max of -inf, which the
// combine leaves out. `threads` threads from `thread`.
__device__ __forceinline__ void write_empty_record(float* record, int32_t G, int32_t hd, int thread, int threads) {
  const int32_t stride = hd + kPartialStats;
  for (int32_t i = thread; i < G * stride; i += threads) record[i] = i % stride == hd ? -INFINITY : 0.0f;
}

// The tile's blocks, all consumer warps on one block at a time. The barrier that shows every consumer's copies of
// block j also ends block j - 1 for all of them: its buffer then takes block j + buffers - 1, and block j's math
// rewrites the weights and the warps' shares (a barrier closing each block as well, 4 a block, was the layout before
// the twenty-second session). Block j's record at record + j record_row.
__device__ __forceinline__ void run_blocks(const MegakernelParams& p, const Instruction& in,
                                           const DecodeAttentionSmem& smem, const TileKvBlocks& tile, float* record,
                                           int64_t record_row, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int warp = consumer_thread / 32, lane = consumer_thread % 32;
  const int32_t G = d.group_size, hd = d.head_dim;
  const bool ahead = smem.buffers > 1;
  for (int32_t j = 0; j < in.row_end - in.row_begin; ++j, record += record_row) {
    // Block j's copies: those of the blocks requested after it may stay in flight (block j + buffers - 1 is
    // requested below, after this wait).
    if (ahead) {
      ptx::cp_async_wait_at_most(min(j, smem.buffers - 2));
    } else {
      if (j >= prestaged_blocks(smem, in)) {
        ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // every consumer done with the one buffer
        stage_tile_block(p, in, smem, tile, j, consumer_thread);
      }
      ptx::cp_async_wait<0>();
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    if (ahead) stage_tile_block(p, in, smem, tile, j + smem.buffers - 1, consumer_thread);
    const KvBlockKeys block = tile.keys_of(j);
    if (block.keys <= 0) {
      write_empty_record(record, G, hd, consumer_thread, KernelConfig::kConsumerThreads);
      continue;
    }
    decode_block_partial(d, smem, j, block.keys, record, warp, lane, consumer_thread);
  }
}

// Whether a tile's blocks go to the two halves of the warps in turn (run_blocks_in_halves): on the tensor cores, with
// 4 K and V buffers (each half then keeps its next block loading while it computes one), and at least 2 blocks.
__device__ __forceinline__ bool blocks_in_halves(const ModelDims& d, const DecodeAttentionSmem& smem,
                                                 const Instruction& in) {
  return decode_attention_on_mma(d) && smem.buffers == kMaxKvBuffers && in.row_end - in.row_begin >= 2;
}

// The tile's blocks by halves: half h (warps 4h..4h+3, named barrier 2 + h) takes blocks h, h + 2, ..., staging
// block j + 2 into the buffer its block j - 2 left, so that each half's chain of dependent instructions (ldmatrix,
// mma, the maxima's exchange, P V) runs while the other's waits. Block j's record at record + j record_row. Every
// consumer first waits for the prestaged blocks (0-2) and the newest key.
// NOTE: with all 8 warps on one block at a time, attention's tiles were bound by their instruction stream, not by
// their loads (twentieth session: ncu's samples on wait, short_sb and selected; ~2 us a 32 KB block at batch 32).
__device__ __forceinline__ void run_blocks_in_halves(const MegakernelParams& p, const Instruction& in,
                                                     const DecodeAttentionSmem& smem, const TileKvBlocks& tile,
                                                     float* record, int64_t record_row, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int warp = consumer_thread / 32, half = warp / (KernelConfig::kConsumerWarps / 2);
  const HalfWarps set{warp % (KernelConfig::kConsumerWarps / 2), half * (KernelConfig::kConsumerWarps / 2),
                      2u + uint32_t(half), consumer_thread % HalfWarps::kThreads};
  const int32_t blocks = in.row_end - in.row_begin, prestaged = prestaged_blocks(smem, in);
  const int32_t G = d.group_size, hd = d.head_dim;
  ptx::cp_async_wait<0>();
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // every consumer's prestaged copies and q
  record += half * record_row;
  for (int32_t j = half; j < blocks; j += 2, record += 2 * record_row) {
    if (j >= prestaged) ptx::cp_async_wait<0>();  // staged by this half on its block j - 2
    set.sync();  // the half's copies of block j visible, and its block j - 2 done, so that j + 2 takes its buffer
    if (j + 2 >= prestaged) stage_tile_block(p, in, smem, tile, j + 2, set.thread, HalfWarps::kThreads);
    const KvBlockKeys block = tile.keys_of(j);
    if (block.keys <= 0) {
      write_empty_record(record, G, hd, set.thread, HalfWarps::kThreads);
      continue;
    }
    decode_block_partial_mma(d, smem, j, block.keys, record, set, consumer_thread % 32);
  }
}

// attn_partial[l][rows] for sequence in.sequence, kv head in.head: one partial record per query head of the kv head
// and per KV block of the split (blocks past the sequence's position are empty: max -inf, left out by the combine).
// The first blocks were prestaged but for the newest key (prestage_decode_attention). With more than one buffer, block
// j + buffers - 1 is requested before block j is computed, into the buffer block j - 1 has just freed. Ends with the
// consumers synchronized. kHalves: tiles of several blocks may go by halves of the warps (run_blocks_in_halves); the
// narrow kernel (batches 1-2, whose tiles are mostly of a block or two at the contexts measured) keeps its code
// small.
// NOTE: one block at a time, each block's load came after the previous block's math: 3.3 us a block at batch 8, 2 us
// for a block staged ahead (sixth session, run 2).
template <bool kHalves>
__device__ __forceinline__ void run_decode_attention(const MegakernelParams& p, const SharedState& s,
                                                     const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int64_t B = d.batch, layer = in.layer;
  const int32_t G = d.group_size, hd = d.head_dim, stride = hd + kPartialStats;
  const TileKvBlocks tile(d, in, p.positions[in.sequence]);
  const DecodeAttentionSmem smem(s, hd);
  stage_query_heads(d, p.decode_q + (layer * B + in.sequence) * d.q_dim + in.head * G * hd, smem, consumer_thread);
  stage_newest_key(p, in, smem, tile, consumer_thread);
  const int64_t record_row = int64_t(d.q_dim / hd) * stride;  // floats of a partial row
  float* record = p.attn_partial + (layer * B * partial_rows_per_sequence(d) + in.row_begin) * record_row +
                  int64_t(in.head) * G * stride;  // block j's at record + j record_row
  bool by_halves = false;
  if constexpr (kHalves) by_halves = blocks_in_halves(d, smem, in);
  if (by_halves) {
    run_blocks_in_halves(p, in, smem, tile, record, record_row, consumer_thread);
  } else {
    run_blocks(p, in, smem, tile, record, record_row, consumer_thread);
  }
  // Every warp's last block done before thread 0 stamps the tile's math (and before the next instruction's staging).
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
}

}  // namespace mk::gpu
