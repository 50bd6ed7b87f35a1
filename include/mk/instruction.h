// The one instruction format, shared by the host (graph, scheduler, verifier, cpu-vm) and the GPU megakernel.
// Plain C++ with no includes beyond <cstdint>, so nvcc and the host compiler read the same definition.
#pragma once

#include <cstdint>

namespace mk {

// One opcode per op of the forward pass; each has one host descriptor (include/mk/ops.h) and one device handler
// (src/cuda/device/ops/). Buffers are implied by (opcode, layer).
enum class Opcode : uint8_t {
  kNop = 0,
  kEmbed,         // hidden[0][rows] <- embedding[tokens[rows]]
  kAttnNorm,      // attn_norm[l][rows] <- rmsnorm(hidden[l][rows])
  kQkv,           // qkv[l][rows, cols] <- attn_norm[l][rows] @ [wq; wk; wv][cols]^T, RoPE on q and k columns
  kAttention,     // attn[l][rows, head cols] <- causal softmax(q k^T / sqrt(d)) v for one sequence, query block, head
  kOProj,         // hidden_mid[l][rows, cols] <- hidden[l] + attn[l][rows] @ wo[cols]^T
  kMlpNorm,       // mlp_norm[l][rows] <- rmsnorm(hidden_mid[l][rows])
  kGateUp,        // act[l][rows, cols] <- silu(mlp_norm[l] @ w_gate^T) * (mlp_norm[l] @ w_up^T)
  kDown,          // hidden[l+1][rows, cols] <- hidden_mid[l] + act[l][rows] @ w_down[cols]^T
  kFinalNorm,     // final_norm[rows] <- rmsnorm(hidden[L][rows])
  kLmHead,        // logits[rows, cols] <- final_norm[rows] @ lm_head[cols]^T
  // Prefill and decode (include/mk/kv_cache.h). Decode rows are batch rows (one token per sequence) unless noted.
  kKvAppend,        // prefill: kv_cache[l][rows] <- the k and v columns of qkv[l] (K into pair order); rows are cache
                    // rows b C + [s0, s1) of one sequence b
  kDecodeQ,         // q[l][rows, cols] <- rmsnorm(hidden[l]) @ wq[cols]^T, RoPE at positions[rows]; pair order
  kDecodeKv,        // kv_cache[l][b C + positions[b], cols] <- rmsnorm(hidden[l][b]) @ [wk; wv][cols]^T, RoPE on K;
                    // rows are cache rows [b0 C, b1 C): batch rows b0..b1, of which it writes one row each
  kDecodeAttention,  // attn_partial[l][rows, cols] <- for sequence `sequence` and kv head `head`, one partial per
                     // KV block of the split the rows are (its query heads' unnormalized output, max and sum)
  kDecodeCombine,   // attn[l][rows, cols] <- the partials of sequences rows, query heads cols, combined in block order
  kDecodeOProj,     // hidden_mid[l][rows, cols] <- hidden[l] + attn[l][rows] @ wo[cols]^T
  kDecodeGateUp,    // act[l][rows, cols] <- silu(rmsnorm(hidden_mid[l]) @ w_gate^T) * (rmsnorm(hidden_mid[l]) @ w_up^T)
  kDecodeDown,      // hidden[l+1][rows, cols] <- hidden_mid[l] + act[l][rows] @ w_down[cols]^T
  kDecodeLmHead,    // logits[rows, cols] <- rmsnorm(hidden[L][rows]) @ lm_head[cols]^T (the final norm fused)
  kSample,          // sampled[rows] <- argmax, or a sample under temperature, top-k and top-p, of logits[rows]
  kDecodeOProjCombine,  // hidden_mid[l][rows, cols] <- hidden[l] + combine(attn_partial[l])[rows] @ wo[cols]^T
  kNumOpcodes,
};

// Instruction::layer of ops before or after the layers (embedding, final norm, LM head).
constexpr uint16_t kNoLayer = 0xFFFF;

// Instruction::flags of decode combines linked to their attention tasks (link_decode_combines, include/mk/schedule.h).
// On the GPU the last of a combine's attention tasks to finish runs the combine and signals its counter, and the SM
// that lists the combine skips it: the combine's hop to another SM is gone from every layer's chain. The CPU engines
// run it where it is listed, after the same writes, for the same bits.
constexpr uint8_t kCombineRunByLastAttention = 1;  // on a kDecodeCombine
constexpr uint8_t kAttentionRunsCombine = 2;       // on a kDecodeAttention: combine_instruction names its combine

// A wait: proceed once counters[counter] >= epoch * target. Counters only ever grow, so nothing is reset between
// launches; the epoch (1, 2, ...) is a launch argument.
struct Wait {
  uint32_t counter;
  uint32_t target;  // signals per launch that complete the counter
};

// One tile task as an SM executes it: rows and columns of the op's output buffer (token rows of the
// (batch * seq_len) token matrix for most ops). For kAttention, rows are the query rows and cols the head's output
// columns; for kDecodeAttention, rows are partial rows of one sequence, and `head` is a kv head.
struct Instruction {
  Opcode opcode;
  uint8_t flags;  // kCombineRunByLastAttention, kAttentionRunsCombine; 0 otherwise
  uint16_t layer;
  uint32_t task;            // index of the task in the graph: names it in errors and traces
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int32_t sequence;         // kAttention, kDecodeAttention: which sequence of the batch
  int32_t head;             // kAttention: which query head; kDecodeAttention: which kv head
  uint32_t signal_counter;  // incremented once when the task's output is published
  uint32_t wait_begin;      // the task's waits are waits[wait_begin, wait_begin + num_waits)
  uint32_t num_waits;
  uint32_t combine_instruction;  // kAttentionRunsCombine: its combine's index in this instruction array
  uint32_t combine_counter;      // kAttentionRunsCombine: the counter that combine signals
  uint32_t reserved1[3];
};
static_assert(sizeof(Instruction) == 64, "instructions are 64 bytes: one fetch of two 32-byte sectors");

}  // namespace mk
