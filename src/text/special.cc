// What add_special_tokens adds (tokenizer.json's post_processor, or tokenizer_config.json's add_bos_token and
// add_eos_token), and the BOS/EOS ids that the model directory's config files declare.
#include "special.h"

#include <fmt/format.h>

#include "json_fields.h"
#include "mk/files.h"

namespace mk::text {

namespace {

using nlohmann::json;

// A TemplateProcessing's "single" template around the sequence $A.
Affixes template_affixes(const json& processor) {
  constexpr std::string_view what = "post_processor TemplateProcessing";
  const json& single = required_field(processor, "single", what);
  const json& special_tokens = required_field(processor, "special_tokens", what);
  MK_CHECK(single.is_array(), "{}: \"single\" must be a list", what);
  Affixes affixes;
  bool seen_sequence = false;
  for (const json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id = string_field(piece["Sequence"], "id", what);
      MK_CHECK(id == "A" && !seen_sequence, "{}: the single template must hold $A once, got ${}", what, id);
      seen_sequence = true;
      continue;
    }
    MK_CHECK(piece.is_object() && piece.contains("SpecialToken"), "{}: unknown template piece {}", what, brief(piece));
    const std::string name = string_field(piece["SpecialToken"], "id", what);
    MK_CHECK(special_tokens.is_object() && special_tokens.contains(name),
             "{}: the template uses \"{}\", which special_tokens does not define", what, name);
    const json& ids = required_field(special_tokens[name], "ids", what);
    MK_CHECK(ids.is_array(), "{}: special_tokens[\"{}\"].ids must be a list", what, name);
    for (const json& id : ids) {
      MK_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: bad id {} for \"{}\"", what, brief(id), name);
      (seen_sequence ? affixes.suffix : affixes.prefix).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  MK_CHECK(seen_sequence, "{}: the single template has no $A", what);
  return affixes;
}

// BertProcessing's and RobertaProcessing's ["token", id] pairs.
int32_t pair_id(const json& processor, const char* key, std::string_view what) {
  const json& pair = required_field(processor, key, what);
  MK_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer() && pair[1].get<int64_t>() >= 0,
           "{}: \"{}\" must be [token, id], got {}", what, key, brief(pair));
  return static_cast<int32_t>(pair[1].get<int64_t>());
}

// The text of a token entry of tokenizer_config.json: "<s>" or {"content": "<s>", ...}; "" when absent or null.
std::string config_token(const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  return string_field(value, "content", std::string("tokenizer_config.json ") + key);
}

// An id or a list of ids (generation_config.json and config.json allow both); empty when absent or null.
std::vector<int32_t> config_ids(const json& config, const char* key, std::string_view file) {
  if (!config.is_object() || !config.contains(key)) return {};
  return json_token_ids(config[key], fmt::format("{}: \"{}\"", file, key));
}

}  // namespace

Affixes parse_post_processor(const json& processor) {
  if (processor.is_null()) return {};
  const std::string type = type_of(processor, "post_processor");
  const std::string what = "post_processor " + type;
  if (type == "TemplateProcessing") return template_affixes(processor);
  if (type == "ByteLevel") return {};  // it only trims offsets
  if (type == "BertProcessing" || type == "RobertaProcessing")
    return {{pair_id(processor, "cls", what)}, {pair_id(processor, "sep", what)}};
  if (type == "Sequence") {
    // Each processor wraps what the ones before it produced.
    Affixes affixes;
    for (Affixes& outer : parse_steps(processor, "processors", what, parse_post_processor)) {
      outer.prefix.insert(outer.prefix.end(), affixes.prefix.begin(), affixes.prefix.end());
      affixes.suffix.insert(affixes.suffix.end(), outer.suffix.begin(), outer.suffix.end());
      affixes.prefix = std::move(outer.prefix);
    }
    return affixes;
  }
  throw Error(
      fmt::format("post_processor type \"{}\" is not supported (supported: TemplateProcessing, ByteLevel, "
                  "BertProcessing, RobertaProcessing, Sequence)",
                  type));
}

SpecialIds resolve_special_ids(const ConfigFiles& files,
                               const std::function<std::optional<int32_t>(std::string_view)>& id_of, Affixes& affixes) {
  SpecialIds ids;
  const std::string bos_token = config_token(files.tokenizer_config, "bos_token");
  const std::string eos_token = config_token(files.tokenizer_config, "eos_token");
  const auto id_of_config_token = [&](const std::string& token, const char* key) -> std::optional<int32_t> {
    if (token.empty()) return std::nullopt;
    const auto id = id_of(token);
    MK_CHECK(id.has_value(), "tokenizer_config.json: {} \"{}\" is not in the vocabulary", key, token);
    return id;
  };
  ids.bos = id_of_config_token(bos_token, "bos_token");
  for (const auto* file : {&files.generation_config, &files.model_config}) {
    const char* name = file == &files.generation_config ? "generation_config.json" : "config.json";
    if (!ids.bos) {
      const auto bos = config_ids(*file, "bos_token_id", name);
      if (!bos.empty()) ids.bos = bos.front();
    }
  }
  // Where the ids came from, for a caller to name when the ids do not fit its model.
  const auto source = [&](const char* file, std::string_view entry) {
    return fmt::format("{}: {}", (files.dir / file).string(), entry);
  };
  // The first of generation_config.json, tokenizer_config.json's eos_token and config.json that names any.
  if (ids.eos = config_ids(files.generation_config, "eos_token_id", "generation_config.json"); !ids.eos.empty()) {
    ids.eos_source = source("generation_config.json", "eos_token_id");
  } else if (const auto eos = id_of_config_token(eos_token, "eos_token")) {
    ids.eos = {*eos};
    ids.eos_source = source("tokenizer_config.json", fmt::format("eos_token \"{}\"", eos_token));
  } else if (ids.eos = config_ids(files.model_config, "eos_token_id", "config.json"); !ids.eos.empty()) {
    ids.eos_source = source("config.json", "eos_token_id");
  }

  // transformers' LlamaTokenizer(Fast) rebuilds the post-processor from these flags (BOS on, EOS off by default).
  const json& config = files.tokenizer_config;
  if (config.is_object() && (config.contains("add_bos_token") || config.contains("add_eos_token"))) {
    affixes = {};
    if (bool_field(config, "add_bos_token", true, "tokenizer_config.json")) {
      MK_CHECK(!bos_token.empty(), "tokenizer_config.json: add_bos_token is set but bos_token is not");
      affixes.prefix.push_back(*id_of_config_token(bos_token, "bos_token"));
    }
    if (bool_field(config, "add_eos_token", false, "tokenizer_config.json")) {
      MK_CHECK(!eos_token.empty(), "tokenizer_config.json: add_eos_token is set but eos_token is not");
      affixes.suffix.push_back(*id_of_config_token(eos_token, "eos_token"));
    }
  }
  return ids;
}

}  // namespace mk::text
