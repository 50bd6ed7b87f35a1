// Model weights in bf16 on the host: Hugging Face Llama names, loading from safetensors, seeded random init, saving.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "mk/bf16.h"
#include "mk/model_config.h"
#include "mk/parallel.h"

namespace mk {

// Weight matrices are row-major (out_features, in_features), exactly as nn.Linear stores them.
struct LayerWeights {
  std::vector<bf16> attn_norm;  // (d_model)
  std::vector<bf16> wq;         // (n_heads * head_dim, d_model)
  std::vector<bf16> wk;         // (n_kv_heads * head_dim, d_model)
  std::vector<bf16> wv;         // (n_kv_heads * head_dim, d_model)
  std::vector<bf16> wo;         // (d_model, n_heads * head_dim)
  std::vector<bf16> mlp_norm;   // (d_model)
  std::vector<bf16> w_gate;     // (d_ff, d_model)
  std::vector<bf16> w_up;       // (d_ff, d_model)
  std::vector<bf16> w_down;     // (d_model, d_ff)
};

struct ModelWeights {
  ModelConfig config;
  std::vector<bf16> embedding;   // (vocab_size, d_model), empty without an embedding
  std::vector<LayerWeights> layers;
  std::vector<bf16> final_norm;  // (d_model), empty without an LM head
  std::vector<bf16> lm_head;     // (vocab_size, d_model), empty without an LM head or when tied (as loaded)
  // load_weights: tensors of the files that the config leaves unused (layers beyond num_hidden_layers, an lm_head
  // beside tied embeddings), sorted. Transformers loads such a checkpoint with a warning; so does mk.
  std::vector<std::string> unused_tensors;

  // A tied model's LM head is its embedding, unless it holds a matrix of its own: fold_norm_weights' copy, the final
  // norm folded in, for the model of the same config (the cpu-vm checks a schedule's config against the weights').
  const std::vector<bf16>& lm_head_matrix() const {
    return config.tie_word_embeddings && lm_head.empty() ? embedding : lm_head;
  }
};

// Calls `visit` for every tensor the model owns, with its Hugging Face name and shape. The single place that
// knows the name mapping: loading, saving and random initialization all go through it.
using WeightVisitor =
    std::function<void(const std::string& name, const std::vector<int64_t>& shape, std::vector<bf16>& data)>;
void for_each_weight(ModelWeights& weights, const WeightVisitor& visit);

// Parameters of the model: the elements of every tensor for_each_weight visits.
int64_t parameter_count(const ModelConfig& config);

// Matrices ~ uniform with std 0.02 (as Hugging Face initializes Llama), norm weights ~ uniform [0.5, 1.5] so that a
// forgotten norm weight shows. Deterministic for a given seed on every platform and any max_threads (tests vary it).
ModelWeights random_weights(const ModelConfig& config, uint64_t seed, int max_threads = hardware_threads());

// FlashNorm's fold (arXiv 2407.09577): `matrix` (rows, k) with each column scaled by the weight (k) of the RMSNorm
// whose output it multiplies, rounded to bf16, since (x / rms * g) W^T = (x / rms) (W diag(g))^T.
std::vector<bf16> fold_norm_weight(const std::vector<bf16>& matrix, const std::vector<bf16>& norm_weight);
// The layer as the gpu engine holds it: attn_norm's weight folded into wq, wk and wv, mlp_norm's into w_gate and w_up,
// both norm weights ones.
LayerWeights fold_norm_weights(LayerWeights layer);
// The model as the gpu engine holds it: each layer's norms folded (above), final_norm's weight into the LM head (a
// matrix of its own where tied, the config unchanged, so for_each_weight does not visit it), the norm weights ones.
// The same function up to one bf16 rounding a weight: the reference's norm rounds x / rms * g instead. A copy of the
// whole model: for checks on small models.
ModelWeights fold_norm_weights(const ModelWeights& weights);
// final_norm's weight folded into the LM head (a matrix of its own where the embedding is tied).
std::vector<bf16> folded_lm_head(const ModelWeights& weights);
// Bytes the gpu engine holds beyond the model's own: a tied LM head's folded copy (folded_lm_head).
double folded_lm_head_copy_bytes(const ModelConfig& config);

// Loads `dir`/model.safetensors, or the shards listed in `dir`/model.safetensors.index.json.
ModelWeights load_weights(const std::filesystem::path& dir, const ModelConfig& config);
// The warning (without a "warning:" prefix) naming load_weights' unused tensors, the first few; "" when all are used.
std::string unused_tensors_warning(const std::filesystem::path& dir, const ModelWeights& weights);
// The files load_weights reads (the index included): what no output may overwrite.
std::vector<std::filesystem::path> weight_files(const std::filesystem::path& dir);
// Every file of a model directory that mk reads or may read (configs, tokenizer files, then weight_files): what no
// output of mk or of the Python package may overwrite.
std::vector<std::filesystem::path> model_dir_files(const std::filesystem::path& dir);

// Writes config.json and model.safetensors, loadable by transformers' LlamaForCausalLM.from_pretrained.
void save_hf_model(const std::filesystem::path& dir, const ModelWeights& weights);
// The same where Hugging Face can describe the model; else mk_config.json (mk's own config form, e.g. the seed's
// model without embedding or RoPE) beside model.safetensors. Returns the config file's name.
std::string save_model(const std::filesystem::path& dir, const ModelWeights& weights);

}  // namespace mk
