// Splitting text at added tokens: leftmost-longest matches, then single_word, lstrip and rstrip as `tokenizers`
// applies them (whitespace and word characters by Rust's Unicode definitions).
#include "added.h"

#include <algorithm>

#include "regex.h"
#include "utf8.h"

namespace mk::text {

namespace {

bool ends_with_word(std::string_view text) {
  return !text.empty() && is_word_character(code_point_at(text, previous_char_start(text, text.size())));
}

bool starts_with_word(std::string_view text) { return !text.empty() && is_word_character(code_point_at(text, 0)); }

// Where the whitespace that ends text begins.
size_t trailing_space_start(std::string_view text) {
  size_t start = text.size();
  while (start > 0) {
    const size_t previous = previous_char_start(text, start);
    if (!is_white_space(code_point_at(text, previous))) break;
    start = previous;
  }
  return start;
}

size_t leading_space_length(std::string_view text) {
  size_t length = 0;
  while (length < text.size() && is_white_space(code_point_at(text, length))) length += utf8_char_length(text, length);
  return length;
}

}  // namespace

void AddedVocabulary::Matcher::add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;
  Patterns& patterns = by_first_byte[static_cast<unsigned char>(pattern[0])];
  patterns.emplace_back(std::move(pattern), token_index);
  std::stable_sort(patterns.begin(), patterns.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  empty = false;
}

const std::pair<std::string, size_t>* AddedVocabulary::Matcher::match_at(std::string_view text, size_t offset) const {
  for (const auto& entry : by_first_byte[static_cast<unsigned char>(text[offset])])
    if (text.substr(offset).starts_with(entry.first)) return &entry;
  return nullptr;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    if (static_cast<size_t>(token.id) >= index_by_id_.size()) index_by_id_.resize(token.id + 1, -1);
    index_by_id_[token.id] = static_cast<int32_t>(i);
    if (token.special) special_contents_.insert(token.content);
    decode_forms_.push_back(token.content);
    if (token.normalized) {
      if (normalizer != nullptr) normalizer->normalize(decode_forms_.back());
      normalized_.add(decode_forms_.back(), i);
    } else {
      raw_.add(token.content, i);
    }
  }
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= index_by_id_.size() || index_by_id_[id] < 0) return nullptr;
  return &tokens_[index_by_id_[id]];
}

const std::string* AddedVocabulary::decode_form(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= index_by_id_.size() || index_by_id_[id] < 0) return nullptr;
  return &decode_forms_[index_by_id_[id]];
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  return special_contents_.contains(std::string(content));
}

std::vector<Segment> AddedVocabulary::find_matches(std::string_view text, bool at_origin, const Matcher& matcher,
                                                   bool split_special) const {
  std::vector<Segment> out;
  const auto push_text = [&](size_t begin, size_t end) {
    if (end > begin) out.push_back({{std::string(text.substr(begin, end - begin)), at_origin && begin == 0}, -1});
  };
  if (matcher.empty) {
    push_text(0, text.size());
    return out;
  }
  size_t done = 0;  // text before this offset is in out
  for (size_t search = 0; search < text.size();) {
    const std::pair<std::string, size_t>* found = matcher.match_at(text, search);
    if (found == nullptr) {
      ++search;
      continue;
    }
    size_t start = search, stop = search + found->first.size();
    search = stop;
    const AddedToken& token = tokens_[found->second];
    if (split_special && token.special) continue;
    if (token.single_word && ((start > 0 && ends_with_word(text.substr(0, start))) ||
                              (stop < text.size() && starts_with_word(text.substr(stop)))))
      continue;
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), done);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (done < start) push_text(done, start);
    out.push_back({{std::string(text.substr(start, stop - start)), at_origin && start == 0}, token.id});
    done = stop;
  }
  push_text(done, text.size());
  return out;
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, const Normalizer* normalizer,
                                            bool split_special) const {
  std::vector<Segment> out;
  for (Segment& segment : find_matches(text, true, raw_, split_special)) {
    if (segment.added_id >= 0) {
      out.push_back(std::move(segment));
      continue;
    }
    if (normalizer != nullptr) normalizer->normalize(segment.piece.text);
    for (Segment& part : find_matches(segment.piece.text, segment.piece.at_origin, normalized_, split_special))
      out.push_back(std::move(part));
  }
  return out;
}

}  // namespace mk::text
