// Buffer kinds (the one table of names, shapes and multiplicities) and the buffer table of one pass.
#include "mk/buffers.h"

#include <fmt/format.h>

#include <algorithm>

#include "mk/kv_cache.h"
#include "mk/limits.h"
#include "mk/tiles.h"

namespace mk {

namespace {

using PK = PassKind;

int64_t one(const ModelConfig&) { return 1; }
int64_t d_model(const ModelConfig& c) { return c.d_model; }
int64_t token_rows(const ModelConfig&, const RunShape& shape) { return shape.tokens(); }
int64_t cache_rows(const ModelConfig&, const RunShape& shape) { return shape.batch * shape.max_context; }
int64_t partial_rows(const ModelConfig& c, const RunShape& shape) {
  return shape.batch * kv_split(c, shape).rows_per_sequence();
}
bool always(const ModelConfig&, PK) { return true; }
bool forward_or_prefill(const ModelConfig&, PK pass) { return pass != PK::kDecode; }
bool with_lm_head(const ModelConfig& c, PK pass) { return c.has_lm_head && pass != PK::kPrefill; }
bool with_cache(const ModelConfig&, PK pass) { return pass != PK::kForward; }
bool decode_only(const ModelConfig&, PK pass) { return pass == PK::kDecode; }
// decode_lm_head normalizes its rows itself
bool forward_with_lm_head(const ModelConfig& c, PK pass) { return c.has_lm_head && pass == PK::kForward; }
bool never_host_written(const ModelConfig&, int32_t) { return false; }
bool host_written(const ModelConfig&, int32_t) { return true; }

constexpr BufferKindInfo kKinds[] = {
    {BufferKind::kTokens, "tokens", Multiplicity::kOne, ElementType::kInt32, one, token_rows,
     [](const ModelConfig& c, PK) { return c.has_embedding; }, host_written},
    // hidden[0] is the input of a model without an embedding
    {BufferKind::kHidden, "hidden", Multiplicity::kPerLayerAndOne, ElementType::kBf16, d_model, token_rows, always,
     [](const ModelConfig& c, int32_t layer) { return layer == 0 && !c.has_embedding; }},
    {BufferKind::kAttnNorm, "attn_norm", Multiplicity::kPerLayer, ElementType::kBf16, d_model, token_rows,
     forward_or_prefill, never_host_written},
    {BufferKind::kQkv, "qkv", Multiplicity::kPerLayer, ElementType::kBf16,
     [](const ModelConfig& c) { return c.qkv_dim(); }, token_rows, forward_or_prefill, never_host_written},
    {BufferKind::kAttn, "attn", Multiplicity::kPerLayer, ElementType::kBf16,
     [](const ModelConfig& c) { return c.q_dim(); }, token_rows, always, never_host_written},
    {BufferKind::kHiddenMid, "hidden_mid", Multiplicity::kPerLayer, ElementType::kBf16, d_model, token_rows, always,
     never_host_written},
    {BufferKind::kMlpNorm, "mlp_norm", Multiplicity::kPerLayer, ElementType::kBf16, d_model, token_rows,
     forward_or_prefill, never_host_written},
    {BufferKind::kAct, "act", Multiplicity::kPerLayer, ElementType::kBf16, [](const ModelConfig& c) { return c.d_ff; },
     token_rows, always, never_host_written},
    {BufferKind::kFinalNorm, "final_norm", Multiplicity::kOne, ElementType::kBf16, d_model, token_rows,
     forward_with_lm_head, never_host_written},
    {BufferKind::kLogits, "logits", Multiplicity::kOne, ElementType::kBf16,
     [](const ModelConfig& c) { return c.vocab_size; }, token_rows, with_lm_head, never_host_written},
    {BufferKind::kKvCache, "kv_cache", Multiplicity::kPerLayer, ElementType::kBf16,
     [](const ModelConfig& c) { return 2 * c.kv_dim(); }, cache_rows, with_cache, never_host_written},
    {BufferKind::kDecodeQ, "q", Multiplicity::kPerLayer, ElementType::kBf16,
     [](const ModelConfig& c) { return c.q_dim(); }, token_rows, decode_only, never_host_written},
    {BufferKind::kAttnPartial, "attn_partial", Multiplicity::kPerLayer, ElementType::kFloat32,
     [](const ModelConfig& c) { return c.n_heads * (c.head_dim + tiles::kDecodePartialStats); }, partial_rows,
     decode_only, never_host_written},
    {BufferKind::kPositions, "positions", Multiplicity::kOne, ElementType::kInt32, one, token_rows, decode_only,
     host_written},
    {BufferKind::kSampled, "sampled", Multiplicity::kOne, ElementType::kInt32, one, token_rows, decode_only,
     never_host_written},
};
static_assert(std::size(kKinds) == size_t(kNumBufferKinds), "one row per buffer kind");
static_assert([] {
  for (size_t k = 0; k < std::size(kKinds); ++k)
    if (size_t(kKinds[k].kind) != k) return false;
  return true;
}(), "rows in the order of BufferKind: buffer_kind_info indexes the table by kind");

int64_t buffers_of(Multiplicity multiplicity, int64_t n_layers) {
  switch (multiplicity) {
    case Multiplicity::kOne: return 1;
    case Multiplicity::kPerLayer: return n_layers;
    case Multiplicity::kPerLayerAndOne: return n_layers + 1;
  }
  return 0;
}

}  // namespace

int64_t element_bytes(ElementType element) { return element == ElementType::kBf16 ? 2 : 4; }

const BufferKindInfo& buffer_kind_info(BufferKind kind) {
  MK_CHECK(size_t(kind) < std::size(kKinds), "internal error: buffer kind {}", int(kind));
  return kKinds[size_t(kind)];
}

std::string Buffer::name() const {
  const char* kind_name = buffer_kind_info(kind).name;
  return layer < 0 ? std::string(kind_name) : fmt::format("{}[{}]", kind_name, layer);
}

BufferTable::BufferTable(const ModelConfig& config, const RunShape& shape) {
  for (const BufferKindInfo& info : kKinds) {
    if (!info.exists(config, shape.pass)) continue;
    const size_t k = size_t(info.kind);
    const int64_t count = buffers_of(info.multiplicity, config.n_layers);
    const int64_t rows = info.rows(config, shape);
    const int64_t cols = info.cols(config);
    // Every offset below the kind's total, so checking the total checks them all.
    const int64_t buffer_elements = checked_mul(rows, cols, fmt::format("elements of a {} buffer", info.name));
    checked_mul(count, buffer_elements, fmt::format("elements of the {} buffers", info.name));
    first_[k] = uint32_t(buffers_.size());
    count_[k] = uint32_t(count);
    for (int64_t i = 0; i < count; ++i) {
      const int32_t layer = info.multiplicity == Multiplicity::kOne ? -1 : int32_t(i);
      buffers_.push_back({info.kind, layer, rows, cols, info.host_written(config, layer), i * buffer_elements});
    }
  }
}

int64_t BufferTable::kind_elements(BufferKind kind) const {
  const size_t k = size_t(kind);
  if (count_[k] == 0) return 0;
  const Buffer& first = buffers_[first_[k]];
  return int64_t(count_[k]) * first.rows * first.cols;  // checked when the table was built
}

double device_bytes(const Buffer& buffer) {
  return double(buffer.rows) * double(buffer.cols) * double(element_bytes(buffer_kind_info(buffer.kind).element));
}

double BufferTable::device_bytes() const {
  double bytes = 0;
  for (const Buffer& buffer : buffers_) bytes += mk::device_bytes(buffer);
  return bytes;
}

}  // namespace mk
