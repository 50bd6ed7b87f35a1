// Activation buffers of one forward pass: the buffer kinds (one table), each buffer's shape, and where it sits in the
// per-kind stacked allocation the engines make.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/model_config.h"

namespace mk {

// Buffers are single-assignment: each layer has its own, and nothing is overwritten within a pass. T is the pass's
// token rows (batch * seq_len; decode: batch); B its batch, C its max context.
enum class BufferKind : uint8_t {
  kTokens,     // (T, 1) int32 token ids, written by the host; only with an embedding
  kHidden,     // hidden[l]: (T, d_model) residual stream entering layer l; hidden[n_layers] leaves the last layer
  kAttnNorm,   // (T, d_model); forward and prefill
  kQkv,        // (T, q_dim + 2 kv_dim): q | k | v, RoPE applied to q and k; forward and prefill
  kAttn,       // (T, q_dim) attention output, heads side by side
  kHiddenMid,  // (T, d_model) residual stream after attention
  kMlpNorm,    // (T, d_model); forward and prefill
  kAct,        // (T, d_ff) silu(gate) * up
  kFinalNorm,  // (T, d_model); a forward pass with an LM head only (decode fuses it into decode_lm_head)
  kLogits,     // (T, vocab_size); only with an LM head; forward and decode
  kKvCache,    // (B C, 2 kv_dim) K | V per layer, kept between passes (include/mk/kv_cache.h); prefill and decode
  kDecodeQ,    // (B, q_dim) decode: q, RoPE applied, heads in pair order (include/mk/kv_cache.h)
  kAttnPartial,  // (B splits blocks_per_split, n_heads (head_dim + 4)) fp32 decode: per KV block and query head the
                 // unnormalized output, then max, sum and 2 of padding (include/mk/kv_cache.h)
  kPositions,  // (B, 1) int32 decode: the position of the token each sequence feeds (its cache row); host-written
  kSampled,    // (B, 1) int32 decode: the next token of each sequence
};
constexpr int kNumBufferKinds = 15;

// How the gpu engine stores a kind (the cpu engines hold every buffer as fp32).
enum class ElementType : uint8_t { kInt32, kBf16, kFloat32 };
int64_t element_bytes(ElementType element);

// How many buffers of a kind one pass has.
enum class Multiplicity : uint8_t {
  kOne,             // outside the layers: layer -1
  kPerLayer,        // layers 0 .. n_layers - 1
  kPerLayerAndOne,  // 0 .. n_layers: the residual stream entering each layer and leaving the last
};

struct BufferKindInfo {
  BufferKind kind;
  const char* name;
  Multiplicity multiplicity;
  ElementType element;
  int64_t (*cols)(const ModelConfig& config);
  int64_t (*rows)(const ModelConfig& config, const RunShape& shape);  // most kinds: the pass's token rows
  bool (*exists)(const ModelConfig& config, PassKind pass);
  bool (*host_written)(const ModelConfig& config, int32_t layer);  // an input of the pass: no task writes it
};
const BufferKindInfo& buffer_kind_info(BufferKind kind);

// A buffer named by kind and layer (-1 outside the layers).
struct BufferRef {
  BufferKind kind;
  int32_t layer = -1;
};

struct Buffer {
  BufferKind kind;
  int32_t layer;  // -1 for buffers outside the layers
  int64_t rows;  // the pass's token rows for most kinds; see BufferKind
  int64_t cols;
  bool host_written;  // written by the host before the launch, not by any task
  // Elements from the start of the kind's allocation, in which the kind's buffers are stacked as (count, rows, cols)
  // in layer order: the gpu engine allocates one block per kind and finds each buffer at this offset.
  int64_t offset_in_kind;
  std::string name() const;  // "qkv[3]", "logits"
};

double device_bytes(const Buffer& buffer);  // as the gpu engine stores it

// A rectangle of a buffer: rows [row_begin, row_end) x cols [col_begin, col_end).
struct Region {
  uint32_t buffer;
  int32_t row_begin;
  int32_t row_end;
  int32_t col_begin;
  int32_t col_end;
  int64_t area() const { return int64_t(row_end - row_begin) * (col_end - col_begin); }
};

// Every buffer of one pass, numbered kind by kind in the order of BufferKind, layer by layer within a kind; only the
// kinds that exist in the pass (shape.pass) and for the model.
class BufferTable {
 public:
  BufferTable(const ModelConfig& config, const RunShape& shape);

  const std::vector<Buffer>& buffers() const { return buffers_; }
  bool has(BufferKind kind) const { return count_[size_t(kind)] > 0; }
  uint32_t id(BufferKind kind, int32_t layer = -1) const {
    const size_t k = size_t(kind);
    const uint32_t index = layer < 0 ? 0 : uint32_t(layer);
    MK_CHECK(index < count_[k], "internal error: the pass has no buffer {}[{}]", buffer_kind_info(kind).name, layer);
    return first_[k] + index;
  }
  uint32_t id(BufferRef ref) const { return id(ref.kind, ref.layer); }
  int64_t kind_elements(BufferKind kind) const;  // of the kind's stacked allocation; 0 when absent
  double device_bytes() const;                   // every buffer, as the gpu engine stores it

 private:
  std::vector<Buffer> buffers_;
  std::array<uint32_t, kNumBufferKinds> first_{};  // id of each kind's first buffer
  std::array<uint32_t, kNumBufferKinds> count_{};  // buffers of each kind
};

}  // namespace mk
