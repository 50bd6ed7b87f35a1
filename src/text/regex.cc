// PCRE2 behind the tokenizer's Regex: compiling Oniguruma-style patterns, iterating matches, Unicode predicates.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include <array>
#include <optional>

#include "mk/check.h"
#include "mk/tokenizer.h"
#include "utf8.h"

namespace mk::text {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int error) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(error, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

// Oniguruma's \s is Unicode White_Space; PCRE2's UCP \s adds U+180E. Oniguruma's \w is alphabetic characters,
// marks, decimal digits and connector punctuation; PCRE2 10.42's is letters, numbers and '_'.
// Writing the properties out gives both engines the same classes without any table of our own.
std::string translate_oniguruma(std::string_view pattern) {
  constexpr std::string_view kWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else if (next == 'w') {
        out += in_class ? std::string(kWord) : "[" + std::string(kWord) + "]";
      } else if (next == 'W' && !in_class) {
        out += "[^" + std::string(kWord) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::shared_ptr<const Regex::Code> compile(std::string_view pattern, uint32_t options, std::string_view shown) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto code = std::make_shared<Regex::Code>();
  code->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    options | PCRE2_UTF | ((options & PCRE2_LITERAL) ? 0 : PCRE2_UCP), &error, &error_offset, nullptr);
  MK_CHECK(code->code != nullptr, "bad regex '{}': {} (at offset {} of '{}' as given to PCRE2)", shown,
           pcre2_message(error), error_offset, pattern);
  // Without JIT (an unsupported CPU), PCRE2's interpreter gives the same matches, only slower.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return code;
}

struct MatchData {
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    MK_CHECK(data != nullptr, "out of memory for PCRE2 match data");
  }
  ~MatchData() { pcre2_match_data_free(data); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* data;
};

// One match at or after start; false when there is none. The text was validated as UTF-8 by the caller.
bool match_from(const pcre2_code* code, std::string_view text, size_t start, uint32_t options, MatchData& match,
                std::pair<size_t, size_t>& span) {
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                             options | PCRE2_NO_UTF_CHECK, match.data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  MK_CHECK(rc >= 0, "regex match failed at offset {}: {}", start, pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
  span = {ovector[0], ovector[1]};
  return true;
}

}  // namespace

Regex Regex::pattern(std::string_view oniguruma_pattern) {
  return Regex(compile(translate_oniguruma(oniguruma_pattern), 0, oniguruma_pattern));
}

Regex Regex::literal(std::string_view text) { return Regex(compile(text, PCRE2_LITERAL, text)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  MatchData match(code_->code);
  size_t search_from = 0;
  std::optional<size_t> last_match_end;
  while (search_from <= text.size()) {
    std::pair<size_t, size_t> span;
    if (!match_from(code_->code, text, search_from, 0, match, span)) break;
    if (span.first == span.second && last_match_end == span.second) {
      search_from += search_from < text.size() ? utf8_char_length(text, search_from) : 1;
      continue;
    }
    search_from = span.second;
    last_match_end = span.second;
    matches.push_back(span);
  }
  return matches;
}

bool Regex::matches_prefix(std::string_view text) const {
  MatchData match(code_->code);
  std::pair<size_t, size_t> span;
  return match_from(code_->code, text, 0, PCRE2_ANCHORED, match, span);
}

namespace {

bool code_point_matches(const Regex& regex, char32_t code_point) {
  std::string encoded;
  append_utf8(encoded, code_point);
  return regex.matches_prefix(encoded);
}

}  // namespace

bool is_white_space(char32_t code_point) {
  static const Regex regex = Regex::pattern("\\p{White_Space}");
  return code_point_matches(regex, code_point);
}

bool is_word_character(char32_t code_point) {
  static const Regex regex = Regex::pattern("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]");
  return code_point_matches(regex, code_point);
}

}  // namespace mk::text

namespace mk {

std::string Tokenizer::unicode_version() {
  std::array<char, 64> version{};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version.data());
  return version.data();
}

}  // namespace mk
