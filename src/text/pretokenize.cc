// Normalizers (Sequence, Prepend, Replace) and pre-tokenizers (Sequence, Split, ByteLevel, Metaspace), each doing
// what its namesake in `tokenizers` does to the text, offsets aside.
#include "pretokenize.h"

#include <algorithm>
#include <array>
#include <functional>

#include "json_fields.h"
#include "regex.h"
#include "utf8.h"

namespace mk::text {

namespace {

using nlohmann::json;

// [begin, end) of the text with whether it is a match; together the spans cover the text.
struct Span {
  size_t begin = 0, end = 0;
  bool is_match = false;
};

std::vector<Span> spans_of(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Span> spans;
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), false});
  return spans;
}

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const json& json_entry, std::string_view what) {
  const std::string name = string_field(json_entry, "behavior", what);
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw Error(fmt::format("{}: unknown behavior \"{}\"", what, name));
}

// Walks the spans in order, growing the last kept span over the next one where joins(is_match, previous_match).
template <typename Iterator, typename Joins>
std::vector<Span> fold_spans(Iterator begin, Iterator end, Joins joins) {
  std::vector<Span> out;
  bool previous_match = false;
  for (Iterator it = begin; it != end; ++it) {
    if (joins(it->is_match, previous_match) && !out.empty()) {
      out.back().begin = std::min(out.back().begin, it->begin);
      out.back().end = std::max(out.back().end, it->end);
    } else {
      out.push_back(*it);
    }
    previous_match = it->is_match;
  }
  return out;
}

// The spans to keep, as NormalizedString::split forms them from the matches.
std::vector<Span> apply_behavior(const std::vector<Span>& spans, Behavior behavior) {
  const auto match_after_text = [](bool is_match, bool previous_match) { return is_match && !previous_match; };
  switch (behavior) {
    case Behavior::kIsolated:
      return spans;
    case Behavior::kRemoved: {
      std::vector<Span> out;
      for (const Span& span : spans)
        if (!span.is_match) out.push_back(span);
      return out;
    }
    case Behavior::kContiguous:
      return fold_spans(spans.begin(), spans.end(), std::equal_to<bool>());
    case Behavior::kMergedWithPrevious:
      return fold_spans(spans.begin(), spans.end(), match_after_text);
    case Behavior::kMergedWithNext: {
      const std::vector<Span> reversed = fold_spans(spans.rbegin(), spans.rend(), match_after_text);
      return {reversed.rbegin(), reversed.rend()};
    }
  }
  return spans;
}

// Replaces every piece by its kept spans, dropping empty ones.
void split_pieces(std::vector<Piece>& pieces, const std::function<std::vector<Span>(std::string_view)>& find,
                  Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    for (const Span& span : apply_behavior(find(piece.text), behavior)) {
      if (span.end == span.begin) continue;
      out.push_back({piece.text.substr(span.begin, span.end - span.begin), piece.at_origin && span.begin == 0});
    }
  }
  pieces = std::move(out);
}

void replace_all(std::string& text, const Regex& regex, std::string_view content) {
  const auto matches = regex.find_all(text);
  if (matches.empty()) return;
  std::string out;
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text, previous, begin - previous);
    out.append(content);
    previous = end;
  }
  out.append(text, previous);
  text = std::move(out);
}

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex regex, std::string content) : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { replace_all(text, regex_, content_); }

 private:
  Regex regex_;
  std::string content_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(
        pieces,
        [this](std::string_view text) {
          std::vector<Span> spans = spans_of(text, regex_.find_all(text));
          if (invert_)
            for (Span& span : spans) span.is_match = !span.is_match;
          return spans;
        },
        behavior_);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenizer regex, which ByteLevel applies when use_regex is set.
const Regex& gpt2_regex() {
  static const Regex regex =
      Regex::pattern(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  return regex;
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& piece : pieces)
        if (!piece.text.empty() && !piece.text.starts_with(' ')) piece.text = " " + piece.text;
    }
    if (use_regex_) {
      split_pieces(
          pieces, [](std::string_view text) { return spans_of(text, gpt2_regex().find_all(text)); },
          Behavior::kIsolated);
    }
    for (Piece& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (const char byte : piece.text) mapped += byte_level_char(static_cast<unsigned char>(byte));
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    static const Regex space = Regex::literal(" ");
    for (Piece& piece : pieces) {
      replace_all(piece.text, space, replacement_);
      const bool prepend = scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_origin);
      if (prepend && !piece.text.empty() && !piece.text.starts_with(replacement_)) piece.text.insert(0, replacement_);
    }
    if (!split_) return;
    split_pieces(
        pieces,
        [this](std::string_view text) {
          std::vector<std::pair<size_t, size_t>> matches;
          for (size_t at = text.find(replacement_); at != std::string_view::npos;
               at = text.find(replacement_, at + replacement_.size()))
            matches.emplace_back(at, at + replacement_.size());
          return spans_of(text, matches);
        },
        Behavior::kMergedWithNext);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

std::unique_ptr<PreTokenizer> parse_metaspace(const json& json_entry) {
  constexpr std::string_view what = "pre_tokenizer Metaspace";
  const std::string replacement = string_field(json_entry, "replacement", what);
  MK_CHECK(!replacement.empty() && !first_invalid_utf8(replacement) &&
               utf8_char_length(replacement, 0) == replacement.size(),
           "{}: replacement must be one character, got \"{}\"", what, replacement);
  PrependScheme scheme = PrependScheme::kAlways;
  if (json_entry.contains("prepend_scheme")) {
    const std::string name = string_field(json_entry, "prepend_scheme", what);
    MK_CHECK(name == "always" || name == "first" || name == "never", "{}: unknown prepend_scheme \"{}\"", what, name);
    scheme = name == "always"  ? PrependScheme::kAlways
             : name == "first" ? PrependScheme::kFirst
                               : PrependScheme::kNever;
  }
  // Files from before prepend_scheme existed say add_prefix_space instead.
  if (!bool_field(json_entry, "add_prefix_space", true, what)) {
    MK_CHECK(scheme == PrependScheme::kNever, "{}: add_prefix_space false does not match prepend_scheme", what);
  }
  return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, bool_field(json_entry, "split", true, what));
}

}  // namespace

Regex parse_pattern(const json& component, std::string_view what) {
  const json& pattern = required_field(component, "pattern", what);
  MK_CHECK(pattern.is_object() && pattern.size() == 1 && (pattern.contains("String") || pattern.contains("Regex")),
           "{}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", what, brief(pattern));
  if (pattern.contains("String")) return Regex::literal(string_field(pattern, "String", what));
  return Regex::pattern(string_field(pattern, "Regex", what));
}

std::unique_ptr<Normalizer> parse_normalizer(const json& json_entry) {
  if (json_entry.is_null()) return nullptr;
  const std::string type = type_of(json_entry, "normalizer");
  const std::string what = "normalizer " + type;
  if (type == "Sequence")
    return std::make_unique<SequenceNormalizer>(parse_steps(json_entry, "normalizers", what, parse_normalizer));
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(string_field(json_entry, "prepend", what));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(parse_pattern(json_entry, what),
                                               string_field(json_entry, "content", what));
  }
  throw Error(fmt::format("normalizer type \"{}\" is not supported (supported: Sequence, Prepend, Replace)", type));
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& json_entry) {
  if (json_entry.is_null()) return nullptr;
  const std::string type = type_of(json_entry, "pre_tokenizer");
  const std::string what = "pre_tokenizer " + type;
  if (type == "Sequence")
    return std::make_unique<SequencePreTokenizer>(parse_steps(json_entry, "pretokenizers", what, parse_pre_tokenizer));
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(parse_pattern(json_entry, what), parse_behavior(json_entry, what),
                                               bool_field(json_entry, "invert", false, what));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(bool_field(json_entry, "add_prefix_space", true, what),
                                                   bool_field(json_entry, "use_regex", true, what));
  }
  if (type == "Metaspace") return parse_metaspace(json_entry);
  throw Error(fmt::format(
      "pre_tokenizer type \"{}\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace)", type));
}

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for U+0100 onwards in order.
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::array<int, 512> bytes{};
  ByteLevelTables() {
    bytes.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t code_point = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(chars[b], code_point);
      bytes[code_point] = b;
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::string& byte_level_char(unsigned char byte) { return byte_level_tables().chars[byte]; }

int byte_level_byte(char32_t code_point) { return code_point < 512 ? byte_level_tables().bytes[code_point] : -1; }

}  // namespace mk::text
