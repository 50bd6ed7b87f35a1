// Reading tokenizer.json entries with errors that name the entry and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "mk/check.h"

namespace mk::text {

// A JSON value for an error message: its text, cut to some 80 bytes at a character boundary.
inline std::string brief(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() <= 80) return text;
  size_t cut = 80;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// json[key], which must exist; what names the entry in the error ("pre_tokenizer Split").
inline const nlohmann::json& required_field(const nlohmann::json& json, const char* key, std::string_view what) {
  MK_CHECK(json.is_object() && json.contains(key), "{} has no \"{}\"", what, key);
  return json.at(key);
}

inline std::string string_field(const nlohmann::json& json, const char* key, std::string_view what) {
  const nlohmann::json& value = required_field(json, key, what);
  MK_CHECK(value.is_string(), "{}: \"{}\" must be a string, got {}", what, key, brief(value));
  return value.get<std::string>();
}

// json[key] as a bool; fallback where the field is absent or null.
inline bool bool_field(const nlohmann::json& json, const char* key, bool fallback, std::string_view what) {
  if (!json.is_object() || !json.contains(key) || json.at(key).is_null()) return fallback;
  const nlohmann::json& value = json.at(key);
  MK_CHECK(value.is_boolean(), "{}: \"{}\" must be true or false, got {}", what, key, brief(value));
  return value.get<bool>();
}

// The "type" of a component, required to be a string.
inline std::string type_of(const nlohmann::json& json, std::string_view what) {
  MK_CHECK(json.is_object(), "{} must be an object, got {}", what, brief(json));
  return string_field(json, "type", what);
}

// The components listed under key of a Sequence component, each parsed by parse.
template <typename Parse>
auto parse_steps(const nlohmann::json& json, const char* key, std::string_view what, Parse parse) {
  const nlohmann::json& list = required_field(json, key, what);
  MK_CHECK(list.is_array(), "{}: \"{}\" must be a list", what, key);
  std::vector<decltype(parse(list))> steps;
  for (const nlohmann::json& step : list) {
    MK_CHECK(!step.is_null(), "{}: \"{}\" holds a null entry", what, key);
    steps.push_back(parse(step));
  }
  return steps;
}

}  // namespace mk::text
