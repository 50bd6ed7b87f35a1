// The model on the device: weight packing and upload, activations per buffer kind, tensor maps.
#include "model_on_device.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <cmath>
#include <cstring>

#include "device/config.cuh"
#include "mk/check.h"
#include "mk/kv_cache.h"

namespace mk::gpu {

namespace {

// bf16 bits of host vectors, as the device stores them, appended to `out`.
void append(std::vector<uint16_t>& out, const std::vector<bf16>& values) {
  const size_t at = out.size();
  out.resize(at + values.size());
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(uint16_t));
}

std::vector<uint16_t> bits_of(const std::vector<bf16>& values) {
  std::vector<uint16_t> bits;
  append(bits, values);
  return bits;
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult result{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &result),
               "looking up cuTensorMapEncodeTiled");
    MK_CHECK(result == cudaDriverEntryPointSuccess && function != nullptr,
             "the CUDA driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A bf16 tensor (planes, rows, cols), in boxes of (box_rows, 64) with the 128-byte swizzle; out-of-range elements
// read as zeros and are not written.
CUtensorMap make_tensor_map(const void* base, uint64_t planes, uint64_t rows, uint64_t cols, uint32_t box_rows,
                            const char* what) {
  MK_CHECK(cols % 8 == 0, "tensor map {}: {} columns; TMA needs rows of a multiple of 16 bytes", what, cols);
  CUtensorMap map;
  const cuuint64_t dims[3] = {cols, rows, planes};
  const cuuint64_t strides[2] = {cols * 2, rows * cols * 2};
  const cuuint32_t box[3] = {uint32_t(KernelConfig::kBoxCols), box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MK_CHECK(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed for {} (error {})", what, int(result));
  return map;
}

// gate_up tile t reads weight rows [256 t, 256 t + 256): gate rows [128 t, 128 t + 128), then the same up rows, so
// that one tile's epilogue holds silu(gate) and up of the same columns.
void append_gate_up(std::vector<uint16_t>& out, const ModelConfig& c, const LayerWeights& w) {
  const int64_t tiles = (c.d_ff + KernelConfig::kBlockN - 1) / KernelConfig::kBlockN;
  for (int64_t t = 0; t < tiles; ++t) {
    for (const std::vector<bf16>* matrix : {&w.w_gate, &w.w_up}) {
      const size_t at = out.size();
      out.resize(at + size_t(KernelConfig::kBlockN * c.d_model), 0);
      const int64_t rows = std::min<int64_t>(KernelConfig::kBlockN, c.d_ff - t * KernelConfig::kBlockN);
      std::memcpy(out.data() + at, matrix->data() + t * KernelConfig::kBlockN * c.d_model, size_t(rows * c.d_model) * 2);
    }
  }
}

// Uploads the weights and the RoPE table (rope_positions rows) into params' weight pointers: those of
// fold_norm_weights(weights), the norm weights folded into the matrices after them, a layer at a time. On the
// device every norm then scales by 1 / rms alone (its weight ones), and the wgmma decode GEMMs, which fuse the norm,
// only sum the rows' squares (decode_gemm_wgmma.cuh).
void upload_weights(DeviceArena& arena, const ModelConfig& c, const ModelWeights& weights, int64_t rope_positions,
                    MegakernelParams& p) {
  std::vector<uint16_t> wqkv, wo, w_gate_up, w_down, attn_norm_w, mlp_norm_w;
  for (const LayerWeights& loaded : weights.layers) {
    const LayerWeights w = fold_norm_weights(loaded);
    append(wqkv, w.wq);
    append(wqkv, w.wk);
    append(wqkv, w.wv);
    append(wo, w.wo);
    append(w_down, w.w_down);
    append(attn_norm_w, w.attn_norm);
    append(mlp_norm_w, w.mlp_norm);
    append_gate_up(w_gate_up, c, w);
  }
  auto bf16_upload = [&](const std::vector<uint16_t>& bits, const char* what) {
    return reinterpret_cast<const __nv_bfloat16*>(arena.upload(bits, what));
  };
  p.dims.gate_up_rows = int32_t(int64_t(w_gate_up.size()) / std::max<int64_t>(1, c.n_layers * c.d_model));
  p.weights.wqkv = bf16_upload(wqkv, "uploading wq/wk/wv");
  p.weights.wo = bf16_upload(wo, "uploading wo");
  p.weights.w_gate_up = bf16_upload(w_gate_up, "uploading w_gate/w_up");
  p.weights.w_down = bf16_upload(w_down, "uploading w_down");
  p.weights.attn_norm_weight = bf16_upload(attn_norm_w, "uploading norm weights");
  p.weights.mlp_norm_weight = bf16_upload(mlp_norm_w, "uploading norm weights");
  if (c.has_embedding) p.weights.embedding = bf16_upload(bits_of(weights.embedding), "uploading the embedding");
  if (c.has_lm_head) {
    // With tied embeddings the LM head is a matrix of its own here (the final norm folded in), the embedding's size.
    p.weights.final_norm_weight = bf16_upload(std::vector<uint16_t>(size_t(c.d_model), to_bf16(1.0f).bits),
                                              "uploading the final norm");
    p.weights.lm_head = reinterpret_cast<const __nv_bfloat16*>(
        arena.upload(folded_lm_head(weights), "uploading the LM head"));
  }
  if (c.rope.type != RopeType::kNone) {
    const ref::RopeTable rope = ref::make_rope_table(c, rope_positions);
    p.weights.rope_cos = arena.upload(rope.cos, "uploading RoPE tables");
    p.weights.rope_sin = arena.upload(rope.sin, "uploading RoPE tables");
  }
}

// One allocation per buffer kind, its buffers stacked as (count, rows, cols) the way the buffer table numbers them;
// bf16 kinds poisoned with NaN (0xffff) so that a read before a write shows. The KV cache is the caller's when it
// gives one (kept between passes). Returns each buffer's address.
std::vector<void*> allocate_activations(DeviceArena& arena, const BufferTable& table, void* kv_cache,
                                        std::array<void*, kNumBufferKinds>& base) {
  base.fill(nullptr);
  for (int k = 0; k < kNumBufferKinds; ++k) {
    const BufferKind kind = BufferKind(k);
    if (!table.has(kind)) continue;
    if (kind == BufferKind::kKvCache && kv_cache != nullptr) {
      base[size_t(k)] = kv_cache;
      continue;
    }
    const BufferKindInfo& info = buffer_kind_info(kind);
    const size_t element_bytes = size_t(mk::element_bytes(info.element));
    const size_t bytes = size_t(table.kind_elements(kind)) * element_bytes;
    base[size_t(k)] = arena.allocate_bytes(bytes, info.name);
    if (info.element == ElementType::kBf16) check_cuda(cudaMemset(base[size_t(k)], 0xff, bytes), info.name);
  }
  std::vector<void*> address;
  for (const Buffer& buffer : table.buffers()) {
    const size_t element_bytes = size_t(mk::element_bytes(buffer_kind_info(buffer.kind).element));
    address.push_back(static_cast<uint8_t*>(base[size_t(buffer.kind)]) + size_t(buffer.offset_in_kind) * element_bytes);
  }
  return address;
}

// NOTE: decode passes have no TMA ops (their GEMMs are M = batch weight streams with plain loads): no maps.
void make_tensor_maps(const Graph& graph, MegakernelParams& p) {
  const ModelConfig& c = graph.config();
  if (graph.shape().pass == PassKind::kDecode) return;
  const int64_t T = graph.shape().tokens(), L = c.n_layers, D = c.d_model;
  const uint32_t rows_m = KernelConfig::kBlockM, rows_n = KernelConfig::kBlockN;
  p.maps[kMapAttnNorm] = make_tensor_map(p.attn_norm, L, T, D, rows_m, "attn_norm");
  p.maps[kMapAttn] = make_tensor_map(p.attn, L, T, c.q_dim(), rows_m, "attn");
  p.maps[kMapMlpNorm] = make_tensor_map(p.mlp_norm, L, T, D, rows_m, "mlp_norm");
  p.maps[kMapAct] = make_tensor_map(p.act, L, T, c.d_ff, rows_m, "act");
  p.maps[kMapWqkv] = make_tensor_map(p.weights.wqkv, L, c.qkv_dim(), D, rows_n, "wqkv");
  p.maps[kMapWo] = make_tensor_map(p.weights.wo, L, D, c.q_dim(), rows_n, "wo");
  p.maps[kMapWgateUp] = make_tensor_map(p.weights.w_gate_up, L, p.dims.gate_up_rows, D, 2 * rows_n, "w_gate_up");
  p.maps[kMapWdown] = make_tensor_map(p.weights.w_down, L, D, c.d_ff, rows_n, "w_down");
  p.maps[kMapQkv] = make_tensor_map(p.qkv, L, T, c.qkv_dim(), rows_m, "qkv");
  p.maps[kMapHidden] = make_tensor_map(p.hidden, L + 1, T, D, rows_m, "hidden");
  p.maps[kMapHiddenMid] = make_tensor_map(p.hidden_mid, L, T, D, rows_m, "hidden_mid");
  if (graph.buffer_table().has(BufferKind::kLogits)) {  // prefill stops before the LM head
    p.maps[kMapFinalNorm] = make_tensor_map(p.final_norm, 1, T, D, rows_m, "final_norm");
    p.maps[kMapLmHead] = make_tensor_map(p.weights.lm_head, 1, c.vocab_size, D, rows_n, "lm_head");
    p.maps[kMapLogits] = make_tensor_map(p.logits, 1, T, c.vocab_size, rows_m, "logits");
  }
  // Attention addresses each sequence as its own plane, so that boxes past its end read zeros and store nothing.
  const int64_t planes = L * graph.shape().batch, S = graph.shape().seq_len;
  p.maps[kMapQuery] = make_tensor_map(p.qkv, planes, S, c.qkv_dim(), KernelConfig::kBlockQ, "queries");
  p.maps[kMapKeyValue] = make_tensor_map(p.qkv, planes, S, c.qkv_dim(), KernelConfig::kBlockKv, "keys and values");
  p.maps[kMapAttnOut] = make_tensor_map(p.attn, planes, S, c.q_dim(), KernelConfig::kBlockQ, "attention output");
}

}  // namespace

std::vector<void*> upload_model(DeviceArena& arena, const Graph& graph, const ModelWeights& weights, void* kv_cache,
                                const MegakernelParams* shared_weights, MegakernelParams& p) {
  const ModelConfig& c = graph.config();
  const RunShape& shape = graph.shape();
  p.dims = {int32_t(shape.tokens()), int32_t(shape.batch), int32_t(shape.seq_len), int32_t(c.d_model),
            int32_t(c.q_dim()), int32_t(c.kv_dim()), int32_t(c.qkv_dim()), int32_t(c.d_ff), int32_t(c.vocab_size),
            int32_t(c.head_dim), int32_t(c.group_size()), int32_t(c.n_layers), c.rope.type != RopeType::kNone ? 1 : 0,
            c.rms_norm_eps, float(1.4426950408889634 / std::sqrt(double(c.head_dim))), 0, 0, 0, 0, 0, 0};
  if (shape.pass != PassKind::kForward) {
    const KvSplit split = kv_split(c, shape);
    p.dims.max_context = int32_t(shape.max_context);
    p.dims.kv_blocks = int32_t(split.blocks);
    p.dims.kv_splits = int32_t(split.splits);
    p.dims.kv_blocks_per_split = int32_t(split.blocks_per_split);
    p.dims.decode = shape.pass == PassKind::kDecode ? 1 : 0;
  }
  if (shared_weights != nullptr) {
    p.weights = shared_weights->weights;
    p.dims.gate_up_rows = shared_weights->dims.gate_up_rows;  // how w_gate_up is packed
  } else {
    // Decode rotates at any cache position; forward and prefill at positions below seq_len.
    upload_weights(arena, c, weights, std::max(shape.seq_len, shape.max_context), p);
  }

  std::array<void*, kNumBufferKinds> base{};
  std::vector<void*> address = allocate_activations(arena, graph.buffer_table(), kv_cache, base);
  auto bf16_base = [&](BufferKind kind) { return static_cast<__nv_bfloat16*>(base[size_t(kind)]); };
  p.hidden = bf16_base(BufferKind::kHidden);
  p.attn_norm = bf16_base(BufferKind::kAttnNorm);
  p.qkv = bf16_base(BufferKind::kQkv);
  p.attn = bf16_base(BufferKind::kAttn);
  p.hidden_mid = bf16_base(BufferKind::kHiddenMid);
  p.mlp_norm = bf16_base(BufferKind::kMlpNorm);
  p.act = bf16_base(BufferKind::kAct);
  p.final_norm = bf16_base(BufferKind::kFinalNorm);
  p.logits = bf16_base(BufferKind::kLogits);
  p.tokens = static_cast<const int32_t*>(base[size_t(BufferKind::kTokens)]);
  p.kv_cache = bf16_base(BufferKind::kKvCache);
  p.decode_q = bf16_base(BufferKind::kDecodeQ);
  p.attn_partial = static_cast<float*>(base[size_t(BufferKind::kAttnPartial)]);
  p.positions = static_cast<const int32_t*>(base[size_t(BufferKind::kPositions)]);
  p.sampled = static_cast<int32_t*>(base[size_t(BufferKind::kSampled)]);

  make_tensor_maps(graph, p);
  return address;
}

}  // namespace mk::gpu
