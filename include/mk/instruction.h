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
  kNumOpcodes,
};

// Instruction::layer of ops before or after the layers (embedding, final norm, LM head).
constexpr uint16_t kNoLayer = 0xFFFF;

// A wait: proceed once counters[counter] >= epoch * target. Counters only ever grow, so nothing is reset between
// launches; the epoch (1, 2, ...) is a launch argument.
struct Wait {
  uint32_t counter;
  uint32_t target;  // signals per launch that complete the counter
};

// One tile task as an SM executes it. Rows are token rows of the (batch * seq_len) token matrix; columns are
// columns of the op's output buffer. For kAttention, rows are the query rows and cols the head's output columns.
struct Instruction {
  Opcode opcode;
  uint8_t reserved0;
  uint16_t layer;
  uint32_t task;            // index of the task in the graph: names it in errors and traces
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int32_t sequence;         // kAttention: which sequence of the batch
  int32_t head;             // kAttention: which query head
  uint32_t signal_counter;  // incremented once when the task's output is published
  uint32_t wait_begin;      // the task's waits are waits[wait_begin, wait_begin + num_waits)
  uint32_t num_waits;
  uint32_t reserved1[5];
};
static_assert(sizeof(Instruction) == 64, "instructions are 64 bytes: one fetch of two 32-byte sectors");

}  // namespace mk
