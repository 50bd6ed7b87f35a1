// Normalizers and pre-tokenizers of tokenizer.json: what happens to text between the added-token split and BPE.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "regex.h"

namespace mk::text {

// A stretch of (normalized) text on its way to the model. at_origin: it begins at offset 0 of the original text,
// which Metaspace's prepend_scheme "first" asks about.
struct Piece {
  std::string text;
  bool at_origin = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces by their pre-tokens; empty pieces are dropped, as `tokenizers` drops them.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// A Split's or Replace's "pattern": {"String": literal} or {"Regex": Oniguruma pattern}.
Regex parse_pattern(const nlohmann::json& component, std::string_view what);

// nullptr for JSON null. Throws mk::Error naming an unsupported type or a malformed entry.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& json);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& json);

// The GPT-2 byte-to-character map of ByteLevel: each byte stands for one printable character in the vocabulary.
const std::string& byte_level_char(unsigned char byte);
// The inverse map: the byte that a code point stands for, or -1 when it stands for none.
int byte_level_byte(char32_t code_point);

}  // namespace mk::text
