// The KV cache's split-KV layout, the decode GEMM tile width and the cache's size.
#include "mk/kv_cache.h"

#include <algorithm>

#include "mk/check.h"
#include "mk/tiles.h"

namespace mk {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

KvSplit kv_split(const ModelConfig& config, const RunShape& shape) {
  KvSplit split;
  split.blocks = ceil_div(shape.max_context, tiles::kDecodeKvBlock);
  const int64_t pairs = std::max<int64_t>(1, shape.batch * config.n_kv_heads);  // (sequence, kv head)
  split.splits = std::clamp<int64_t>(shape.decode_spread / pairs, 1, std::max<int64_t>(1, split.blocks));
  split.blocks_per_split = ceil_div(split.blocks, split.splits);
  return split;
}

int32_t decode_block_n(int64_t n, int64_t spread) {
  for (int32_t width = tiles::kDecodeMinBlockN; width < tiles::kDecodeMaxBlockN; width *= 2)
    if (ceil_div(n, width) <= spread) return width;
  return tiles::kDecodeMaxBlockN;
}

void check_pass_shape(const ModelConfig& c, const RunShape& shape) {
  shape.validate();  // bounds every factor below, so their products cannot overflow
  // Here, not only where the engines run: `mk info` gave the figures of a pass that nothing would run.
  MK_CHECK(c.rope.type == RopeType::kNone || shape.seq_len <= c.max_position_embeddings,
           "sequence length {} exceeds the model's max_position_embeddings {}", shape.seq_len,
           c.max_position_embeddings);
  if (shape.pass == PassKind::kForward) return;
  MK_CHECK(c.has_embedding && c.has_lm_head, "model '{}' has no {}: generating needs token ids in and logits out",
           c.name, c.has_embedding ? "LM head" : "embedding");
  MK_CHECK(shape.max_context > 0, "the KV cache needs a positive max context, got {}", shape.max_context);
  MK_CHECK(c.rope.type == RopeType::kNone || shape.max_context <= c.max_position_embeddings,
           "max context {} exceeds the model's max_position_embeddings {}", shape.max_context,
           c.max_position_embeddings);
  MK_CHECK(shape.batch * shape.max_context < (int64_t(1) << 30),
           "a KV cache of batch {} x max context {} has more than the 2^30 rows one schedule addresses", shape.batch,
           shape.max_context);
  if (shape.pass == PassKind::kPrefill) {
    MK_CHECK(shape.seq_len <= shape.max_context, "a prefill of {} tokens per sequence does not fit a KV cache of {}",
             shape.seq_len, shape.max_context);
  } else {
    MK_CHECK(shape.seq_len == 1, "a decode step feeds one token per sequence, not {}", shape.seq_len);
  }
}

double kv_cache_bytes(const ModelConfig& config, int64_t batch, int64_t max_context, int64_t element_bytes) {
  return double(config.n_layers) * double(batch) * double(max_context) * 2.0 * double(config.kv_dim()) *
         double(element_bytes);
}

}  // namespace mk
