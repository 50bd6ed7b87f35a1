// UTF-8 helpers of the tokenizer: validation with the offending offset, lossy conversion, code points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mk::text {

// One step through possibly ill-formed UTF-8: a whole character (valid) or the maximal subpart of an ill-formed
// sequence, which U+FFFD replaces as a unit (Unicode's recommended practice).
struct Utf8Step {
  size_t length = 1;
  bool valid = true;
};
Utf8Step utf8_step(std::string_view text, size_t offset);

// The offset of the first byte that starts no well-formed sequence, or nullopt for valid UTF-8.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// The length of the character starting at offset of valid UTF-8.
inline size_t utf8_char_length(std::string_view text, size_t offset) {
  const auto lead = static_cast<uint8_t>(text[offset]);
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// The code point at offset of valid UTF-8.
char32_t code_point_at(std::string_view text, size_t offset);

// The start of the character that ends at offset (offset > 0) in valid UTF-8.
size_t previous_char_start(std::string_view text, size_t offset);

void append_utf8(std::string& out, char32_t code_point);

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace mk::text
