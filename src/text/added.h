// Added tokens of tokenizer.json: found in the text and split out before normalization and BPE, as `tokenizers`'
// AddedVocabulary does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "mk/tokenizer.h"
#include "pretokenize.h"

namespace mk::text {

// A stretch of text for the model, or one added token (added_id >= 0, text its matched span).
struct Segment {
  Piece piece;
  int32_t added_id = -1;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // normalizer (may be null) gives normalized tokens the form they are matched in.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // The text cut at added tokens: first those matched in the raw text (normalized = false), then, in each
  // normalized stretch between them, those matched in normalized text. Stretches come back normalized.
  std::vector<Segment> split(std::string_view text, const Normalizer* normalizer, bool split_special) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int32_t id) const;
  // The string that decoding starts from: the content, normalized for normalized tokens (so that the decoder
  // inverts the normalizer, as in `tokenizers`); nullptr for an id that is not an added token.
  const std::string* decode_form(int32_t id) const;
  bool is_special_content(std::string_view content) const;

 private:
  // Leftmost-longest matching, as the Aho-Corasick automaton of `tokenizers`: patterns by first byte, longest first.
  struct Matcher {
    using Patterns = std::vector<std::pair<std::string, size_t>>;  // pattern, index into tokens_
    std::vector<Patterns> by_first_byte = std::vector<Patterns>(256);
    bool empty = true;
    void add(std::string pattern, size_t token_index);
    // The longest pattern matching at offset, or nullptr.
    const std::pair<std::string, size_t>* match_at(std::string_view text, size_t offset) const;
  };
  std::vector<Segment> find_matches(std::string_view text, bool at_origin, const Matcher& matcher,
                                    bool split_special) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> decode_forms_;  // by index into tokens_
  std::vector<int32_t> index_by_id_;       // id -> index into tokens_, -1 for none
  std::unordered_set<std::string> special_contents_;
  Matcher raw_, normalized_;
};

}  // namespace mk::text
