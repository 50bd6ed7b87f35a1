// ModelConfig: the shape of a LLaMA-family model, read from a Hugging Face config.json or taken from a built-in preset.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "mk/limits.h"
#include "mk/tiles.h"

namespace mk {

enum class RopeType {
  kNone,     // no positional encoding at all (the seed blog's model)
  kDefault,  // plain RoPE: inv_freq = theta^(-2i/head_dim)
  kLlama3,   // RoPE with Llama 3.1 frequency scaling
};

struct RopeConfig {
  RopeType type = RopeType::kNone;
  double theta = 10000.0;
  // llama3 scaling parameters, used when type == kLlama3
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string name;
  int64_t d_model = 0;     // hidden_size
  int64_t d_ff = 0;        // intermediate_size
  int64_t n_layers = 0;    // num_hidden_layers
  int64_t n_heads = 0;     // num_attention_heads
  int64_t n_kv_heads = 0;  // num_key_value_heads
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  RopeConfig rope;
  bool has_embedding = true;  // false: hidden states in (the seed model)
  bool has_lm_head = true;    // false: hidden states out, no final norm (the seed model)
  bool tie_word_embeddings = false;

  // Plain products: validate() proved that they fit.
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int64_t group_size() const { return n_heads / n_kv_heads; }  // query heads per kv head (GQA)

  // Throws mk::Error naming the first bad field: sizes must be positive and within what the engines address
  // (include/mk/limits.h), products of sizes are computed with overflow checks, and the numbers must be sane.
  void validate() const;
};

// Sane bounds of the float fields: an eps of 1e308 zeroes every activation, a theta of 1e-308 makes RoPE all NaN.
constexpr double kMaxRmsNormEps = 1e-2;
constexpr double kMinRopeTheta = 1.0;  // exclusive

// "" when the two describe the same model (names aside), else the first differing field, e.g. "d_ff 512 vs 1024".
std::string first_difference(const ModelConfig& a, const ModelConfig& b);

// What one pass computes; each kind has its own program (src/ops/program.cc).
enum class PassKind : uint8_t {
  kForward,  // batch x seq_len tokens in, logits (or hidden states) out: `mk run`
  kPrefill,  // the forward pass's layers over the prompts, each layer's K and V appended to the KV cache; no LM head
  kDecode,   // one token per sequence at its own position: cache append, split-KV attention, logits, next token
};
const char* pass_kind_name(PassKind pass);  // "forward", "prefill", "decode"

// The token batch of one pass: batch sequences of seq_len tokens each (decode: seq_len 1), and for prefill and
// decode the KV cache they share: max_context positions per sequence.
struct RunShape {
  int64_t batch = 1;
  int64_t seq_len = 1;
  PassKind pass = PassKind::kForward;
  int64_t max_context = 0;  // prefill and decode: cache rows per sequence; 0 for a forward pass, which has no cache
  // decode: the tiles one round of a phase takes, the SM count the step runs on (the gpu engine sets its GPU's; the CPU
  // engines keep the H200's). More tiles than SMs would run a second round on some SMs in every phase.
  int64_t decode_spread = tiles::kDecodeSpreadTasks;
  // Overflow-checked: a shape from flags or a file may not have been validated yet.
  int64_t tokens() const { return checked_mul(batch, seq_len, "batch x seq_len"); }
  // Throws mk::Error unless batch and seq_len are positive, the pass has at most kMaxTokens tokens, and max_context
  // is in [0, kMaxTokens] (what the pass kind needs of it is check_pass_shape's).
  void validate() const;
  bool operator==(const RunShape&) const = default;
};
std::string describe(const RunShape& shape);  // "batch 2 x seq 40", "decode: batch 2, max context 256"

struct Preset {
  ModelConfig config;
  RunShape shape;  // the default run shape for this preset
  std::string description;
};

const std::vector<Preset>& presets();
const Preset& find_preset(std::string_view name);  // throws listing the known names

// Shape overrides of a preset, for sweeps (0: keep the preset's). d_model also sets heads = d_model / head_dim (so
// it must be a multiple of head_dim unless heads is given), kv heads = heads and d_ff = 4 d_model unless those are
// given.
struct ShapeOverrides {
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, d_ff = 0;
  bool any() const { return layers != 0 || d_model != 0 || heads != 0 || kv_heads != 0 || d_ff != 0; }
};
// The preset's config with the overrides applied, validated.
ModelConfig preset_config(std::string_view name, const ShapeOverrides& overrides = {});

const char* rope_type_name(RopeType type);  // "none", "default", "llama3"

// mk's own JSON form of a config, every field under its own name: what schedule files and `mk info --json` hold.
// `source` names the file in error messages; the result is validated.
nlohmann::json model_config_to_json(const ModelConfig& config);
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source);

// A Hugging Face config.json (LlamaForCausalLM): parsed and validated, or written so that transformers loads it.
ModelConfig model_config_from_hf_json(const nlohmann::json& json, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& config_json_path);
nlohmann::json model_config_to_hf_json(const ModelConfig& config);
// The config of a model directory: mk_config.json (mk's own form, for models Hugging Face cannot describe, such as
// the seed's without embedding or RoPE) when present, else config.json.
ModelConfig load_model_dir_config(const std::filesystem::path& dir);

std::string describe(const ModelConfig& config);

}  // namespace mk
