// The BPE model of tokenizer.json: vocabulary, ranked merges, byte fallback and unknown-token handling.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mk::text {

// Hash for string keys looked up by string_view without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // model: tokenizer.json's "model". Throws mk::Error for another model type, a malformed vocabulary, or merges
  // naming tokens that are not in the vocabulary.
  static BpeModel from_json(const nlohmann::json& model);

  // Appends the ids of one pre-token, merging lowest rank first and leftmost among equal ranks, as `tokenizers`.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr for an id that no token has.
  const std::string* id_to_token(int32_t id) const;
  // The number of tokens (`tokenizers`' get_vocab_size, where added tokens start).
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  // One more than the largest id.
  int64_t id_bound() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank = 0;
    int32_t new_id = 0;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;

  TokenMap vocab_;
  std::vector<std::string> tokens_;  // by id; "" where no token has the id
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::string unk_token_;  // "" when the model has none: unknown characters are then dropped
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<std::optional<int32_t>, 256> byte_ids_;  // <0xNN> tokens, for byte fallback
};

}  // namespace mk::text
