// UTF-8 validation, lossy conversion and code points, by Unicode's table of well-formed byte sequences.
#include "utf8.h"

#include "mk/tokenizer.h"

namespace mk::text {

Utf8Step utf8_step(std::string_view text, size_t offset) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(offset);
  if (lead < 0x80) return {1, true};
  // The second byte's range depends on the lead (no overlongs, no surrogates, nothing past U+10FFFF).
  size_t continuation = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation = 2;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation = 3;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, false};
  }
  for (size_t k = 1; k <= continuation; ++k) {
    if (offset + k >= text.size()) return {k, false};
    const uint8_t b = byte(offset + k);
    if (b < low || b > high) return {k, false};
    low = 0x80;
    high = 0xBF;
  }
  return {continuation + 1, true};
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Step step = utf8_step(text, i);
    if (!step.valid) return i;
    i += step.length;
  }
  return std::nullopt;
}

char32_t code_point_at(std::string_view text, size_t offset) {
  const size_t length = utf8_char_length(text, offset);
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(text[offset + k])); };
  if (length == 1) return byte(0);
  char32_t value = byte(0) & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) value = (value << 6) | (byte(k) & 0x3F);
  return value;
}

size_t previous_char_start(std::string_view text, size_t offset) {
  size_t start = offset - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace mk::text

namespace mk {

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const text::Utf8Step step = text::utf8_step(text, i);
    if (step.valid) {
      out.append(text.substr(i, step.length));
    } else {
      out.append(text::kReplacementCharacter);
    }
    i += step.length;
  }
  return out;
}

}  // namespace mk
