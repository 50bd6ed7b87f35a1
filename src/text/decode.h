// The decoders of tokenizer.json: token strings back to text.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <vector>

namespace mk::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of `tokenizers`' decode_chain: token strings in, token strings out; the caller joins the last.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for JSON null (tokens are then joined with spaces). Throws mk::Error for an unsupported type.
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& json);

}  // namespace mk::text
