// ModelConfig: presets, Hugging Face config.json parsing and validation, and forward-pass accounting.
#include "mk/model_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <type_traits>

#include "mk/check.h"

namespace mk {

void ModelConfig::validate() const {
  auto positive = [&](int64_t value, const char* field) {
    MK_CHECK(value > 0, "model '{}': {} must be positive, got {}", name, field, value);
  };
  positive(d_model, "hidden_size");
  positive(d_ff, "intermediate_size");
  positive(n_layers, "num_hidden_layers");
  positive(n_heads, "num_attention_heads");
  positive(n_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  MK_CHECK(n_heads % n_kv_heads == 0,
           "model '{}': num_key_value_heads ({}) must divide num_attention_heads ({})", name, n_kv_heads,
           n_heads);
  MK_CHECK(rms_norm_eps > 0, "model '{}': rms_norm_eps must be positive, got {}", name, rms_norm_eps);
  if (has_embedding || has_lm_head) positive(vocab_size, "vocab_size");
  MK_CHECK(!tie_word_embeddings || (has_embedding && has_lm_head),
           "model '{}': tie_word_embeddings needs both an embedding and an LM head", name);
  if (rope.type != RopeType::kNone) {
    MK_CHECK(head_dim % 2 == 0, "model '{}': RoPE needs an even head_dim, got {}", name, head_dim);
    MK_CHECK(rope.theta > 0, "model '{}': rope_theta must be positive, got {}", name, rope.theta);
    positive(max_position_embeddings, "max_position_embeddings");
  }
  if (rope.type == RopeType::kLlama3) {
    MK_CHECK(rope.factor > 0, "model '{}': rope_scaling.factor must be positive, got {}", name, rope.factor);
    MK_CHECK(rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor,
             "model '{}': rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}", name,
             rope.low_freq_factor, rope.high_freq_factor);
    positive(rope.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings");
  }
}

std::string first_difference(const ModelConfig& a, const ModelConfig& b) {
  const std::pair<const char*, std::pair<double, double>> fields[] = {
      {"d_model", {double(a.d_model), double(b.d_model)}},
      {"d_ff", {double(a.d_ff), double(b.d_ff)}},
      {"n_layers", {double(a.n_layers), double(b.n_layers)}},
      {"n_heads", {double(a.n_heads), double(b.n_heads)}},
      {"n_kv_heads", {double(a.n_kv_heads), double(b.n_kv_heads)}},
      {"head_dim", {double(a.head_dim), double(b.head_dim)}},
      {"vocab_size", {double(a.vocab_size), double(b.vocab_size)}},
      {"max_position_embeddings", {double(a.max_position_embeddings), double(b.max_position_embeddings)}},
      {"rms_norm_eps", {double(a.rms_norm_eps), double(b.rms_norm_eps)}},
      {"rope type", {double(int(a.rope.type)), double(int(b.rope.type))}},
      {"rope_theta", {a.rope.theta, b.rope.theta}},
      {"rope factor", {a.rope.factor, b.rope.factor}},
      {"rope low_freq_factor", {a.rope.low_freq_factor, b.rope.low_freq_factor}},
      {"rope high_freq_factor", {a.rope.high_freq_factor, b.rope.high_freq_factor}},
      {"rope original_max_position_embeddings",
       {double(a.rope.original_max_position_embeddings), double(b.rope.original_max_position_embeddings)}},
      {"has_embedding", {double(a.has_embedding), double(b.has_embedding)}},
      {"has_lm_head", {double(a.has_lm_head), double(b.has_lm_head)}},
      {"tie_word_embeddings", {double(a.tie_word_embeddings), double(b.tie_word_embeddings)}},
  };
  for (const auto& [name, values] : fields)
    if (values.first != values.second) return fmt::format("{} {} vs {}", name, values.first, values.second);
  return "";
}

namespace {

RopeConfig llama3_rope(double theta, double factor, int64_t original_max_position_embeddings) {
  return RopeConfig{RopeType::kLlama3, theta, factor, 1.0, 4.0, original_max_position_embeddings};
}

std::vector<Preset> make_presets() {
  std::vector<Preset> list;
  {
    ModelConfig seed;
    seed.name = "seed";
    seed.d_model = 1024;
    seed.d_ff = 4096;
    seed.n_layers = 8;
    seed.n_heads = 8;
    seed.n_kv_heads = 8;
    seed.head_dim = 128;
    seed.rms_norm_eps = 1e-6f;
    seed.has_embedding = false;
    seed.has_lm_head = false;
    list.push_back({seed, {8, 256}, "the seed blog's model: no RoPE, no embedding, no LM head"});
  }
  {
    ModelConfig tiny;
    tiny.name = "tiny";
    tiny.d_model = 256;
    tiny.d_ff = 512;
    tiny.n_layers = 2;
    tiny.n_heads = 4;
    tiny.n_kv_heads = 2;
    tiny.head_dim = 64;
    tiny.vocab_size = 384;
    tiny.max_position_embeddings = 1024;
    tiny.rope = llama3_rope(500000.0, 8.0, 64);
    list.push_back({tiny, {2, 40}, "a tiny Llama for fast tests (GQA 2:1, llama3 RoPE, untied LM head)"});
  }
  {
    ModelConfig llama1b;
    llama1b.name = "llama-3.2-1b";
    llama1b.d_model = 2048;
    llama1b.d_ff = 8192;
    llama1b.n_layers = 16;
    llama1b.n_heads = 32;
    llama1b.n_kv_heads = 8;
    llama1b.head_dim = 64;
    llama1b.vocab_size = 128256;
    llama1b.max_position_embeddings = 131072;
    llama1b.rope = llama3_rope(500000.0, 32.0, 8192);
    llama1b.tie_word_embeddings = true;
    list.push_back({llama1b, {8, 256}, "Llama 3.2 1B shapes"});
  }
  {
    ModelConfig llama8b;
    llama8b.name = "llama-3.1-8b";
    llama8b.d_model = 4096;
    llama8b.d_ff = 14336;
    llama8b.n_layers = 32;
    llama8b.n_heads = 32;
    llama8b.n_kv_heads = 8;
    llama8b.head_dim = 128;
    llama8b.vocab_size = 128256;
    llama8b.max_position_embeddings = 131072;
    llama8b.rope = llama3_rope(500000.0, 8.0, 8192);
    list.push_back({llama8b, {4, 512}, "Llama 3.1 8B shapes"});
  }
  for (const Preset& preset : list) preset.config.validate();
  return list;
}

// Reads a field that must be present; errors name the file and the field.
template <typename T>
T required(const nlohmann::json& json, const char* field, const std::string& source) {
  MK_CHECK(json.contains(field) && !json.at(field).is_null(), "{}: missing field '{}'", source, field);
  const nlohmann::json& value = json.at(field);
  // nlohmann converts true to 1 and truncates 2.5 to 2; a size field must hold a whole number.
  bool right_type = true;
  if constexpr (std::is_same_v<T, bool>) {
    right_type = value.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    const double number = value.is_number_float() ? value.get<double>() : 0.5;
    right_type = value.is_number_integer() || (std::trunc(number) == number && std::fabs(number) < 0x1p62);
  } else if constexpr (std::is_floating_point_v<T>) {
    right_type = value.is_number();
  }
  try {
    if (right_type) return value.get<T>();
  } catch (const nlohmann::json::exception&) {
  }
  throw Error(fmt::format("{}: field '{}' has the wrong type ({})", source, field, value.dump()));
}

template <typename T>
T optional(const nlohmann::json& json, const char* field, T fallback, const std::string& source) {
  if (!json.contains(field) || json.at(field).is_null()) return fallback;
  return required<T>(json, field, source);
}

RopeConfig parse_rope(const nlohmann::json& json, const std::string& source) {
  // transformers < 5 writes rope_theta + rope_scaling; transformers >= 5 writes one rope_parameters object.
  const nlohmann::json* scaling = nullptr;
  if (json.contains("rope_parameters") && json.at("rope_parameters").is_object()) {
    scaling = &json.at("rope_parameters");
  } else if (json.contains("rope_scaling") && json.at("rope_scaling").is_object()) {
    scaling = &json.at("rope_scaling");
  }
  RopeConfig rope;
  rope.type = RopeType::kDefault;
  rope.theta = optional<double>(json, "rope_theta", 10000.0, source);
  if (scaling == nullptr) return rope;
  std::string scaling_source = source + " (rope scaling)";
  rope.theta = optional<double>(*scaling, "rope_theta", rope.theta, scaling_source);
  std::string type = optional<std::string>(*scaling, "rope_type", "", scaling_source);
  if (type.empty()) type = optional<std::string>(*scaling, "type", "default", scaling_source);
  if (type == "default") return rope;
  MK_CHECK(type == "llama3", "{}: rope type '{}' is not supported (only 'default' and 'llama3')", source, type);
  rope.type = RopeType::kLlama3;
  rope.factor = required<double>(*scaling, "factor", scaling_source);
  rope.low_freq_factor = required<double>(*scaling, "low_freq_factor", scaling_source);
  rope.high_freq_factor = required<double>(*scaling, "high_freq_factor", scaling_source);
  rope.original_max_position_embeddings =
      required<int64_t>(*scaling, "original_max_position_embeddings", scaling_source);
  return rope;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> list = make_presets();
  return list;
}

const Preset& find_preset(std::string_view name) {
  std::string known;
  for (const Preset& preset : presets()) {
    if (preset.config.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.config.name;
  }
  throw Error(fmt::format("unknown preset '{}' (known: {})", name, known));
}

ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source) {
  MK_CHECK(json.is_object(), "{}: expected a JSON object", source);
  std::string model_type = optional<std::string>(json, "model_type", "llama", source);
  MK_CHECK(model_type == "llama", "{}: model_type '{}' is not supported (only 'llama')", source, model_type);
  std::string activation = optional<std::string>(json, "hidden_act", "silu", source);
  MK_CHECK(activation == "silu", "{}: hidden_act '{}' is not supported (only 'silu')", source, activation);
  MK_CHECK(!optional<bool>(json, "attention_bias", false, source), "{}: attention_bias is not supported", source);
  MK_CHECK(!optional<bool>(json, "mlp_bias", false, source), "{}: mlp_bias is not supported", source);

  ModelConfig config;
  config.name = source;
  config.d_model = required<int64_t>(json, "hidden_size", source);
  config.d_ff = required<int64_t>(json, "intermediate_size", source);
  config.n_layers = required<int64_t>(json, "num_hidden_layers", source);
  config.n_heads = required<int64_t>(json, "num_attention_heads", source);
  config.n_kv_heads = optional<int64_t>(json, "num_key_value_heads", config.n_heads, source);
  MK_CHECK(config.n_heads > 0, "{}: num_attention_heads must be positive, got {}", source, config.n_heads);
  if (json.contains("head_dim") && !json.at("head_dim").is_null()) {
    config.head_dim = required<int64_t>(json, "head_dim", source);
  } else {
    MK_CHECK(config.d_model % config.n_heads == 0,
             "{}: hidden_size ({}) is not divisible by num_attention_heads ({}) and head_dim is not given", source,
             config.d_model, config.n_heads);
    config.head_dim = config.d_model / config.n_heads;
  }
  config.vocab_size = required<int64_t>(json, "vocab_size", source);
  config.max_position_embeddings = required<int64_t>(json, "max_position_embeddings", source);
  config.rms_norm_eps = float(optional<double>(json, "rms_norm_eps", 1e-6, source));
  config.rope = parse_rope(json, source);
  config.tie_word_embeddings = optional<bool>(json, "tie_word_embeddings", false, source);
  config.validate();  // its messages name the model, which is `source` here
  return config;
}

ModelConfig load_model_config(const std::filesystem::path& config_json_path) {
  std::ifstream file(config_json_path);
  MK_CHECK(file.good(), "{}: cannot open", config_json_path.string());
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    throw Error(fmt::format("{}: not valid JSON: {}", config_json_path.string(), error.what()));
  }
  return model_config_from_json(json, config_json_path.string());
}

nlohmann::json model_config_to_hf_json(const ModelConfig& config) {
  MK_CHECK(config.has_embedding && config.has_lm_head,
           "model '{}' has no embedding or no LM head: Hugging Face LlamaForCausalLM needs both", config.name);
  MK_CHECK(config.rope.type != RopeType::kNone, "model '{}' has no RoPE: LlamaForCausalLM always applies RoPE",
           config.name);
  nlohmann::json json = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"hidden_size", config.d_model},
      {"intermediate_size", config.d_ff},
      {"num_hidden_layers", config.n_layers},
      {"num_attention_heads", config.n_heads},
      {"num_key_value_heads", config.n_kv_heads},
      {"head_dim", config.head_dim},
      {"vocab_size", config.vocab_size},
      {"max_position_embeddings", config.max_position_embeddings},
      {"rms_norm_eps", config.rms_norm_eps},
      {"rope_theta", config.rope.theta},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
  };
  if (config.rope.type == RopeType::kLlama3) {
    json["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", config.rope.factor},
        {"low_freq_factor", config.rope.low_freq_factor},
        {"high_freq_factor", config.rope.high_freq_factor},
        {"original_max_position_embeddings", config.rope.original_max_position_embeddings},
    };
  } else {
    json["rope_scaling"] = nullptr;
  }
  return json;
}

ForwardCost forward_cost(const ModelConfig& c, const RunShape& shape) {
  const double tokens = double(shape.tokens());
  const double layer_params = double(c.d_model) * (c.qkv_dim() + c.q_dim()) + 3.0 * c.d_model * c.d_ff + 2.0 * c.d_model;
  ForwardCost cost;
  double embedding_params = c.has_embedding ? double(c.vocab_size) * c.d_model : 0.0;
  double head_params = c.has_lm_head ? double(c.d_model) + (c.tie_word_embeddings ? 0.0 : double(c.vocab_size) * c.d_model) : 0.0;
  cost.parameters = int64_t(c.n_layers * layer_params + embedding_params + head_params);

  const double gemm_flops_per_layer = 2.0 * tokens * c.d_model * (c.qkv_dim() + c.q_dim() + 3.0 * c.d_ff);
  const double attention_flops_per_layer = 4.0 * shape.batch * double(shape.seq_len) * shape.seq_len * c.q_dim() / 2;
  cost.flops = c.n_layers * (gemm_flops_per_layer + attention_flops_per_layer);
  if (c.has_lm_head) cost.flops += 2.0 * tokens * c.d_model * c.vocab_size;

  // The embedding table is gathered, not streamed: only the tokens' rows are read. A tied LM head still streams it.
  double streamed_params = c.n_layers * layer_params + (c.has_lm_head ? double(c.d_model) * (1.0 + c.vocab_size) : 0.0);
  cost.weight_bytes = 2.0 * streamed_params;
  double input_bytes = c.has_embedding ? tokens * (4.0 + 2.0 * c.d_model) : 2.0 * tokens * c.d_model;
  double output_bytes = 2.0 * tokens * (c.has_lm_head ? c.vocab_size : c.d_model);
  double kv_bytes = 2.0 * c.n_layers * tokens * 2.0 * c.kv_dim();
  cost.min_bytes = cost.weight_bytes + input_bytes + output_bytes + kv_bytes;

  // bf16 buffers, each written once per pass: per layer xn1, qkv, attn, h_mid, xn2, act, h_out; plus input,
  // final norm and logits.
  double per_layer = tokens * (4.0 * c.d_model + c.qkv_dim() + c.q_dim() + c.d_ff);
  double outside = tokens * c.d_model + (c.has_lm_head ? tokens * (c.d_model + c.vocab_size) : 0.0);
  cost.activation_bytes = 2.0 * (c.n_layers * per_layer + outside);
  return cost;
}

std::string describe(const ModelConfig& c) {
  const char* rope = c.rope.type == RopeType::kNone ? "none" : c.rope.type == RopeType::kDefault ? "default" : "llama3";
  return fmt::format(
      "model {}: d_model {}, d_ff {}, layers {}, heads {} (kv {}, head_dim {}), vocab {}, rope {} (theta {}), "
      "embedding {}, lm_head {}{}, rms_norm_eps {}",
      c.name, c.d_model, c.d_ff, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, rope, c.rope.theta,
      c.has_embedding ? "yes" : "no", c.has_lm_head ? "yes" : "no", c.tie_word_embeddings ? " (tied)" : "",
      c.rms_norm_eps);
}

}  // namespace mk
