// The combine of split-KV decode attention: a sequence's partial records (decode_attention.cuh) merged in block
// order by the consumer warps, staged in the idle stage ring where they fit; run as its own instruction or by the
// attention task that takes its group's last ticket (run_combine_if_last).
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../sync.cuh"
#include "decode_attention.cuh"

namespace mk::gpu {

// One attention output value from its head's partial records of `blocks` KV blocks, combined in block order:
// sum_b w_b o_b / sum_b w_b sum_b with w_b = exp(max_b - max). load(block, at) reads float `at` of block's record
// (o at [0, head_dim), then max and sum), from global or shared memory.
template <typename Load>
__device__ __forceinline__ float combine_records(int32_t blocks, int32_t hd, int32_t e, Load load) {
  float max = -INFINITY;
  for (int32_t block = 0; block < blocks; ++block) max = fmaxf(max, load(block, hd));
  float acc = 0.0f, sum = 0.0f;
  for (int32_t block = 0; block < blocks; ++block) {
    const float weight = __expf(load(block, hd) - max);
    sum = fmaf(weight, load(block, hd + 1), sum);
    acc = fmaf(weight, load(block, e), acc);
  }
  return acc / sum;
}

// Column col of sequence b's attention output in layer `layer`: the partials of its head combined in block order.
__device__ __forceinline__ float combine_partials(const MegakernelParams& p, int64_t layer, int32_t b, int32_t col) {
  const ModelDims& d = p.dims;
  const int32_t hd = d.head_dim, stride = hd + kPartialStats, e = col % hd;
  const int32_t rows_per_sequence = partial_rows_per_sequence(d);
  const int64_t record_row = int64_t(d.q_dim / hd) * stride;
  const int32_t blocks = p.positions[b] / kDecodeKvBlock + 1;
  const float* first =
      p.attn_partial + (layer * d.batch + b) * rows_per_sequence * record_row + int64_t(col / hd) * stride;
  auto record = [&](int32_t block) { return first + int64_t(partial_row_of_block(d, block)) * record_row; };
  return combine_records(blocks, hd, e, [&](int32_t block, int32_t at) { return __ldcg(record(block) + at); });
}

// Sequence b's partial records of query heads [head_begin, head_begin + heads), every block up to its position, into
// `scratch` (block j's at j * heads * (head_dim + kPartialStats) floats), every 16-byte copy in flight at once.
// NOTE: read record by record, value by value, they are a chain of L2 trips per value: a combine task took 4.5 us
// at batch 1 (sixth session, run 3). False, copying nothing, when they do not fit scratch_bytes. Ends with the
// consumers synchronized when true.
__device__ __forceinline__ bool stage_partial_records(const MegakernelParams& p, int64_t layer, int32_t b,
                                                      int32_t head_begin, int32_t heads, float* scratch,
                                                      int32_t scratch_bytes, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int32_t stride = d.head_dim + kPartialStats, block_floats = heads * stride;
  const int64_t record_row = int64_t(d.q_dim / d.head_dim) * stride;
  const int32_t blocks = p.positions[b] / kDecodeKvBlock + 1;
  if (int64_t(blocks) * block_floats * 4 > scratch_bytes) return false;
  const float* first = p.attn_partial + (layer * d.batch + b) * partial_rows_per_sequence(d) * record_row +
                       int64_t(head_begin) * stride;
  const int32_t chunks = block_floats / 4;
  for (int32_t i = consumer_thread; i < blocks * chunks; i += KernelConfig::kConsumerThreads) {
    const float* block = first + int64_t(partial_row_of_block(d, i / chunks)) * record_row;
    ptx::cp_async_16(reinterpret_cast<uint4*>(scratch) + i, reinterpret_cast<const uint4*>(block) + i % chunks, 16);
  }
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  return true;
}

// Output value e of head `head` (of the staged heads) from records staged by stage_partial_records.
__device__ __forceinline__ float combine_staged(const ModelDims& d, const float* scratch, int32_t blocks,
                                                int32_t heads, int32_t head, int32_t e) {
  const int32_t stride = d.head_dim + kPartialStats;
  const float* record = scratch + head * stride;
  return combine_records(blocks, d.head_dim, e,
                         [&](int32_t block, int32_t at) { return record[block * heads * stride + at]; });
}

// attn[l][rows, cols] <- for sequences rows and the query heads of cols, their partials combined: the records staged
// in the (idle) stage ring where they fit, then one thread per output element.
__device__ __forceinline__ void run_decode_combine(const MegakernelParams& p, const SharedState& s,
                                                   const Instruction& in, int consumer_thread) {
  const ModelDims& d = p.dims;
  const int32_t width = in.col_end - in.col_begin, heads = width / d.head_dim, head_begin = in.col_begin / d.head_dim;
  float* scratch = reinterpret_cast<float*>(s.stages);
  constexpr int32_t kScratchBytes = KernelConfig::kNumStages * KernelConfig::kStageBytes;
  for (int32_t b = in.row_begin; b < in.row_end; ++b) {
    const int32_t blocks = p.positions[b] / kDecodeKvBlock + 1;
    const bool staged = stage_partial_records(p, in.layer, b, head_begin, heads, scratch, kScratchBytes,
                                              consumer_thread);
    for (int32_t i = consumer_thread; i < width; i += KernelConfig::kConsumerThreads) {
      const float value = staged ? combine_staged(d, scratch, blocks, heads, i / d.head_dim, i % d.head_dim)
                                 : combine_partials(p, in.layer, b, in.col_begin + i);
      p.attn[(int64_t(in.layer) * d.batch + b) * d.q_dim + in.col_begin + i] = __float2bfloat16_rn(value);
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);  // the next row's records overwrite these
  }
}

// The end of a linked attention task (kAttentionRunsCombine), after its own publication: it takes a ticket of its
// group (layer, sequence, kv head), and the task that takes the launch's last runs the group's combine in the combine
// instruction's place and signals the combine's counter. `trace`: the combine's trace slots, or null.
// NOTE: thread 0's ticket releases this task's partials (ordered before it by the publication's barrier) and
// acquires those the group's earlier tickets released; the barrier after it passes that on to every consumer, as
// the poller's report did when the combine waited for its counters on an SM of its own.
__device__ __forceinline__ void run_combine_if_last(const MegakernelParams& p, const SharedState& s,
                                                    const Instruction& in, uint32_t sm, int consumer_thread,
                                                    uint64_t* trace) {
  const ModelDims& d = p.dims;
  ptx::cp_async_wait<0>();  // the combine stages its records where the attention staged K and V
  if (consumer_thread == 0) {
    const int64_t kv_heads = d.kv_dim / d.head_dim;
    uint32_t* ticket = p.combine_tickets + (int64_t(in.layer) * d.batch + in.sequence) * kv_heads + in.head;
    *s.last_of_group = ptx::add_acq_rel(ticket, 1) + 1 == p.epoch * uint32_t(d.kv_splits) ? 1u : 0u;
  }
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  // NOTE: rewritten only at the next linked attention task, after the next instruction's counter wait's barrier.
  if (*s.last_of_group == 0) return;
  if (trace) trace[kTraceStart] = trace[kTraceWaitsDone] = clock64();
  const int32_t width = d.group_size * d.head_dim;
  Instruction combine{};
  combine.opcode = Opcode::kDecodeCombine;
  combine.layer = in.layer;
  combine.row_begin = in.sequence;
  combine.row_end = in.sequence + 1;
  combine.col_begin = in.head * width;
  combine.col_end = combine.col_begin + width;
  run_decode_combine(p, s, combine, consumer_thread);
  if (trace) trace[kTraceMathDone] = clock64();
  publish(p, in.combine_counter, consumer_thread);
  if (trace) {
    trace[kTraceEnd] = clock64();
    trace[kTraceRanOnSm] = sm + 1;
  }
}

}  // namespace mk::gpu
