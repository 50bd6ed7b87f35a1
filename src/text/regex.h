// Regular expressions of tokenizer.json (written for Oniguruma) on PCRE2, and the Unicode character tests built on it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mk::text {

// A compiled pattern, UTF-8 with Unicode properties (PCRE2_UTF | PCRE2_UCP), JIT-compiled where PCRE2 can.
// Copies share the compiled code; matching is thread-safe.
class Regex {
 public:
  // An Oniguruma pattern: \s, \S, \w and \W (outside [...] for \W) are rewritten to the Unicode properties that
  // Oniguruma gives them, where PCRE2's differ. Throws mk::Error with PCRE2's message and the pattern offset.
  static Regex pattern(std::string_view oniguruma_pattern);
  // Matches text literally.
  static Regex literal(std::string_view text);

  // The non-overlapping matches left to right, as [begin, end) byte offsets. Like the onig crate's find_iter that
  // `tokenizers` uses, an empty match right where the previous match ended is skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  // Whether the pattern matches a prefix of text (anchored at its start).
  bool matches_prefix(std::string_view text) const;

  struct Code;

 private:
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

// Rust's char::is_whitespace / regex \s (Unicode White_Space), which `tokenizers` uses for lstrip and rstrip.
bool is_white_space(char32_t code_point);
// Rust regex's Unicode \w (Alphabetic, marks, decimal digits, connector punctuation, join controls), which
// `tokenizers` uses for single_word.
bool is_word_character(char32_t code_point);

}  // namespace mk::text
