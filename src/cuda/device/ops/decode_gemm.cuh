// Decode GEMMs (M = batch rows, RMSNorm fused where a norm precedes them): their tasks, input staging, epilogues and
// the CUDA-core path for passes of 1-2 rows; and the prefill's cache append, run by the consumer warps.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"
#include "decode_combine.cuh"
#include "rowwise.cuh"

namespace mk::gpu {

// NOTE: up to batch 16 a decode tile is a few batch rows against tens of weight rows: too thin for wgmma (batches above
// go to decode_gemm_wgmma.cuh), and the whole step is weight bytes / bandwidth. Each warp streams weight rows through
// shared memory with cp.async (below), against the tile's input rows held there too (normalized once per tile). A
// tile's first weight steps are sent before it waits for its inputs. NOTE: asking L2 for weights further ahead (the
// next tile's, or up to 1 MB of an SM's upcoming tiles from the idle producer thread) made steps slower, 1.35 ->
// 1.43-1.50 ms (docs/perf.md): the prefetches delay the latency-bound tiles' own loads. Asking only while o_proj waits
// at the attention chain's end, for the first 192 KB of the SM's next (gate_up) tile, made the step 4.6% longer too
// (ninth session, run 4): o_proj's wait grew 8.9 -> 10.9 us, and gate_up's tiles did not get faster. NOTE: the hops
// into the streaming ops (a counter's publication to the wait's end: 2-3 us, against ~1 us into attention) are not the
// SM's own copies delaying its acquire loads: with each weight step sent as two bulk copies instead of per-lane
// cp.async, the hops stayed at 1.8-2.7 us and batch 1 took 2% longer (branch decode-tma-weights, fifteenth session, run
// 2). NOTE: a tile's last steps sending the next tile's first weight steps (branch decode-stream-ahead) closed the
// 1.4-1.7 us gaps between an SM's tiles but made batch 1 9% slower: the publish's release fence waits for the thread's
// copies in flight, and the larger code made the instruction cache miss in ops it did not touch (docs/perf.md,
// sixteenth session, runs 4-5); re-measured on a smaller kernel (branch s29-handoff), still no gain at batch 1 (1B
// even, 8B +1.7%; batch 2 -2.8% at 1B): the current tile's tail slows by what the next tile gains. NOTE: an L2
// evict-first policy on these weight loads (so that the KV cache stays in L2) left the 1B step and its attention tiles
// unchanged (branch s29-evict-first), and sharing an op's pairs among its tasks at run time by atomic claims made the
// 8B step at batch 1 8% slower (branch s27-balance): docs/perf.md, twenty-seventh to twenty-ninth sessions. NOTE: a
// ring of 3 or 2 steps a warp instead of 4 (kStepBuffers; 2 steps saturate the bare stream, bench/hop_latency_probe.cu,
// with hand-offs 3-4x faster beside it) shortened the hops into the streaming ops but slowed their tiles by more: 8B
// batch 1 +1.0% / +2.1%; at 2 steps 1B batches 16-64 and 8B batch 8 +2%; only 1B batch 8 gained, -5.3% at 2 steps with
// 128 KB of staged rows, and +1.1% at 2 steps alone in the tensor-core kernel (branches s30-ring3, s30-ring2,
// s30-mma-depth2; docs/perf.md, thirtieth session). Passes of 3 or more rows go to the tensor cores instead
// (decode_gemm_mma.cuh), with the same staging and epilogues.
// Batch rows one pass holds: the M of the tensor-core path's mma; more rows take more passes over the same weights.
constexpr int kDecodeMaxRows = 16;
static_assert(kDecodeMaxRows * 4 <= KernelConfig::kDecodeInvRmsBytes,
              "each staged row's 1 / rms fits the scratch before the norm weight");

// One decode GEMM task: out (rows, pairs) from a (batch, k) @ w^T, two weight rows per output pair.
struct DecodeGemmTask {
  const __nv_bfloat16* a;            // (batch, k) the layer's input rows
  const __nv_bfloat16* norm_weight;  // (k) RMSNorm weight applied to a first, or null
  const __nv_bfloat16* w;            // (rows, k) the layer's weights
  int32_t k;
  int32_t row_stride;   // elements from one row of a, and of w, to the next: k, more for a K range (decode_k_range)
  int32_t batch_begin;  // batch rows [batch_begin, batch_end)
  int32_t batch_end;
  int32_t pairs;        // pairs of dot products per batch row
};

__device__ __forceinline__ DecodeGemmTask decode_gemm_task(const MegakernelParams& p, const Instruction& in) {
  const ModelDims& d = p.dims;
  const DeviceWeights& w = p.weights;
  const int64_t B = d.batch, D = d.d_model, layer = in.layer;
  const int32_t width = in.col_end - in.col_begin;
  switch (in.opcode) {
    case Opcode::kDecodeQ:
      return {p.hidden + layer * B * D, w.attn_norm_weight + layer * D, w.wqkv + layer * d.qkv_dim * D, d.d_model,
              d.d_model, in.row_begin, in.row_end, width / 2};
    case Opcode::kDecodeKv:  // rows are cache rows [b0 C, b1 C)
      return {p.hidden + layer * B * D, w.attn_norm_weight + layer * D, w.wqkv + layer * d.qkv_dim * D, d.d_model,
              d.d_model, in.row_begin / d.max_context, (in.row_end + d.max_context - 1) / d.max_context, width / 2};
    case Opcode::kDecodeOProj:
      return {p.attn + layer * B * d.q_dim, nullptr, w.wo + layer * D * d.q_dim, d.q_dim, d.q_dim, in.row_begin,
              in.row_end, width / 2};
    case Opcode::kDecodeGateUp:  // a pair is the gate and the up row of one output column
      return {p.hidden_mid + layer * B * D, w.mlp_norm_weight + layer * D,
              w.w_gate_up + layer * int64_t(d.gate_up_rows) * D, d.d_model, d.d_model, in.row_begin, in.row_end,
              width};
    case Opcode::kDecodeDown:
      return {p.act + layer * B * d.d_ff, nullptr, w.w_down + layer * D * d.d_ff, d.d_ff, d.d_ff, in.row_begin,
              in.row_end, width / 2};
    default:  // kDecodeLmHead: the final norm fused
      return {p.hidden + int64_t(d.n_layers) * B * D, w.final_norm_weight, w.lm_head, d.d_model, d.d_model,
              in.row_begin, in.row_end, width / 2};
  }
}

// Weight row of column `col` of a RoPE'd head stored in pair order (include/mk/kv_cache.h): 0, d/2, 1, d/2 + 1, ...
__device__ __forceinline__ int32_t pair_order_row(int32_t col, int32_t head_dim) {
  const int32_t j = col % head_dim;
  return col - j + (j % 2 == 0 ? j / 2 : head_dim / 2 + j / 2);
}

// The two weight rows of output pair `pair`: {row, row + stride}. NOTE: one division a pair, not one a row: a pair's
// columns are even and odd of one RoPE pair (tiles start at even columns, as a CPU test checks, and the GPU engine
// takes a head_dim that is a multiple of 8: kernel_limits.cc), so its rows are natural rows i and i + head_dim / 2.
// Each ring's stream inlines this for each of its copies; with a division a row it was a third of the wgmma decode
// kernel's code (thirty-eighth session).
__device__ __forceinline__ int2 decode_weight_rows(const MegakernelParams& p, const Instruction& in, int32_t pair) {
  const ModelDims& d = p.dims;
  int32_t col = in.col_begin + 2 * pair, offset = 0, stride = 1;
  switch (in.opcode) {
    case Opcode::kDecodeGateUp: {  // packed per kBlockN columns: the gate rows, then the up rows
      const int32_t up_col = in.col_begin + pair;
      col = 2 * KernelConfig::kBlockN * (up_col / KernelConfig::kBlockN) + up_col % KernelConfig::kBlockN;
      stride = KernelConfig::kBlockN;
      break;
    }
    case Opcode::kDecodeKv:  // K columns [0, kv_dim) in pair order, then V
      offset = d.q_dim;
      if (col >= d.kv_dim) break;
      [[fallthrough]];
    case Opcode::kDecodeQ:
      col -= int32_t(uint32_t(col) % uint32_t(d.head_dim) / 2);  // col - j + j / 2, j = col % head_dim
      stride = d.head_dim / 2;
      break;
    default:
      break;
  }
  return {offset + col, offset + col + stride};
}

__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float x0, float x1) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x0, x1);
}

__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* in) {
  return __bfloat1622float2(__ldcg(reinterpret_cast<const __nv_bfloat162*>(in)));
}

// RoPE of a pair-order pair (x1 = natural column i, x2 = column i + head_dim / 2) at `position`.
__device__ __forceinline__ float2 rotate(const MegakernelParams& p, float x1, float x2, int32_t col, int32_t position) {
  if (!p.dims.rope) return {x1, x2};
  const int32_t half = p.dims.head_dim / 2;
  const int64_t at = int64_t(position) * half + (col % p.dims.head_dim) / 2;
  const float cos = p.weights.rope_cos[at], sin = p.weights.rope_sin[at];
  return {x1 * cos + (-x2) * sin, x2 * cos + x1 * sin};
}

// The epilogue of one output pair of batch row b: RoPE and the cache row, SwiGLU, or the residual.
__device__ __forceinline__ void decode_epilogue(const MegakernelParams& p, const Instruction& in, int32_t pair,
                                                int32_t b, float x0, float x1) {
  const ModelDims& d = p.dims;
  const int64_t B = d.batch, D = d.d_model, layer = in.layer;
  const int32_t col = in.col_begin + 2 * pair;
  switch (in.opcode) {
    case Opcode::kDecodeQ: {
      const float2 r = rotate(p, x0, x1, col, p.positions[b]);
      store_pair(p.decode_q + (layer * B + b) * d.q_dim + col, r.x, r.y);
      break;
    }
    case Opcode::kDecodeKv: {
      const int32_t position = p.positions[b];
      const float2 r = col < d.kv_dim ? rotate(p, x0, x1, col, position) : float2{x0, x1};
      const int64_t cache_row = layer * B * d.max_context + int64_t(b) * d.max_context + position;
      store_pair(p.kv_cache + cache_row * 2 * d.kv_dim + col, r.x, r.y);
      break;
    }
    case Opcode::kDecodeOProj: {
      const float2 residual = load_pair(p.hidden + (layer * B + b) * D + col);
      store_pair(p.hidden_mid + (layer * B + b) * D + col, residual.x + x0, residual.y + x1);
      break;
    }
    case Opcode::kDecodeGateUp: {
      const float act = ptx::silu_fast(x0) * x1;
      p.act[(layer * B + b) * d.d_ff + in.col_begin + pair] = __float2bfloat16_rn(act);
      break;
    }
    case Opcode::kDecodeDown: {
      const float2 residual = load_pair(p.hidden_mid + (layer * B + b) * D + col);
      store_pair(p.hidden + ((layer + 1) * B + b) * D + col, residual.x + x0, residual.y + x1);
      break;
    }
    default:  // kDecodeLmHead
      store_pair(p.logits + int64_t(b) * d.vocab_size + col, x0, x1);
      break;
  }
}

// Where logical chunk `chunk` (16 bytes) of staged row `row` is: each row's chunks are XORed with the row's low 3
// bits, so that an ldmatrix's 8 rows at one chunk hit 8 different bank groups (rows are a multiple of 128 bytes long,
// so unswizzled they would all hit the same 16 bytes of the banks: 8-way conflicts). NOTE: a swizzle rather than a
// padded row stride: padding would cost a row of k = 8192 (16 KB) its fourth place in the 64 KB staging space.
__device__ __forceinline__ int32_t staged_index(int32_t row, int32_t chunks, int32_t chunk) {
  return row * chunks + (chunk ^ (row & 7));
}

// Calls visit(row, chunk) for this thread's share of the chunks of `rows` staged rows of `chunks` chunks: each thread
// keeps one chunk column and steps over the rows (threads past the last whole row of chunks idle where a row has fewer
// chunks than there are threads). NOTE: a loop over (row, chunk) pairs divided every index by the run-time chunk
// count: the staging loop drew 5.2% of batch 32's stall samples (twentieth session, run 1).
template <typename Visit>
__device__ __forceinline__ void for_each_staged_chunk(int32_t rows, int32_t chunks, int consumer_thread, Visit visit) {
  constexpr int kThreads = KernelConfig::kConsumerThreads;
  const int32_t lanes_per_row = min(chunks, kThreads), rows_at_once = kThreads / lanes_per_row;
  const int32_t first_row = consumer_thread / lanes_per_row, column = consumer_thread % lanes_per_row;
  if (first_row >= rows_at_once) return;
  for (int32_t r = first_row; r < rows; r += rows_at_once)
    for (int32_t chunk = column; chunk < chunks; chunk += lanes_per_row) visit(r, chunk);
}

// Input rows [b0, b0 + rows) into shared memory as bf16 (rows, k) in staged_index order, normalized when the task
// fuses a norm (each row's 1 / rms from its staged values, then the rows normalized the way the forward's norm op
// rounds them).
// `scratch` (the output tile: kDecodeInvRmsBytes + 2 k bytes) holds each row's 1 / rms and the norm weight. Ends
// with the consumers synchronized. NOTE: the rows and the norm weight arrive in one round of cp.async copies, and
// the sums of squares are taken from shared memory: reading the rows twice from L2 (sums, then staging) put an extra
// round trip on the critical path of every normalizing tile.
__device__ __forceinline__ void stage_decode_rows(const MegakernelParams& p, const Instruction& in,
                                                  const DecodeGemmTask& t, int32_t b0, int32_t rows, uint4* staged,
                                                  float* scratch, int consumer_thread) {
  constexpr int kThreads = KernelConfig::kConsumerThreads;
  const int warp = consumer_thread / 32, lane = consumer_thread % 32;
  const int32_t chunks = t.k / 8;
  float* inv_rms = scratch;                                   // (rows)
  uint4* norm_weight = reinterpret_cast<uint4*>(scratch + KernelConfig::kDecodeInvRmsBytes / 4);  // (chunks)
  const uint4* x = reinterpret_cast<const uint4*>(t.a + int64_t(b0) * t.row_stride);
  const int64_t x_row = t.row_stride / 8;  // uint4s between input rows
  for_each_staged_chunk(rows, chunks, consumer_thread, [&](int32_t r, int32_t chunk) {
    ptx::cp_async_16(staged + staged_index(r, chunks, chunk), x + r * x_row + chunk, 16);
  });
  if (t.norm_weight != nullptr)
    for (int32_t c = consumer_thread; c < chunks; c += kThreads)
      ptx::cp_async_16(norm_weight + c, reinterpret_cast<const uint4*>(t.norm_weight) + c, 16);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  ptx::named_barrier_sync(1, kThreads);
  if (t.norm_weight == nullptr) return;
  for (int32_t r = warp; r < rows; r += KernelConfig::kConsumerWarps) {  // a sum needs no unswizzling
    float sum = 0.0f;
    for (int32_t chunk = lane; chunk < chunks; chunk += 32)
      sum += sum_of_squares_of_chunk(staged[r * chunks + chunk]);
    sum = warp_sum(sum);
    if (lane == 0) inv_rms[r] = 1.0f / sqrtf(sum / float(t.k) + p.dims.rms_norm_eps);
  }
  ptx::named_barrier_sync(1, kThreads);
  for_each_staged_chunk(rows, chunks, consumer_thread, [&](int32_t r, int32_t chunk) {
    const int32_t at = staged_index(r, chunks, chunk);
    staged[at] = normalize_chunk(staged[at], norm_weight[chunk], inv_rms[r]);
  });
  ptx::named_barrier_sync(1, kThreads);
}

// a . w over 8 bf16 of each.
__device__ __forceinline__ float dot_chunk(const uint4& a, const uint4& w, float acc) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(a2[i]);
    const float2 y = __bfloat1622float2(w2[i]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  return acc;
}

// Weight streaming: each warp copies its pairs' weight rows into its own ring of kStepBuffers steps with cp.async
// (no registers held, so 3 steps, 12 KB a warp, stay in flight while one is computed), a step being kStepChunks
// 16-byte chunks per lane of both rows of a pair. A lane reads back only the chunks it copied: no warp barriers.
// NOTE: with the loads in registers instead, ptxas (168 registers for the whole kernel) kept only ~4 of them in
// flight per lane (SASS), and the GEMM tiles streamed at ~14 GB/s per SM.
constexpr int kStepChunks = 4;
constexpr int kStepBuffers = 4;
constexpr int kStepUint4s = 2 * kStepChunks * 32;  // 4 KB: two weight rows
constexpr int kStagedRowBytes = KernelConfig::kDecodeStagedRowBytes;
static_assert(KernelConfig::kConsumerWarps * kStepBuffers * kStepUint4s * 16 == KernelConfig::kDecodeWeightRingBytes,
              "the weight steps of every consumer warp fill the decode weight ring");
static_assert(kStagedRowBytes >= 64 * 1024, "the stage ring holds the weight steps and 64 KB of input rows");

// Step `step` of output pair `pair`: chunks [step kStepChunks 32, +kStepChunks 32) of its two weight rows.
__device__ __forceinline__ void issue_weight_step(const MegakernelParams& p, const Instruction& in,
                                                  const DecodeGemmTask& t, int32_t pair, int32_t step, uint4* buffer,
                                                  int lane) {
  const int32_t chunks = t.k / 8;
  const int2 rows = decode_weight_rows(p, in, pair);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4* row = reinterpret_cast<const uint4*>(t.w + int64_t(r == 0 ? rows.x : rows.y) * t.row_stride);
#pragma unroll
    for (int u = 0; u < kStepChunks; ++u) {
      const int32_t chunk = (step * kStepChunks + u) * 32 + lane;
      const bool valid = chunk < chunks;
      ptx::cp_async_16(buffer + (r * kStepChunks + u) * 32 + lane, row + (valid ? chunk : 0), valid ? 16 : 0);
    }
  }
}

// One warp's stream of weight steps through its ring: warp w takes pairs w, w + 8, ..., their steps one stream.
// NOTE: the pair and k-step of a step are counted along, not divided out: steps_per_pair is known only at run time,
// and the divisions by it drew a quarter of the step loop's stall samples (ncu, fourteenth session, run 5).
struct WeightStream {
  int warp, lane;
  int32_t steps_per_pair, steps;
  uint4* own;               // this warp's kStepBuffers steps
  int32_t next_pair;        // the pair and k-step of the step issue() sends next (it sends them in order)
  int32_t next_k_step = 0;

  __device__ __forceinline__ WeightStream(const DecodeGemmTask& t, uint4* ring, int consumer_thread) {
    constexpr int kWarps = KernelConfig::kConsumerWarps;
    warp = consumer_thread / 32;
    lane = consumer_thread % 32;
    const int32_t chunks = t.k / 8;
    steps_per_pair = (chunks + kStepChunks * 32 - 1) / (kStepChunks * 32);
    steps = (warp < t.pairs ? (t.pairs - warp + kWarps - 1) / kWarps : 0) * steps_per_pair;
    own = ring + warp * kStepBuffers * kStepUint4s;
    next_pair = warp;
  }
  // Sends step `step`, the one after the last sent (0 first).
  __device__ __forceinline__ void issue(const MegakernelParams& p, const Instruction& in, const DecodeGemmTask& t,
                                        int32_t step) {
    if (step < steps)
      issue_weight_step(p, in, t, next_pair, next_k_step, own + step % kStepBuffers * kStepUint4s, lane);
    ptx::cp_async_commit();  // empty groups too: one group per step keeps the wait count exact
    step_past();
  }
  __device__ __forceinline__ void issue_prologue(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeGemmTask& t) {
    for (int32_t step = 0; step < kStepBuffers; ++step) issue(p, in, t, step);
  }
  // The prologue went out from another WeightStream of the same task (before the counter wait): this one goes on
  // after it.
  __device__ __forceinline__ void prologue_sent() {
    for (int32_t step = 0; step < kStepBuffers; ++step) step_past();
  }

 private:
  __device__ __forceinline__ void step_past() {
    if (++next_k_step == steps_per_pair) {
      next_k_step = 0;
      next_pair += KernelConfig::kConsumerWarps;
    }
  }
};

// The step a stream's loop sends at step `step`: step + kStepBuffers - 1, into the buffer the previous step used. At
// step 0 that is the prologue's last, already sent (a prologue fills every buffer: nothing is computed before the
// first step), and an empty group keeps one group per step.
template <typename Stream>
__device__ __forceinline__ void issue_next_step(Stream& stream, const MegakernelParams& p, const Instruction& in,
                                                const DecodeGemmTask& t, int32_t step) {
  if (step == 0) {
    ptx::cp_async_commit();
  } else {
    stream.issue(p, in, t, step + kStepBuffers - 1);
  }
}

// Every output pair of the task for staged rows [b0, b0 + rows), rows <= kRows, the stream's first steps already on
// their way (the first pass's sent before the task's counter wait: weights depend on nothing).
template <int kRows>
__device__ __forceinline__ void decode_gemm_rows(const MegakernelParams& p, const Instruction& in,
                                                 const DecodeGemmTask& t, const uint4* staged, uint4* ring,
                                                 int32_t b0, int32_t rows, int consumer_thread) {
  WeightStream stream(t, ring, consumer_thread);
  const int lane = stream.lane;
  const int32_t chunks = t.k / 8, steps = stream.steps, steps_per_pair = stream.steps_per_pair;
  const uint4* own = stream.own;
  stream.prologue_sent();
  float acc[kRows][2] = {};
  int32_t pair = stream.warp, k_step = 0;  // of the step computed
  for (int32_t step = 0; step < steps; ++step) {
    issue_next_step(stream, p, in, t, step);
    ptx::cp_async_wait<kStepBuffers - 1>();
    const uint4* buffer = own + step % kStepBuffers * kStepUint4s;
#pragma unroll
    for (int u = 0; u < kStepChunks; ++u) {
      const int32_t chunk = (k_step * kStepChunks + u) * 32 + lane;
      if (chunk >= chunks) break;
      const uint4 w0 = buffer[u * 32 + lane], w1 = buffer[(kStepChunks + u) * 32 + lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint4 a = staged[staged_index(r, chunks, chunk)];
        acc[r][0] = dot_chunk(a, w0, acc[r][0]);
        acc[r][1] = dot_chunk(a, w1, acc[r][1]);
      }
    }
    if (++k_step < steps_per_pair) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float x0 = warp_sum(acc[r][0]), x1 = warp_sum(acc[r][1]);
      if (lane == r && r < rows) decode_epilogue(p, in, pair, b0 + r, x0, x1);
      acc[r][0] = acc[r][1] = 0.0f;
    }
    k_step = 0;
    pair += KernelConfig::kConsumerWarps;
  }
  ptx::cp_async_wait<0>();  // the trailing empty groups
}

__device__ __forceinline__ bool is_decode_gemm(Opcode opcode) {
  return opcode == Opcode::kDecodeQ || opcode == Opcode::kDecodeKv || opcode == Opcode::kDecodeOProj ||
         opcode == Opcode::kDecodeGateUp || opcode == Opcode::kDecodeDown || opcode == Opcode::kDecodeLmHead;
}

// Batch rows per pass of task t: as many as the staging space holds, up to kDecodeMaxRows.
__device__ __forceinline__ int32_t decode_rows_at_full_k(const DecodeGemmTask& t) {
  return min(kDecodeMaxRows, kStagedRowBytes / (2 * t.k));
}

// Prefill: kv_cache[l][rows] <- the K (into pair order) and V columns of the matching qkv rows; rows are cache rows
// b C + [s0, s1) of one sequence b.
__device__ __forceinline__ void run_kv_append(const MegakernelParams& p, const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int64_t layer = in.layer, C = d.max_context;
  const int32_t width = 2 * d.kv_dim;
  const int32_t rows = in.row_end - in.row_begin;
  for (int32_t i = consumer_thread; i < rows * width; i += KernelConfig::kConsumerThreads) {
    const int32_t cache_row = in.row_begin + i / width, col = i % width;
    const int64_t token_row = int64_t(cache_row / C) * d.seq_len + cache_row % C;
    const int32_t source = d.q_dim + (col < d.kv_dim ? pair_order_row(col, d.head_dim) : col);
    const __nv_bfloat16 value = __ldcg(p.qkv + (layer * d.tokens + token_row) * d.qkv_dim + source);
    p.kv_cache[(layer * d.batch * C + cache_row) * width + col] = value;
  }
}

}  // namespace mk::gpu
