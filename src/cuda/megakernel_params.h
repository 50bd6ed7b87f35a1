// What the host hands the megakernel: tensor maps, model dimensions, device buffers, the schedule and the error slot.
// Shared by runtime.cu (fills it) and megakernel.cu (reads it as a __grid_constant__ parameter).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "mk/instruction.h"

namespace mk::gpu {

// Tensor maps, all with boxes of 64 bf16 columns and the 128-byte swizzle; per-layer tensors are stacked as
// (layers, rows, cols) so a map serves every layer and out-of-range rows read as zeros and are not written.
enum TensorMapId : int {
  kMapAttnNorm,   // A of qkv:              attn_norm (n_layers, T, d_model)
  kMapAttn,       // A of o_proj:           attn (n_layers, T, q_dim)
  kMapMlpNorm,    // A of gate_up:          mlp_norm (n_layers, T, d_model)
  kMapAct,        // A of down, out of gate_up: act (n_layers, T, d_ff)
  kMapFinalNorm,  // A of lm_head:          final_norm (1, T, d_model)
  kMapWqkv,       // B of qkv:              [wq; wk; wv] (n_layers, qkv_dim, d_model)
  kMapWo,         // B of o_proj:           wo (n_layers, d_model, q_dim)
  kMapWgateUp,    // B of gate_up:          gate and up rows interleaved per tile (n_layers, 2 * d_ff padded, d_model)
  kMapWdown,      // B of down:             w_down (n_layers, d_model, d_ff)
  kMapLmHead,     // B of lm_head:          lm_head, final_norm's weight folded in (1, vocab_size, d_model)
  kMapQkv,        // out of qkv:            qkv (n_layers, T, qkv_dim)
  kMapHidden,     // out of down, residual of o_proj: hidden (n_layers + 1, T, d_model)
  kMapHiddenMid,  // out of o_proj, residual of down: hidden_mid (n_layers, T, d_model)
  kMapLogits,     // out of lm_head:        logits (1, T, vocab_size)
  kMapQuery,      // attention Q:   qkv viewed as (n_layers * batch, seq_len, qkv_dim), boxes of kBlockQ rows
  kMapKeyValue,   // attention K/V: the same tensor, boxes of kBlockKv rows
  kMapAttnOut,    // out of attention: attn viewed as (n_layers * batch, seq_len, q_dim)
  kNumMaps,
};

enum ErrorKind : uint32_t {
  kErrorNone = 0,
  kErrorCounterStall = 1,   // a counter wait ran past the timeout
  kErrorPipelineStall = 2,  // a shared-memory pipeline barrier ran past the timeout
  kErrorBadInstruction = 3,
};

// Written once by the first thread that hits an error; `abort` tells every CTA to leave.
struct DeviceError {
  uint32_t abort;
  uint32_t kind;
  uint32_t sm;
  uint32_t instruction;  // index in the SM's list
  uint32_t task;
  uint32_t counter;
  uint32_t value;
  uint32_t target;
};

enum TraceSlot : int {
  kTraceStart,               // consumers fetched the instruction
  kTraceWaitsDone,           // its counters were reached (row-wise ops; the producer waits for the others' report)
  kTraceDataReady,           // GEMM, attention: the first stage of operands had landed
  kTraceMathDone,            // main loop finished (before the epilogue)
  kTraceEnd,                 // output published (GEMM, attention: staged for the storer)
  kTraceProducerStart,
  kTraceProducerWaitsDone,
  kTraceProducerLoadsIssued,
  kTracePublished,           // GEMM, attention: the storer's TMA store landed and the counter was released
  kTraceTileFree,            // GEMM: its epilogue found the output tile free (and a residual loaded into it)
  kTraceRanOnSm,             // a linked decode combine: 1 + the SM that ran it (its last attention task's), whose clock
                             // its stamps are in
  kTraceSlots = 11,
};

struct ModelDims {
  int32_t tokens;      // T = batch * seq_len
  int32_t batch;
  int32_t seq_len;
  int32_t d_model;
  int32_t q_dim;
  int32_t kv_dim;
  int32_t qkv_dim;
  int32_t d_ff;
  int32_t vocab_size;
  int32_t head_dim;
  int32_t group_size;  // query heads per kv head
  int32_t n_layers;
  int32_t rope;        // 0: no RoPE
  float rms_norm_eps;
  float softmax_scale_log2;  // log2(e) / sqrt(head_dim)
  // prefill and decode (include/mk/kv_cache.h); 0 in forward passes
  int32_t max_context;         // C: cache rows per sequence
  int32_t kv_blocks;           // split-KV blocks per sequence
  int32_t kv_splits;           // attention tasks per (sequence, kv head)
  int32_t kv_blocks_per_split;
  int32_t gate_up_rows;        // rows of one layer's packed gate/up weights (see w_gate_up)
  int32_t decode;              // 1 in decode passes: no TMA ops, weights streamed with plain loads
};

// The model's weights on the device as plain pointers (the GEMMs also reach them through the tensor maps): each norm's
// weight folded into the matrices after it (fold_norm_weights), the norm weights all ones.
struct DeviceWeights {
  // read outside the GEMMs
  const __nv_bfloat16* embedding;          // (vocab_size, d_model)
  const __nv_bfloat16* attn_norm_weight;   // (n_layers, d_model)
  const __nv_bfloat16* mlp_norm_weight;    // (n_layers, d_model)
  const __nv_bfloat16* final_norm_weight;  // (d_model)
  const float* rope_cos;                   // (max(seq_len, max_context), head_dim / 2)
  const float* rope_sin;                   // (max(seq_len, max_context), head_dim / 2)
  // the GEMM weights again as plain pointers, for the decode GEMMs' plain loads (the same memory as the tensor maps)
  const __nv_bfloat16* wqkv;       // (n_layers, qkv_dim, d_model)
  const __nv_bfloat16* wo;         // (n_layers, d_model, q_dim)
  const __nv_bfloat16* w_gate_up;  // (n_layers, gate_up_rows, d_model): per 128 columns, 128 gate rows then 128 up
  const __nv_bfloat16* w_down;     // (n_layers, d_model, d_ff)
  const __nv_bfloat16* lm_head;    // (vocab_size, d_model), a matrix of its own where the embedding is tied
};

struct MegakernelParams {
  CUtensorMap maps[kNumMaps];
  ModelDims dims;

  const Instruction* instructions;  // every SM's list, back to back
  const uint32_t* sm_begin;         // (num_sms + 1)
  const Wait* waits;
  uint32_t* counters;               // (num_counters), monotonic across launches
  // (n_layers, B, n_kv_heads) after the counters, monotonic as they are and cleared with them: each attention task
  // of a linked combine's group takes one, and the one that takes the launch's last runs the combine.
  uint32_t* combine_tickets;
  uint32_t epoch;                   // 1 for the first launch, then 2, ...
  uint64_t stall_timeout_ns;       // a counter wait's
  // A shared-memory wait's: an eighth longer, so that when a signal is missing the counter wait that lacks it (the
  // cause) reports before the shared-memory waits stuck behind it (the symptoms).
  uint64_t pipeline_stall_timeout_ns;
  // A diagnostic (GpuOptions::skip_dependency_waits): nonzero, every wait on another SM's counter passes at once.
  uint32_t skip_dependency_waits;
  DeviceError* error;

  // Tracing, off when null: clock64 stamps per instruction (kTraceSlots each, see TraceSlot) and per SM
  // (globaltimer and clock64 at the start and the end, to turn clocks into a common time line).
  uint64_t* trace_records;  // (num_instructions, kTraceSlots)
  uint64_t* trace_sms;      // (num_sms, 4)

  // activations, bf16
  __nv_bfloat16* hidden;      // (n_layers + 1, T, d_model)
  __nv_bfloat16* attn_norm;   // (n_layers, T, d_model)
  __nv_bfloat16* qkv;         // (n_layers, T, qkv_dim)
  __nv_bfloat16* attn;        // (n_layers, T, q_dim)
  __nv_bfloat16* hidden_mid;  // (n_layers, T, d_model)
  __nv_bfloat16* mlp_norm;    // (n_layers, T, d_model)
  __nv_bfloat16* act;         // (n_layers, T, d_ff)
  __nv_bfloat16* final_norm;  // (T, d_model)
  __nv_bfloat16* logits;      // (T, vocab_size)
  const int32_t* tokens;      // (T)
  // prefill and decode: the cache, kept between launches; decode's own buffers
  __nv_bfloat16* kv_cache;    // (n_layers, B C, 2 kv_dim): K (pair order) | V
  __nv_bfloat16* decode_q;    // (n_layers, B, q_dim), pair order
  float* attn_partial;        // (n_layers, B kv_splits kv_blocks_per_split, n_heads (head_dim + 4))
  const int32_t* positions;   // (B) the cache row of the token each sequence feeds
  int32_t* sampled;           // (B) the next token of each sequence

  // Every weight the kernel reads through plain pointers, in one struct: engines of one model share it whole.
  DeviceWeights weights;
};

}  // namespace mk::gpu
