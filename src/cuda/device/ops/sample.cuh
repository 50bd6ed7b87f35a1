// Greedy sampling of a decode step: each sequence's argmax over its logits (ties to the lower id), by the consumer
// warps with the row staged through shared memory.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// The better of two (logit, id) candidates: the larger logit, ties to the lower id.
__device__ __forceinline__ void keep_best(float& value, int32_t& id, float other_value, int32_t other_id) {
  if (other_value > value || (other_value == value && other_id < id)) {
    value = other_value;
    id = other_id;
  }
}

// The row goes through shared memory in passes of kSamplePassBytes, double-buffered after a 256-byte header
// (run_sample's per-warp candidates).
constexpr int kSamplePassBytes = 64 * 1024;
constexpr int32_t kSamplePassChunks = kSamplePassBytes / 16;
constexpr int kSampleChains = 4;
constexpr int kSampleHeaderBytes = 256;
static_assert(2 * KernelConfig::kConsumerWarps * 4 <= kSampleHeaderBytes, "a value and an id a warp fit the header");
static_assert(kSampleHeaderBytes + 2 * kSamplePassBytes <= KernelConfig::kNumStages * KernelConfig::kStageBytes,
              "both pass buffers fit the ring");

// Pass `pass` of a row of `chunks` 16-byte chunks: its first chunk, its chunk count and its buffer.
struct SamplePass {
  int32_t first, chunks;
  uint4* buffer;
  __device__ __forceinline__ SamplePass(int32_t row_chunks, int32_t pass, uint4* buffers)
      : first(pass * kSamplePassChunks),
        chunks(min(kSamplePassChunks, row_chunks - pass * kSamplePassChunks)),
        buffer(buffers + pass % 2 * kSamplePassChunks) {}
};

// This thread's copies of one pass, one commit group.
__device__ __forceinline__ void issue_sample_pass(const uint4* row, const SamplePass& pass, int consumer_thread) {
#pragma unroll 1
  for (int32_t c = consumer_thread; c < pass.chunks; c += KernelConfig::kConsumerThreads)
    ptx::cp_async_16(pass.buffer + c, row + pass.first + c, 16);
  ptx::cp_async_commit();
}

// This thread's best (logit, id) of one row of logits: the next pass's 16-byte copies are in flight while this one is
// scanned. NOTE: loads into registers, even 8 deep, left the 128k logits of a Llama vocabulary a chain of round trips
// on this one SM (27-63 us); one 128 KB pass at a time, copied and then scanned, took 12.2 us (fourteenth session,
// run 3), most of it in the scan's one dependent chain of comparisons a thread: kSampleChains independent ones now,
// merged at the end. The better of two (keep_best) is associative and commutative over the values a chain can hold
// (a NaN never becomes a candidate: both comparisons are false for it), so any grouping picks the same logit and id.
// The loops stay rolled: unrolled, they pushed the kernel past its 168 registers (ptxas spilled kernel-wide values).
// logits: (vocab) one row; buffers: (2, kSamplePassChunks) the two pass buffers in the idle stage ring.
__device__ __forceinline__ void best_of_row(const __nv_bfloat16* logits, int32_t vocab, uint4* buffers,
                                            int consumer_thread, float& value, int32_t& id) {
  const int32_t chunks = vocab % 8 == 0 ? vocab / 8 : 0;  // rows are 16-byte aligned only then
  const int32_t passes = (chunks + kSamplePassChunks - 1) / kSamplePassChunks;
  const uint4* row = reinterpret_cast<const uint4*>(logits);
  float values[kSampleChains];
  int32_t ids[kSampleChains];
#pragma unroll
  for (int k = 0; k < kSampleChains; ++k) {
    values[k] = value;
    ids[k] = id;
  }
  if (passes > 0) issue_sample_pass(row, SamplePass(chunks, 0, buffers), consumer_thread);
#pragma unroll 1
  for (int32_t p = 0; p < passes; ++p) {
    // NOTE: each thread scans only the chunks it copied, so neither wait needs a barrier; the next pass refills
    // the buffer this thread scanned last.
    if (p + 1 < passes) {
      issue_sample_pass(row, SamplePass(chunks, p + 1, buffers), consumer_thread);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    const SamplePass pass(chunks, p, buffers);
#pragma unroll 1
    for (int32_t c = consumer_thread; c < pass.chunks; c += KernelConfig::kConsumerThreads) {
      const uint4 packed = pass.buffer[c];
      const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&packed);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        keep_best(values[e % kSampleChains], ids[e % kSampleChains], __bfloat162float(x[e]), 8 * (pass.first + c) + e);
    }
  }
#pragma unroll
  for (int k = 0; k < kSampleChains; ++k) keep_best(value, id, values[k], ids[k]);
  // Only a vocabulary that is not a multiple of 8 reaches this, which the gpu engine refuses today (runtime.cc): it
  // keeps the op right for any vocabulary.
  for (int32_t i = 8 * chunks + consumer_thread; i < vocab; i += KernelConfig::kConsumerThreads)
    keep_best(value, id, __bfloat162float(__ldcg(logits + i)), i);
}

// sampled[rows] <- argmax of logits[rows] (greedy), ties to the lower id.
__device__ __forceinline__ void run_sample(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                           int consumer_thread) {
  const int warp = consumer_thread / 32, lane = consumer_thread % 32;
  const int32_t vocab = p.dims.vocab_size;
  float* warp_values = reinterpret_cast<float*>(s.stages);
  int32_t* warp_ids = reinterpret_cast<int32_t*>(warp_values + KernelConfig::kConsumerWarps);
  for (int32_t b = in.row_begin; b < in.row_end; ++b) {
    const __nv_bfloat16* logits = p.logits + int64_t(b) * vocab;
    float value = -INFINITY;
    int32_t id = vocab;
    best_of_row(logits, vocab, reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(s.stages) + kSampleHeaderBytes),
                consumer_thread, value, id);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      keep_best(value, id, __shfl_xor_sync(0xffffffff, value, offset), __shfl_xor_sync(0xffffffff, id, offset));
    if (lane == 0) {
      warp_values[warp] = value;
      warp_ids[warp] = id;
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
    if (consumer_thread == 0) {
      for (int w = 1; w < KernelConfig::kConsumerWarps; ++w) keep_best(value, id, warp_values[w], warp_ids[w]);
      p.sampled[b] = id < vocab ? id : 0;
    }
    ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  }
}

}  // namespace mk::gpu
