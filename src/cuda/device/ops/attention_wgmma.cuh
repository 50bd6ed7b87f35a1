// Causal attention tiles with wgmma: one (sequence, 128-query block, query head) per instruction. The producer loads
// Q into the output tile, then K and V blocks of 128 keys into separate stages of the ring; each consumer warpgroup
// owns 64 queries: S = Q K^T (wgmma, both operands in shared memory), online softmax in registers (base 2), and
// O += P V (wgmma with P from registers, V N-major in shared memory), pipelined so that the P V of one key block
// runs on the tensor cores during the softmax of the next. O replaces Q in the output tile and the storer stores it
// with TMA.
#pragma once

#include <cuda_bf16.h>

#include "../config.cuh"
#include "../output_tile.cuh"
#include "../ptx.cuh"
#include "../sync.cuh"

namespace mk::gpu {

// Key blocks the tile needs: keys [0, last query of the tile].
__device__ __forceinline__ int32_t attention_kv_blocks(const MegakernelParams& p, const Instruction& in) {
  const int32_t query_end = in.row_end - in.sequence * p.dims.seq_len;
  return (query_end + KernelConfig::kBlockKv - 1) / KernelConfig::kBlockKv;
}

// ---- producer ----

// Where an attention tile's operands and output are, in the TMA maps' coordinates: Q (kMapQuery), the K and V columns
// of its kv head (kMapKeyValue) and O (kMapAttnOut, Q's rows and columns), all in the plane of its (layer, sequence).
struct AttentionOperands {
  int32_t boxes;  // 64-column boxes in a head
  int32_t plane;
  int32_t query_begin;
  int32_t k_col;
  int32_t v_col;
};

__device__ __forceinline__ AttentionOperands attention_operands(const MegakernelParams& p, const Instruction& in) {
  const ModelDims& d = p.dims;
  const int32_t kv_head = in.head / d.group_size;
  return {d.head_dim / KernelConfig::kBoxCols, in.layer * d.batch + in.sequence, in.row_begin - in.sequence * d.seq_len,
          d.q_dim + kv_head * d.head_dim, d.q_dim + d.kv_dim + kv_head * d.head_dim};
}

// TMA-loads block kb of one kind (K or V, at column col) into the stage at ring position `at`, once the consumers
// freed it.
__device__ __forceinline__ bool load_kv_block(const MegakernelParams& p, const SharedState& s, PipelineState at,
                                              const AttentionOperands& a, int32_t col, int32_t kb, Site site) {
  if (!wait_barrier(p, &s.empty[at.stage], at.phase ^ 1, site)) return false;
  uint8_t* stage = s.stage(at.stage);
  ptx::mbarrier_arrive_expect_tx(&s.full[at.stage], uint32_t(KernelConfig::kBlockKv * p.dims.head_dim * 2));
  for (int32_t box = 0; box < a.boxes; ++box)
    ptx::tma_load_3d(stage + box * KernelConfig::kBlockKv * 128, &p.maps[kMapKeyValue], &s.full[at.stage],
                     col + KernelConfig::kBoxCols * box, kb * KernelConfig::kBlockKv, a.plane);
  return true;
}

// The ring position `steps` stages after `from`.
__device__ __forceinline__ PipelineState ring_position(PipelineState from, int32_t steps) {
  const uint32_t stage = from.stage + uint32_t(steps);
  return {stage % KernelConfig::kNumStages, from.phase ^ ((stage / KernelConfig::kNumStages) & 1)};
}

// Q into the output tile, then the key blocks in the order K0 V0 K1, K_{j+1} V_j for j = 1 .. n - 2, V_{n-1}; K_j
// at ring position 2j of the instruction, V_j at 2j + 1.
// NOTE: K_{j+1} goes out before V_j although it sits after it in the ring: its stage (K_{j-1}'s) is freed once
// Q K_{j-1}^T retires, early in the consumers' block j - 1, and V_j's (V_{j-2}'s) only once P V_{j-2} does, at that
// block's end. In ring order K_{j+1} waited behind V_j and landed after it, when the consumers wanted both at once
// (ncu at S=4096: their wait for K_{j+1} drew 20 times the samples of their wait for V_j).
__device__ __forceinline__ bool produce_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, OutputState& output,
                                                  Site site) {
  const AttentionOperands a = attention_operands(p, in);
  if (!load_output_tile(p, s, output, &p.maps[kMapQuery], a.boxes, in.col_begin, a.query_begin, a.plane, site))
    return false;
  ++output.loads;
  ++output.uses;
  const int32_t kv_blocks = attention_kv_blocks(p, in);
  int32_t keys_sent = 0, values_sent = 0;
  while (values_sent < kv_blocks) {
    // K leads V by up to two blocks (four would deadlock: K_{j+3} waits for K_{j-1}'s release, which waits for V_j),
    // by one until V0 is out: an order preference (V0 is wanted first), not a condition of correctness
    const bool send_key = keys_sent < kv_blocks && keys_sent - values_sent < (values_sent == 0 ? 1 : 2);
    const int32_t block = send_key ? keys_sent++ : values_sent++;
    if (!load_kv_block(p, s, ring_position(state, 2 * block + (send_key ? 0 : 1)), a, send_key ? a.k_col : a.v_col,
                       block, site))
      return false;
  }
  state = ring_position(state, 2 * kv_blocks);  // the next instruction's first stage
  return true;
}

// ---- consumers ----

constexpr int kScoreValues = KernelConfig::kBlockKv / 2;  // S registers per thread: 64 queries x 128 keys
constexpr int kKeySteps = KernelConfig::kBlockKv / 16;    // k16 steps of P V over a key block

// P as the A operand of P V: bf16 pairs, one m64k16 fragment per 16 keys.
using ProbabilityFragments = uint32_t[kKeySteps][4];

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// K_j sits at ring position 2j of the instruction and V_j at 2j + 1, so a cursor that follows only the K (or only
// the V) blocks steps over the other kind's stage.
__device__ __forceinline__ void next_block(PipelineState& cursor) {
  cursor.advance();
  cursor.advance();
}

// Issues S (64 queries of this warpgroup x 128 keys) = Q K^T as one commit group, Q from the output tile and K from
// a stage, both K-major. The caller fences before and waits after.
template <int kHeadDim>
__device__ __forceinline__ void issue_attention_scores(const uint8_t* q_tile, const uint8_t* k_tile, int warpgroup,
                                                       float (&score)[kScoreValues]) {
  // NOTE: the steps are added to one descriptor per operand (the start address, in 16-byte units, cannot carry out:
  // shared memory is below 256 KB). Q's is opaque: otherwise the compiler keeps Q's eight descriptors, the same for
  // every key block, in 16 registers through the loop, and the kernel spills.
  const uint64_t desc_q = ptx::opaque(ptx::wgmma_descriptor_k_major_sw128(q_tile + warpgroup * 64 * 128));
  const uint64_t desc_k = ptx::wgmma_descriptor_k_major_sw128(k_tile);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    // 16 head dimensions are 32 bytes of a 128-byte row: 2 in the descriptor's 16-byte units; 64 per box
    const uint32_t q_step = (kk / 4) * (KernelConfig::kOutputBoxBytes >> 4) + 2 * (kk % 4);
    const uint32_t k_step = (kk / 4) * (KernelConfig::kBlockKv * 128 >> 4) + 2 * (kk % 4);
    ptx::wgmma_m64n128k16(score, desc_q + q_step, desc_k + k_step, kk > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// Issues O (64 x kHeadDim) += P (64 x 128 keys) V (128 keys x kHeadDim, N-major) as one commit group. The fragments
// and O belong to the MMA until the caller's wait retires the group.
template <int kHeadDim>
__device__ __forceinline__ void issue_attention_values(const ProbabilityFragments& probability, const uint8_t* v_tile,
                                                       float (&o)[kHeadDim / 2]) {
  const uint64_t desc_v = ptx::wgmma_descriptor_mn_major_sw128(v_tile, KernelConfig::kBlockKv * 128);
#pragma unroll
  for (int kc = 0; kc < kKeySteps; ++kc) {
    const uint32_t v_step = kc * (16 * 128 >> 4);  // 16 keys are 16 rows of 128 bytes
    if constexpr (kHeadDim == 128) {
      ptx::wgmma_m64n128k16_rs_nmajor(o, probability[kc], desc_v + v_step);
    } else {
      ptx::wgmma_m64n64k16_rs_nmajor(o, probability[kc], desc_v + v_step);
    }
  }
  ptx::wgmma_commit_group();
}

// The m64k16 A fragment of keys [16 kc, 16 kc + 16) is the score accumulator's column groups 2 kc and 2 kc + 1.
__device__ __forceinline__ void pack_probabilities(const float (&score)[kScoreValues],
                                                   ProbabilityFragments& probability) {
#pragma unroll
  for (int kc = 0; kc < kKeySteps; ++kc) {
#pragma unroll
    for (int r = 0; r < 4; ++r) probability[kc][r] = pack_bf16(score[8 * kc + 2 * r], score[8 * kc + 2 * r + 1]);
  }
}

// Inter-warpgroup ping-pong of the tile's MMAs (FlashAttention-3's scheduler barriers): a warpgroup issues its
// QK^T and P V only in its turn, right after the other's, so that the tensor cores run one warpgroup's MMAs while the
// other does its softmax, rather than both softmaxes meeting idle tensor cores. Named barriers 2 (warpgroup 0's turn)
// and 3 (warpgroup 1's) each complete when one warpgroup waits at it and the other arrives: per tile, warpgroup 1
// hands the first turn over, and each passes the turn after every issue but warpgroup 1 after its last, so that both
// barriers end the tile balanced (scripts/attention_turns_model.py checks the protocol; CPU tests run it).
struct IssueTurns {
  static constexpr uint32_t kFirstBarrier = 2;  // 0: __syncthreads, 1: the consumers' barrier
  int warpgroup;

  __device__ __forceinline__ explicit IssueTurns(int warpgroup_index) : warpgroup(warpgroup_index) {
    if (warpgroup == 1) ptx::named_barrier_arrive(kFirstBarrier, KernelConfig::kConsumerThreads);
  }
  __device__ __forceinline__ void wait() const {
    ptx::named_barrier_sync(kFirstBarrier + warpgroup, KernelConfig::kConsumerThreads);
  }
  __device__ __forceinline__ void pass(bool last) const {
    if (last && warpgroup == 1) return;
    ptx::named_barrier_arrive(kFirstBarrier + 1 - warpgroup, KernelConfig::kConsumerThreads);
  }
};

// Keeps the compiler from moving accesses to O and P across a wgmma fence or wait.
// NOTE: a register written between the wgmma fence and the MMA that reads it makes ptxas serialize every wgmma of
// the kernel, so the rescale of O and the packing of P are complete before the fence.
template <int kHeadDim>
__device__ __forceinline__ void fence_value_operands(float (&o)[kHeadDim / 2], ProbabilityFragments& probability) {
  ptx::fence_registers(o);
#pragma unroll
  for (int kc = 0; kc < kKeySteps; ++kc) ptx::fence_registers(probability[kc]);
}

template <int kHeadDim>
__device__ __forceinline__ void rescale_output(float (&o)[kHeadDim / 2], float2 correction) {
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= (i / 2) % 2 == 0 ? correction.x : correction.y;
}

// Independent partial maxima and sums a row half: one running value would chain 32 dependent FMNMX (or FADD) a
// block, and the softmax, on the path between a warpgroup's MMA issues, stalled on that chain (ncu at S=4096).
constexpr int kSoftmaxChains = 4;

// The chain of score i (score[4 j + e]: key group j, row half e / 2): each row half's scores spread over all chains.
__host__ __device__ constexpr int softmax_chain(int i) { return (i / 4 * 2 + i % 2) % kSoftmaxChains; }
static_assert(kSoftmaxChains == 4, "the chains are combined as two pairs");

// Per row half, the largest score of the block; on the diagonal block keys past the row's query are set to -inf
// first. The mask is compiled into its own loop: as a run-time condition of every score it cost every block as
// many instructions as the maxima themselves (ncu at S=4096), though only the last block of a tile needs it.
template <bool kDiagonal>
__device__ __forceinline__ void block_row_max(float (&score)[kScoreValues], int32_t first_key, int32_t query0,
                                              int thread_in_wg, float (&block_max)[2]) {
  float partial[kSoftmaxChains][2];
#pragma unroll
  for (int c = 0; c < kSoftmaxChains; ++c) partial[c][0] = partial[c][1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < kScoreValues / 4; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2;
      float& value = score[4 * j + e];
      if constexpr (kDiagonal) {
        const int32_t key = first_key + 8 * j + 2 * (thread_in_wg % 4) + (e % 2);
        if (key > query0 + 8 * half) value = -INFINITY;
      }
      float& chain = partial[softmax_chain(4 * j + e)][half];
      chain = fmaxf(chain, value);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    block_max[half] = fmaxf(fmaxf(partial[0][half], partial[1][half]), fmaxf(partial[2][half], partial[3][half]));
  }
}

// Online softmax of one block of scores, in place (scores become unnormalized probabilities); returns the factor
// by which the output accumulated so far must be scaled, per row half.
__device__ __forceinline__ float2 online_softmax(float (&score)[kScoreValues], float (&row_max)[2],
                                                 float (&row_sum)[2], float scale_log2, bool diagonal,
                                                 int32_t first_key, int32_t query0, int thread_in_wg) {
  float block_max[2];
  if (diagonal) {
    block_row_max<true>(score, first_key, query0, thread_in_wg, block_max);
  } else {
    block_row_max<false>(score, first_key, query0, thread_in_wg, block_max);
  }
  float correction[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    block_max[half] = fmaxf(block_max[half], __shfl_xor_sync(0xffffffff, block_max[half], 1));
    block_max[half] = fmaxf(block_max[half], __shfl_xor_sync(0xffffffff, block_max[half], 2));
    const float new_max = fmaxf(row_max[half], block_max[half]);  // finite: key 0 is visible to every query
    correction[half] = ptx::exp2_ftz((row_max[half] - new_max) * scale_log2);
    row_max[half] = new_max;
  }
  // NOTE: scores stay unscaled until here, so scaling and the max's subtraction are one FFMA per score: the timed
  // runs are power-capped (docs/perf.md, fourth session, run 7), where instructions removed count.
  const float max_scaled[2] = {row_max[0] * scale_log2, row_max[1] * scale_log2};
  float partial_sum[kSoftmaxChains][2] = {};
#pragma unroll
  for (int i = 0; i < kScoreValues; ++i) {
    const int half = (i / 2) % 2;
    score[i] = ptx::exp2_ftz(fmaf(score[i], scale_log2, -max_scaled[half]));
    partial_sum[softmax_chain(i)][half] += score[i];
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float block_sum =
        (partial_sum[0][half] + partial_sum[1][half]) + (partial_sum[2][half] + partial_sum[3][half]);
    row_sum[half] = row_sum[half] * correction[half] + block_sum;
  }
  return make_float2(correction[0], correction[1]);
}

// The tile's key blocks, pipelined within the warpgroup: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together,
// so that the tensor cores work through P V while the softmax of S_j runs; O takes block j's correction after
// P_{j-1} V_{j-1} is in it and before P_j V_j is. Stages are freed as their MMAs retire, K_j before V_{j-1}: each
// stage has its own empty barrier, and the producer refills one only after every consumer warp freed it.
// Returns false when a wait gave up (aborting): there is no early exit, since wgmma must stay warpgroup-convergent
// and both warpgroups must take every issue turn (IssueTurns: an early exit would hang the other in bar.sync, which no
// bounded wait catches).
// NOTE: the waits for the next blocks (V_j, K_{j+1}) sit between the softmax and the P V wait: ptxas issues a wgmma
// wait as early as its basic block allows, ahead of the softmax it should overlap, and the barrier waits end the
// block. At the top of the loop they made the kernel spill (ptxas -v), as did waiting for Q in the caller.
template <int kHeadDim>
__device__ __forceinline__ bool attention_mainloop(const MegakernelParams& p, const SharedState& s,
                                                   const Instruction& in, PipelineState& state, OutputState& output,
                                                   Site site, int warpgroup, int thread_in_wg, float (&o)[kHeadDim / 2],
                                                   float (&row_sum)[2], uint64_t* trace) {
  const ModelDims& d = p.dims;
  const int32_t query_begin = in.row_begin - in.sequence * d.seq_len;
  // position (within the sequence) of this thread's first accumulator row; the second is 8 further
  const int32_t query0 = query_begin + warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
  const int32_t kv_blocks = attention_kv_blocks(p, in);
  float row_max[2] = {-INFINITY, -INFINITY};
  // Only the last block meets the diagonal: earlier blocks end before the tile's first query.
  auto softmax = [&](float(&score)[kScoreValues], int32_t kb) {
    return online_softmax(score, row_max, row_sum, d.softmax_scale_log2, kb == kv_blocks - 1,
                          kb * KernelConfig::kBlockKv, query0, thread_in_wg);
  };
  PipelineState key = state;
  PipelineState value = state;
  value.advance();
  float score[kScoreValues];
  ProbabilityFragments probability;

  // NOTE: output_free's wait passes at once (the producer loaded Q only after the previous use's store had read the
  // tile), but every phase the storer completes must be waited on: compute-sanitizer synccheck reports a phase
  // completed over an unwaited one ("Missing wait") where an attention tile follows a GEMM tile on an SM.
  bool ok = wait_barrier(p, s.output_free, output.free_parity(), site);
  ok &= wait_barrier(p, s.loaded, output.loaded_parity(), site);  // Q
  if (trace) trace[kTraceDataReady] = clock64();
  ok &= wait_barrier(p, &s.full[key.stage], key.phase, site);
  const IssueTurns turns(warpgroup);
  turns.wait();
  ptx::wgmma_fence();
  issue_attention_scores<kHeadDim>(s.output, s.stage(key.stage), warpgroup, score);
  turns.pass(false);
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(score);
  release_stage(s, key.stage);
  next_block(key);
  softmax(score, 0);  // its correction would scale an O that is still zero
  pack_probabilities(score, probability);
  ok &= wait_barrier(p, &s.full[value.stage], value.phase, site);
  if (kv_blocks > 1) ok &= wait_barrier(p, &s.full[key.stage], key.phase, site);

  for (int32_t kb = 1; kb < kv_blocks; ++kb) {
    fence_value_operands<kHeadDim>(o, probability);
    turns.wait();
    ptx::wgmma_fence();
    issue_attention_scores<kHeadDim>(s.output, s.stage(key.stage), warpgroup, score);  // committed first: retires first
    issue_attention_values<kHeadDim>(probability, s.stage(value.stage), o);
    turns.pass(false);
    const uint32_t pending_value_stage = value.stage;
    next_block(value);
    ptx::wgmma_wait_group<1>();
    ptx::fence_registers(score);
    release_stage(s, key.stage);
    next_block(key);
    const float2 correction = softmax(score, kb);
    ok &= wait_barrier(p, &s.full[value.stage], value.phase, site);
    if (kb + 1 < kv_blocks) ok &= wait_barrier(p, &s.full[key.stage], key.phase, site);
    ptx::wgmma_wait_group<0>();
    fence_value_operands<kHeadDim>(o, probability);
    ptx::fence_registers(score);  // P_j is packed only now: until the wait P_{j-1} is read, and both would be live
    release_stage(s, pending_value_stage);
    rescale_output<kHeadDim>(o, correction);
    pack_probabilities(score, probability);
  }

  fence_value_operands<kHeadDim>(o, probability);
  turns.wait();
  ptx::wgmma_fence();
  issue_attention_values<kHeadDim>(probability, s.stage(value.stage), o);
  turns.pass(true);
  ptx::wgmma_wait_group<0>();
  ptx::fence_registers(o);
  release_stage(s, value.stage);
  state = key;  // position 2 kv_blocks: the next instruction's first stage
  return ok;
}

template <int kHeadDim>
__device__ __forceinline__ bool consume_attention_head_dim(const MegakernelParams& p, const SharedState& s,
                                                           const Instruction& in, PipelineState& state,
                                                           OutputState& output, Site site, int warpgroup,
                                                           int thread_in_wg, uint64_t* trace) {
  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share; summed over the quad at the end
  const bool ok =
      attention_mainloop<kHeadDim>(p, s, in, state, output, site, warpgroup, thread_in_wg, o, row_sum, trace);
  if (trace) trace[kTraceMathDone] = clock64();

  float inverse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(0xffffffff, row_sum[half], 2);
    inverse[half] = 1.0f / row_sum[half];
  }
  // NOTE: O overwrites this warpgroup's own Q rows, which its last QK^T (complete) was the last to read.
  write_output_tile<kHeadDim / 8>(s.output, false, [&](int i) { return o[i] * inverse[(i / 2) % 2]; }, warpgroup,
                                  thread_in_wg);
  stage_output_tile(s, output, true, thread_in_wg);
  return ok;
}

__device__ __forceinline__ bool consume_attention(const MegakernelParams& p, const SharedState& s,
                                                  const Instruction& in, PipelineState& state, OutputState& output,
                                                  Site site, int warpgroup, int thread_in_wg, uint64_t* trace) {
  if (p.dims.head_dim == 128)
    return consume_attention_head_dim<128>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
  return consume_attention_head_dim<64>(p, s, in, state, output, site, warpgroup, thread_in_wg, trace);
}

// ---- storer ----

__device__ __forceinline__ bool store_attention(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                                OutputState& output, Site site) {
  const AttentionOperands a = attention_operands(p, in);
  if (!store_output_tile(p, s, output, &p.maps[kMapAttnOut], a.boxes, in.col_begin, in.col_end, a.query_begin, a.plane,
                         site))
    return false;
  publish_stored(p, in.signal_counter);
  return true;
}

}  // namespace mk::gpu
