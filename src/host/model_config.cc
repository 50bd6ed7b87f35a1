// ModelConfig: validation, presets, mk's own JSON form (one field list) and Hugging Face config.json.
#include "mk/model_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "mk/check.h"
#include "mk/files.h"

namespace mk {

void ModelConfig::validate() const {
  auto positive = [&](int64_t value, const char* field) {
    MK_CHECK(value > 0, "model '{}': {} must be positive, got {}", name, field, value);
  };
  auto addressable = [&](int64_t value, int64_t limit, const char* field) {
    positive(value, field);
    MK_CHECK(value <= limit, "model '{}': {} {} is more than the {} the engines address", name, field, value, limit);
  };
  addressable(d_model, kMaxColumns, "hidden_size");
  addressable(d_ff, kMaxColumns, "intermediate_size");
  addressable(n_layers, kMaxLayers, "num_hidden_layers");
  addressable(n_heads, kMaxColumns, "num_attention_heads");
  addressable(n_kv_heads, kMaxColumns, "num_key_value_heads");
  addressable(head_dim, kMaxColumns, "head_dim");
  MK_CHECK(n_heads % n_kv_heads == 0,
           "model '{}': num_key_value_heads ({}) must divide num_attention_heads ({})", name, n_kv_heads,
           n_heads);
  // The widths q_dim(), kv_dim() and qkv_dim() compute without checks.
  const int64_t q = checked_mul(n_heads, head_dim, "num_attention_heads x head_dim");
  const int64_t kv = checked_mul(n_kv_heads, head_dim, "num_key_value_heads x head_dim");
  const int64_t qkv = checked_add(q, checked_mul(2, kv, "2 x num_key_value_heads x head_dim"), "q, k and v widths");
  addressable(qkv, kMaxColumns, "(num_attention_heads + 2 num_key_value_heads) x head_dim");
  MK_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0 && rms_norm_eps <= kMaxRmsNormEps,
           "model '{}': rms_norm_eps must be positive and at most {}, got {}", name, kMaxRmsNormEps, rms_norm_eps);
  if (has_embedding || has_lm_head) addressable(vocab_size, kMaxColumns, "vocab_size");
  MK_CHECK(!tie_word_embeddings || (has_embedding && has_lm_head),
           "model '{}': tie_word_embeddings needs both an embedding and an LM head", name);
  if (rope.type != RopeType::kNone) {
    MK_CHECK(head_dim % 2 == 0, "model '{}': RoPE needs an even head_dim, got {}", name, head_dim);
    MK_CHECK(std::isfinite(rope.theta) && rope.theta > kMinRopeTheta,
             "model '{}': rope_theta must be a finite number above {}, got {}", name, kMinRopeTheta, rope.theta);
    positive(max_position_embeddings, "max_position_embeddings");
  }
  if (rope.type == RopeType::kLlama3) {
    MK_CHECK(std::isfinite(rope.factor) && rope.factor > 0, "model '{}': rope_scaling.factor must be positive, got {}",
             name, rope.factor);
    MK_CHECK(std::isfinite(rope.high_freq_factor) && rope.low_freq_factor > 0 &&
                 rope.high_freq_factor > rope.low_freq_factor,
             "model '{}': rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}", name,
             rope.low_freq_factor, rope.high_freq_factor);
    positive(rope.original_max_position_embeddings, "rope_scaling.original_max_position_embeddings");
  }
}

void RunShape::validate() const {
  MK_CHECK(batch > 0 && seq_len > 0, "batch ({}) and sequence length ({}) must be positive", batch, seq_len);
  int64_t count = 0;
  MK_CHECK(!__builtin_mul_overflow(batch, seq_len, &count) && count <= kMaxTokens,
           "batch {} x sequence length {} is more than the {} tokens one pass addresses", batch, seq_len, kMaxTokens);
  MK_CHECK(max_context >= 0 && max_context <= kMaxTokens, "max context {} is outside [0, {}]", max_context, kMaxTokens);
  MK_CHECK(decode_spread > 0 && decode_spread <= kMaxDecodeSpread, "decode spread {} is outside [1, {}]",
           decode_spread, kMaxDecodeSpread);
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

// Reads a field that must be present; errors name the file and the field. Numbers go through json_to_int64 and
// json_to_double: nlohmann would convert true to 1, truncate 2.5 to 2 and cast 1e24 or 1e308 with undefined
// behaviour, while a size must be a whole number and a float must fit.
template <typename T>
T required(const nlohmann::json& json, const char* field, const std::string& source) {
  MK_CHECK(json.contains(field) && !json.at(field).is_null(), "{}: missing field '{}'", source, field);
  const nlohmann::json& value = json.at(field);
  const char* problem = "has the wrong type";
  if constexpr (std::is_same_v<T, bool>) {
    if (value.is_boolean()) return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const std::optional<int64_t> number = json_to_int64(value);
    if (number && std::in_range<T>(*number)) return T(*number);
    if (value.is_number_integer() ||
        (value.is_number_float() && std::trunc(value.get<double>()) == value.get<double>()))
      problem = "is out of range";
  } else if constexpr (std::is_floating_point_v<T>) {
    const std::optional<double> number = json_to_double(value);
    if (number && std::fabs(*number) <= std::numeric_limits<T>::max()) return T(*number);
    if (value.is_number()) problem = "is out of range";
  } else {
    if (value.is_string()) return value.get<std::string>();
  }
  throw Error(fmt::format("{}: field '{}' {} ({})", source, field, problem, json_excerpt(value)));
}

template <typename T>
T optional(const nlohmann::json& json, const char* field, T fallback, const std::string& source) {
  if (!json.contains(field) || json.at(field).is_null()) return fallback;
  return required<T>(json, field, source);
}

RopeConfig parse_rope(const nlohmann::json& json, const std::string& source) {
  // transformers < 5 writes rope_theta + rope_scaling; transformers >= 5 writes one rope_parameters object. Either,
  // when present, must be an object: a scaling given as anything else would otherwise be silently ignored.
  const nlohmann::json* scaling = nullptr;
  for (const char* field : {"rope_parameters", "rope_scaling"}) {
    if (!json.contains(field) || json.at(field).is_null()) continue;
    MK_CHECK(json.at(field).is_object(), "{}: field '{}' must be an object with a rope_type, got {}", source, field,
             json_excerpt(json.at(field)));
    if (scaling == nullptr) scaling = &json.at(field);
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
  MK_CHECK(type == "llama3", "{}: rope type '{}' is not supported (only 'default' and 'llama3')", source,
           printable(type));
  rope.type = RopeType::kLlama3;
  rope.factor = required<double>(*scaling, "factor", scaling_source);
  rope.low_freq_factor = required<double>(*scaling, "low_freq_factor", scaling_source);
  rope.high_freq_factor = required<double>(*scaling, "high_freq_factor", scaling_source);
  rope.original_max_position_embeddings =
      required<int64_t>(*scaling, "original_max_position_embeddings", scaling_source);
  return rope;
}

const char* const kRopeTypeNames[] = {"none", "default", "llama3"};  // in the order of RopeType

// Every field of ModelConfig under its name in mk's own JSON: the one list that serialization and comparison walk.
template <typename Config, typename Visit>  // Config: ModelConfig or const ModelConfig
void for_each_field(Config& c, Visit&& visit) {
  visit("name", c.name);
  visit("d_model", c.d_model);
  visit("d_ff", c.d_ff);
  visit("n_layers", c.n_layers);
  visit("n_heads", c.n_heads);
  visit("n_kv_heads", c.n_kv_heads);
  visit("head_dim", c.head_dim);
  visit("vocab_size", c.vocab_size);
  visit("max_position_embeddings", c.max_position_embeddings);
  visit("rms_norm_eps", c.rms_norm_eps);
  visit("rope_type", c.rope.type);
  visit("rope_theta", c.rope.theta);
  visit("rope_factor", c.rope.factor);
  visit("rope_low_freq_factor", c.rope.low_freq_factor);
  visit("rope_high_freq_factor", c.rope.high_freq_factor);
  visit("rope_original_max_position_embeddings", c.rope.original_max_position_embeddings);
  visit("has_embedding", c.has_embedding);
  visit("has_lm_head", c.has_lm_head);
  visit("tie_word_embeddings", c.tie_word_embeddings);
}

}  // namespace

const char* rope_type_name(RopeType type) { return kRopeTypeNames[int(type)]; }

nlohmann::json model_config_to_json(const ModelConfig& config) {
  nlohmann::json json = nlohmann::json::object();
  for_each_field(config, [&](const char* key, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, RopeType>) {
      json[key] = rope_type_name(value);
    } else {
      json[key] = value;
    }
  });
  return json;
}

ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& source) {
  MK_CHECK(json.is_object(), "{}: expected a JSON object", source);
  ModelConfig config;
  for_each_field(config, [&](const char* key, auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, RopeType>) {
      const std::string name = required<std::string>(json, key, source);
      const auto* known = std::find(std::begin(kRopeTypeNames), std::end(kRopeTypeNames), name);
      MK_CHECK(known != std::end(kRopeTypeNames), "{}: unknown rope_type '{}'", source, printable(name));
      value = RopeType(known - std::begin(kRopeTypeNames));
    } else {
      value = required<T>(json, key, source);
    }
  });
  config.validate();
  return config;
}

std::string first_difference(const ModelConfig& a, const ModelConfig& b) {
  const nlohmann::json json_a = model_config_to_json(a), json_b = model_config_to_json(b);
  std::string difference;
  for_each_field(a, [&](const char* key, const auto&) {
    if (difference.empty() && std::string_view(key) != "name" && json_a.at(key) != json_b.at(key))
      difference = fmt::format("{} {} vs {}", key, json_a.at(key).dump(), json_b.at(key).dump());
  });
  return difference;
}

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

ModelConfig preset_config(std::string_view name, const ShapeOverrides& overrides) {
  ModelConfig config = find_preset(name).config;
  const ShapeOverrides& o = overrides;
  MK_CHECK(o.layers >= 0 && o.d_model >= 0 && o.heads >= 0 && o.kv_heads >= 0 && o.d_ff >= 0,
           "shape overrides must not be negative (layers {}, d_model {}, heads {}, kv_heads {}, d_ff {})", o.layers,
           o.d_model, o.heads, o.kv_heads, o.d_ff);
  if (overrides.layers != 0) config.n_layers = overrides.layers;
  if (overrides.d_model != 0) {
    // Rounding the heads down would run another shape than the one asked for.
    MK_CHECK(overrides.heads != 0 || overrides.d_model % config.head_dim == 0,
             "d_model {} is not a multiple of the head_dim {} of preset '{}', so heads = d_model / head_dim is not "
             "whole: give a multiple of {}, or heads too",
             overrides.d_model, config.head_dim, config.name, config.head_dim);
    config.d_model = overrides.d_model;
    config.n_heads = overrides.heads != 0 ? overrides.heads : overrides.d_model / config.head_dim;
    config.n_kv_heads = config.n_heads;
    config.d_ff = 4 * overrides.d_model;
  }
  if (overrides.heads != 0) config.n_heads = overrides.heads;
  if (overrides.kv_heads != 0) config.n_kv_heads = overrides.kv_heads;
  if (overrides.d_ff != 0) config.d_ff = overrides.d_ff;
  config.validate();
  return config;
}

ModelConfig model_config_from_hf_json(const nlohmann::json& json, const std::string& source) {
  MK_CHECK(json.is_object(), "{}: expected a JSON object", source);
  std::string model_type = optional<std::string>(json, "model_type", "llama", source);
  MK_CHECK(model_type == "llama", "{}: model_type '{}' is not supported (only 'llama')", source, printable(model_type));
  std::string activation = optional<std::string>(json, "hidden_act", "silu", source);
  MK_CHECK(activation == "silu", "{}: hidden_act '{}' is not supported (only 'silu')", source, printable(activation));
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
  config.rms_norm_eps = optional<float>(json, "rms_norm_eps", 1e-6f, source);
  config.rope = parse_rope(json, source);
  config.tie_word_embeddings = optional<bool>(json, "tie_word_embeddings", false, source);
  config.validate();  // its messages name the model, which is `source` here
  return config;
}

ModelConfig load_model_config(const std::filesystem::path& config_json_path) {
  return model_config_from_hf_json(read_config_json(config_json_path), config_json_path.string());
}

ModelConfig load_model_dir_config(const std::filesystem::path& dir) {
  // A dangling mk_config.json link is refused by name (read_config_json_if_present), not passed over for config.json.
  const std::filesystem::path mk_config = dir / "mk_config.json";
  if (std::optional<nlohmann::json> json = read_config_json_if_present(mk_config))
    return model_config_from_json(*json, mk_config.string());
  return load_model_config(dir / "config.json");
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

const char* pass_kind_name(PassKind pass) {
  switch (pass) {
    case PassKind::kForward: return "forward";
    case PassKind::kPrefill: return "prefill";
    case PassKind::kDecode: return "decode";
  }
  return "invalid";
}

std::string describe(const RunShape& shape) {
  // A spread other than the default, whatever the pass: shapes that differ in it alone (a schedule file's forward
  // pass with a "decode_spread" of its own) must not be named alike in a mismatch.
  const std::string spread = shape.decode_spread == tiles::kDecodeSpreadTasks
                                 ? ""
                                 : fmt::format(", a round of {} tiles", shape.decode_spread);
  switch (shape.pass) {
    case PassKind::kForward: return fmt::format("batch {} x seq {}{}", shape.batch, shape.seq_len, spread);
    case PassKind::kPrefill:
      return fmt::format("prefill: batch {} x seq {}, max context {}{}", shape.batch, shape.seq_len, shape.max_context,
                         spread);
    case PassKind::kDecode:
      return fmt::format("decode: batch {}, max context {}{}", shape.batch, shape.max_context, spread);
  }
  return "invalid pass";
}

std::string describe(const ModelConfig& c) {
  const char* rope = rope_type_name(c.rope.type);
  return fmt::format(
      "model {}: d_model {}, d_ff {}, layers {}, heads {} (kv {}, head_dim {}), vocab {}, rope {} (theta {}), "
      "embedding {}, lm_head {}{}, rms_norm_eps {}",
      c.name, c.d_model, c.d_ff, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, rope, c.rope.theta,
      c.has_embedding ? "yes" : "no", c.has_lm_head ? "yes" : "no", c.tie_word_embeddings ? " (tied)" : "",
      c.rms_norm_eps);
}

}  // namespace mk
