// Text <-> token ids from a Hugging Face tokenizer.json: byte-level BPE (Llama 3, GPT-2) and SentencePiece-style BPE
// with byte fallback (Llama 2, TinyLlama, Mistral), with ids identical to the `tokenizers` library's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

namespace text {
struct TokenizerImpl;
}

// A token added on top of the BPE vocabulary (tokenizer.json's "added_tokens"): split out of the text before the
// model sees it.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // skipped by decode(skip_special_tokens = true)
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool single_word = false;  // matches only where no word character touches it
  bool normalized = false;   // matched in the normalized text (its content normalized too), not the raw text
};

struct EncodeOptions {
  // Add what the post-processor adds (Llama: BOS), or what tokenizer_config.json's add_bos_token/add_eos_token ask.
  bool add_special_tokens = true;
  // Tokenize the text of special tokens (say "<|eot_id|>" typed by a user) as plain text instead of as the token:
  // `tokenizers`' encode_special_tokens, transformers' split_special_tokens.
  bool split_special_tokens = false;
};

class Tokenizer;

// Decodes ids one at a time, emitting only complete UTF-8 characters: a token that ends inside a character yields
// "" until a later token completes it. The pieces joined, plus finish(), equal Tokenizer::decode of all ids whenever
// that decode ends in no U+FFFD (always, for ids that encode() produced); the window it re-decodes stays a few
// tokens long, so each push() costs O(1) in the length of the stream. It refers to its Tokenizer, which must
// outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // The text that this id completes (possibly ""). Throws mk::Error for an id outside the vocabulary.
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character comes out as U+FFFD, as in decode()); then starts afresh.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> context_;  // the ids of the last emitted piece: they give the next piece its leading space
  std::vector<int32_t> pending_;  // ids since then
  std::string context_text_;      // decode(context_)
};

class Tokenizer {
 public:
  // path: a tokenizer.json, or a model directory holding one. BOS/EOS come from tokenizer_config.json,
  // generation_config.json and config.json beside it where present. Throws mk::Error naming the file and the
  // problem for a missing or malformed file and for any component not in the list at the end of this header.
  static Tokenizer load(const std::filesystem::path& path);
  // The same from the text of a tokenizer.json alone (no config files); origin names it in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& origin = "tokenizer.json");
  // Whether a model directory has a tokenizer.json to load (any entry of that name, mk/files.h's has_entry: a dangling
  // link is loaded and refused by name): the one rule by which the Python Model loads a tokenizer and `mk generate`
  // reads one for the default EOS ids.
  static bool in_model_dir(const std::filesystem::path& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // text must be valid UTF-8: invalid input throws mk::Error naming the byte offset and the byte (no silent
  // U+FFFD replacement: a corrupt prompt should be noticed, not tokenized). replace_invalid_utf8() below gives
  // Python's errors="replace" behaviour to callers who want it.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Ids to text as `tokenizers` decodes them (the decoder chain of tokenizer.json; invalid byte sequences become
  // U+FFFD). Throws mk::Error for an id outside the vocabulary (`tokenizers` drops those silently).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  StreamDecoder stream_decoder(bool skip_special_tokens = false) const {
    return StreamDecoder(*this, skip_special_tokens);
  }

  // One more than the largest id, model vocabulary and added tokens together.
  int64_t vocab_size() const;
  // The Unicode version of the regex character classes (the system PCRE2's), say "14.0.0".
  static std::string unicode_version();
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  bool is_special(int32_t id) const;
  // The BOS id (tokenizer_config.json's bos_token, else generation_config.json's or config.json's bos_token_id).
  std::optional<int32_t> bos_id() const;
  // The ids that end generation (generation_config.json's eos_token_id, else tokenizer_config.json's eos_token,
  // else config.json's eos_token_id); empty when none of those files says.
  const std::vector<int32_t>& eos_ids() const;
  // Where eos_ids() came from, as "DIR/tokenizer_config.json: eos_token \"</s>\"" (or a config's eos_token_id), for
  // messages: they lie in the tokenizer's vocabulary, which may be larger than a model's. Empty when eos_ids() is.
  const std::string& eos_source() const;

 private:
  explicit Tokenizer(std::unique_ptr<text::TokenizerImpl> impl);
  std::unique_ptr<text::TokenizerImpl> impl_;
};

// text with every ill-formed UTF-8 subsequence replaced by U+FFFD, one per maximal subpart (the Unicode
// recommendation, as Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy).
std::string replace_invalid_utf8(std::string_view text);

}  // namespace mk

// Supported tokenizer.json components (anything else is refused with an mk::Error that names it):
//   model          BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk, byte_fallback,
//                  ignore_merges, continuing_subword_prefix, end_of_word_suffix; dropout must be null or 0)
//   normalizer     Sequence, Prepend, Replace (String or Regex pattern)
//   pre_tokenizer  Sequence, Split (String or Regex; all five behaviors; invert), ByteLevel (add_prefix_space,
//                  use_regex), Metaspace (prepend_scheme always/first/never, split)
//   post_processor Sequence, TemplateProcessing (the single-sequence template), ByteLevel, BertProcessing,
//                  RobertaProcessing
//   decoder        Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace
// Regex patterns in tokenizer.json are Oniguruma's; they run on PCRE2 here (UTF + UCP), with \s, \S, \w and \W
// rewritten to the Unicode properties Oniguruma gives them. Unicode classes follow the system PCRE2's Unicode version
// (PCRE2 10.42: Unicode 14); characters assigned later (say CJK Extension H) may split differently from `tokenizers`.
