// mk::Tokenizer: loading tokenizer.json and its config files, encode (added tokens, normalizer, pre-tokenizer,
// BPE, special ids) and decode, and the streaming decoder.
#include "mk/tokenizer.h"

#include <tuple>

#include "added.h"
#include "bpe.h"
#include "decode.h"
#include "json_fields.h"
#include "mk/check.h"
#include "mk/files.h"
#include "pretokenize.h"
#include "special.h"
#include "utf8.h"

namespace mk::text {

struct TokenizerImpl {
  BpeModel model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;
  Affixes affixes;
  SpecialIds special_ids;
  int64_t vocab_size = 0;

  std::optional<int32_t> token_to_id(std::string_view token) const {
    for (const AddedToken& added_token : added.tokens())
      if (added_token.content == token) return added_token.id;
    return model.token_to_id(token);
  }
};

namespace {

using nlohmann::json;

// NOTE: through mk::read_file, which opens without blocking and refuses anything but a regular file, so that a FIFO
// or /dev/zero swapped in after the checks below cannot hang the load; the cap is far above real tokenizers (~10 MB).
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(256) << 20;

std::string read_file(const std::filesystem::path& path) { return mk::read_file(path, kMaxTokenizerFileBytes); }

json parse_json(std::string_view text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& error) {
    throw Error(fmt::format("{} is not valid JSON: {}", origin, error.what()));
  }
}

// tokenizer.json's "added_tokens". The ids come out as `tokenizers` assigns them on loading (it ignores the file's):
// the model's id where the content is in the vocabulary, else the next one from the vocabulary's size on.
std::vector<AddedToken> parse_added_tokens(const json& list, const BpeModel& model) {
  std::vector<AddedToken> tokens;
  if (list.is_null()) return tokens;
  MK_CHECK(list.is_array(), "\"added_tokens\" must be a list");
  auto next_id = static_cast<int32_t>(model.size());
  for (const json& entry : list) {
    const std::string content = string_field(entry, "content", "added_tokens entry");
    if (content.empty()) continue;
    MK_CHECK(!first_invalid_utf8(content), "added token \"{}\" is not valid UTF-8", content);
    const std::string what = fmt::format("added token \"{}\"", content);
    AddedToken token;
    token.content = content;
    token.special = bool_field(entry, "special", false, what);
    token.lstrip = bool_field(entry, "lstrip", false, what);
    token.rstrip = bool_field(entry, "rstrip", false, what);
    token.single_word = bool_field(entry, "single_word", false, what);
    token.normalized = bool_field(entry, "normalized", !token.special, what);
    const auto same =
        std::find_if(tokens.begin(), tokens.end(), [&](const AddedToken& t) { return t.content == content; });
    if (same != tokens.end()) {
      token.id = same->id;
      *same = token;
      continue;
    }
    const auto model_id = model.token_to_id(content);
    token.id = model_id ? *model_id : next_id++;
    tokens.push_back(token);
  }
  return tokens;
}

std::unique_ptr<TokenizerImpl> build(const json& root, const ConfigFiles& files) {
  MK_CHECK(root.is_object(), "the top level must be an object");
  if (root.contains("version")) {
    MK_CHECK(root["version"] == "1.0", "unknown tokenizer.json version {}", brief(root["version"]));
  }
  MK_CHECK(root.contains("model"), "no \"model\": this is not a tokenizer.json of the `tokenizers` library");
  auto impl = std::make_unique<TokenizerImpl>();
  impl->model = BpeModel::from_json(root["model"]);
  impl->normalizer = parse_normalizer(root.value("normalizer", json()));
  impl->pre_tokenizer = parse_pre_tokenizer(root.value("pre_tokenizer", json()));
  impl->decoder = parse_decoder(root.value("decoder", json()));
  impl->affixes = parse_post_processor(root.value("post_processor", json()));
  impl->added =
      AddedVocabulary(parse_added_tokens(root.value("added_tokens", json()), impl->model), impl->normalizer.get());
  impl->vocab_size = impl->model.id_bound();
  for (const AddedToken& token : impl->added.tokens())
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, int64_t{token.id} + 1);
  impl->special_ids = resolve_special_ids(
      files, [&](std::string_view token) { return impl->token_to_id(token); }, impl->affixes);
  // Named by where they came from: tokenizer_config.json's tokens are looked up in the vocabulary, so an affix
  // outside it is the post-processor's, and an EOS id a config file's.
  for (const auto& ids : {impl->affixes.prefix, impl->affixes.suffix}) {
    for (const int32_t id : ids) {
      MK_CHECK(id < impl->vocab_size, "post_processor: special id {} is outside the vocabulary [0, {})", id,
               impl->vocab_size);
    }
  }
  for (const int32_t id : impl->special_ids.eos) {
    MK_CHECK(id < impl->vocab_size, "EOS id {} (from {}) is outside the tokenizer's vocabulary [0, {})", id,
             impl->special_ids.eos_source, impl->vocab_size);
  }
  return impl;
}

// Builds from parsed JSON; every error, ours or the JSON library's, comes out as mk::Error naming origin.
std::unique_ptr<TokenizerImpl> build_named(const json& root, const ConfigFiles& files, const std::string& origin) {
  try {
    return build(root, files);
  } catch (const Error& error) {
    throw Error(fmt::format("{}: {}", origin, error.what()));
  } catch (const json::exception& error) {
    throw Error(fmt::format("{}: malformed entry: {}", origin, error.what()));
  }
}

std::string describe_invalid_utf8(std::string_view text, size_t offset) {
  std::string bytes;
  for (size_t i = offset; i < text.size() && i < offset + 4; ++i)
    bytes += fmt::format("{}{:02X}", bytes.empty() ? "" : " ", static_cast<unsigned char>(text[i]));
  return fmt::format("text is not valid UTF-8 at byte offset {} (bytes {}{})", offset, bytes,
                     offset + 4 < text.size() ? " ..." : "");
}

}  // namespace

}  // namespace mk::text

namespace mk {

using text::TokenizerImpl;

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  return Tokenizer(text::build_named(text::parse_json(json_text, origin), {}, origin));
}

bool Tokenizer::in_model_dir(const std::filesystem::path& dir) {
  // Any entry (has_entry): a dangling link is loaded and named, where "no tokenizer" would run without its EOS.
  return has_entry(dir / "tokenizer.json");
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) {
    file = path / "tokenizer.json";
    MK_CHECK(has_entry(file) || !has_entry(path / "tokenizer.model"),
             "{} has tokenizer.model (SentencePiece's own format) but no tokenizer.json; write one with transformers: "
             "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)",
             path.string());
  }
  MK_CHECK(has_entry(file), "no tokenizer.json at {}", file.string());
  text::ConfigFiles files;
  const std::filesystem::path dir = file.parent_path();
  files.dir = dir;
  // By the rules of model_eos_ids' reading of the same files (mk/files.h), so that one file gets one verdict.
  const std::tuple<const char*, nlohmann::json*, uint64_t> configs[] = {
      {"tokenizer_config.json", &files.tokenizer_config, kMaxTokenizerConfigJsonBytes},
      {"generation_config.json", &files.generation_config, kMaxConfigJsonBytes},
      {"config.json", &files.model_config, kMaxConfigJsonBytes}};
  for (const auto& [name, slot, cap] : configs)
    if (std::optional<nlohmann::json> config = read_config_json_if_present(dir / name, cap)) *slot = std::move(*config);
  return Tokenizer(text::build_named(text::parse_json(text::read_file(file), file.string()), files, file.string()));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  if (const auto offset = text::first_invalid_utf8(text)) throw Error(text::describe_invalid_utf8(text, *offset));
  std::vector<int32_t> ids;
  if (options.add_special_tokens) ids = impl_->affixes.prefix;
  for (text::Segment& segment : impl_->added.split(text, impl_->normalizer.get(), options.split_special_tokens)) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    std::vector<text::Piece> pieces{std::move(segment.piece)};
    if (impl_->pre_tokenizer) impl_->pre_tokenizer->pre_tokenize(pieces);
    for (const text::Piece& piece : pieces) impl_->model.tokenize(piece.text, ids);
  }
  if (options.add_special_tokens) ids.insert(ids.end(), impl_->affixes.suffix.begin(), impl_->affixes.suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* token = impl_->added.decode_form(id);
    if (token == nullptr) token = impl_->model.id_to_token(id);
    MK_CHECK(token != nullptr, "token id {} is not in the vocabulary (ids 0..{})", id, impl_->vocab_size - 1);
    if (skip_special_tokens && impl_->added.is_special_content(*token)) continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (!impl_->decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i == 0 ? "" : " ") + tokens[i];
    return out;
  }
  impl_->decoder->decode_chain(tokens);
  for (const std::string& token : tokens) out += token;
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = impl_->added.find_id(id)) return added->content;
  if (const std::string* token = impl_->model.id_to_token(id)) return *token;
  return std::nullopt;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added.tokens(); }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = impl_->added.find_id(id);
  return added != nullptr && added->special;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->special_ids.bos; }

const std::vector<int32_t>& Tokenizer::eos_ids() const { return impl_->special_ids.eos; }

const std::string& Tokenizer::eos_source() const { return impl_->special_ids.eos_source; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  MK_CHECK(tokenizer_->id_to_token(id).has_value(), "token id {} is not in the vocabulary (ids 0..{})", id,
           tokenizer_->vocab_size() - 1);
  pending_.push_back(id);
  std::vector<int32_t> window = context_;
  window.insert(window.end(), pending_.begin(), pending_.end());
  const std::string text = tokenizer_->decode(window, skip_special_);
  // Hold back while the text ends inside a character (decoded as U+FFFD for now) or has not grown past the context.
  if (text.size() <= context_text_.size() || !text.starts_with(context_text_) ||
      text.ends_with(text::kReplacementCharacter))
    return "";
  std::string piece = text.substr(context_text_.size());
  context_ = std::move(pending_);
  pending_.clear();
  context_text_ = tokenizer_->decode(context_, skip_special_);
  return piece;
}

std::string StreamDecoder::finish() {
  std::vector<int32_t> window = context_;
  window.insert(window.end(), pending_.begin(), pending_.end());
  const std::string text = tokenizer_->decode(window, skip_special_);
  std::string rest =
      text.starts_with(context_text_) ? text.substr(context_text_.size()) : tokenizer_->decode(pending_, skip_special_);
  context_.clear();
  pending_.clear();
  context_text_.clear();
  return rest;
}

}  // namespace mk
