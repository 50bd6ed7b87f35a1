// BPE as `tokenizers` runs it: characters (or their bytes, or <unk>) as symbols, then the lowest-ranked adjacent
// pair merged first, leftmost first among equal ranks, until no pair has a merge.
#include "bpe.h"

#include <queue>

#include "json_fields.h"
#include "utf8.h"

namespace mk::text {

namespace {

using nlohmann::json;

constexpr int64_t kMaxTokenId = int64_t{1} << 26;

// One entry of "merges": "a b" (the older format) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& entry, size_t index) {
  if (entry.is_array()) {
    MK_CHECK(entry.size() == 2 && entry[0].is_string() && entry[1].is_string(),
             "model: merges entry {} must be a pair of tokens, got {}", index, brief(entry));
    return {entry[0].get<std::string>(), entry[1].get<std::string>()};
  }
  MK_CHECK(entry.is_string(), "model: merges entry {} must be \"a b\" or [\"a\", \"b\"], got {}", index, brief(entry));
  const std::string text = entry.get<std::string>();
  const size_t space = text.find(' ');
  MK_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
           "model: merges entry {} (\"{}\") must be two tokens separated by one space", index, text);
  return {text.substr(0, space), text.substr(space + 1)};
}

}  // namespace

BpeModel BpeModel::from_json(const json& model) {
  MK_CHECK(model.is_object(), "tokenizer.json has no \"model\" object");
  if (model.contains("type")) {
    const std::string type = string_field(model, "type", "model");
    MK_CHECK(type == "BPE", "model type \"{}\" is not supported (only BPE: Llama, Mistral and GPT-2 tokenizers)", type);
  } else {
    MK_CHECK(model.contains("merges"), "model has no \"type\" and no \"merges\": only BPE models are supported");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    MK_CHECK(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0,
             "model: BPE dropout {} is not supported (it makes tokenization random; use null)",
             brief(model["dropout"]));
  }
  BpeModel bpe;
  const json& vocab = required_field(model, "vocab", "model");
  MK_CHECK(vocab.is_object(), "model: \"vocab\" must be an object of token: id");
  for (const auto& [token, id_json] : vocab.items()) {
    MK_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < kMaxTokenId,
             "model: vocab id of \"{}\" must be an integer in [0, {}), got {}", token, kMaxTokenId, brief(id_json));
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (static_cast<size_t>(id) >= bpe.tokens_.size()) {
      bpe.tokens_.resize(id + 1);
      bpe.has_token_.resize(id + 1, false);
    }
    MK_CHECK(!bpe.has_token_[id], "model: vocab id {} is given to both \"{}\" and \"{}\"", id, bpe.tokens_[id], token);
    bpe.tokens_[id] = token;
    bpe.has_token_[id] = true;
    bpe.vocab_.emplace(token, id);
  }
  const auto optional_string = [&](const char* key) {
    return model.contains(key) && !model[key].is_null() ? string_field(model, key, "model") : std::string();
  };
  bpe.unk_token_ = optional_string("unk_token");
  if (auto it = bpe.vocab_.find(bpe.unk_token_); !bpe.unk_token_.empty() && it != bpe.vocab_.end())
    bpe.unk_id_ = it->second;
  bpe.continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  bpe.end_of_word_suffix_ = optional_string("end_of_word_suffix");
  bpe.fuse_unk_ = bool_field(model, "fuse_unk", false, "model");
  bpe.byte_fallback_ = bool_field(model, "byte_fallback", false, "model");
  bpe.ignore_merges_ = bool_field(model, "ignore_merges", false, "model");
  for (int b = 0; b < 256; ++b) bpe.byte_ids_[b] = bpe.token_to_id(fmt::format("<0x{:02X}>", b));

  const json& merges = required_field(model, "merges", "model");
  MK_CHECK(merges.is_array(), "model: \"merges\" must be a list");
  int32_t rank = 0;
  for (size_t index = 0; index < merges.size(); ++index) {
    if (merges[index].is_string() && merges[index].get_ref<const std::string&>().starts_with("#version")) continue;
    const auto [left, right] = parse_merge(merges[index], index);
    const auto id_of = [&](const std::string& token) {
      const auto id = bpe.token_to_id(token);
      MK_CHECK(id.has_value(), "model: merges entry {} (\"{}\" \"{}\") needs \"{}\", which is not in the vocabulary",
               index, left, right, token);
      return *id;
    };
    // The right part of a merge continues a word, so it carries the prefix, which the merged token drops.
    const size_t prefix = bpe.continuing_subword_prefix_.size();
    MK_CHECK(right.starts_with(bpe.continuing_subword_prefix_),
             "model: merges entry {}: \"{}\" does not start with continuing_subword_prefix \"{}\"", index, right,
             bpe.continuing_subword_prefix_);
    const int32_t left_id = id_of(left), right_id = id_of(right);
    // A pair listed twice keeps its later rank, as `tokenizers`' map does.
    bpe.merges_[pair_key(left_id, right_id)] = Merge{rank++, id_of(left + right.substr(prefix))};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  initial_symbols(word, symbols);
  merge(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  std::optional<int32_t> pending_unk;
  std::string decorated;
  for (size_t i = 0; i < word.size();) {
    const size_t length = utf8_char_length(word, i);
    std::string_view piece = word.substr(i, length);
    const bool first = i == 0;
    i += length;
    const bool last = i == word.size();
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      decorated = (first ? "" : continuing_subword_prefix_) + std::string(piece) + (last ? end_of_word_suffix_ : "");
      piece = decorated;
    }
    if (const auto id = token_to_id(piece)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char byte : piece) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(byte)].has_value();
      if (all_bytes) {
        for (const char byte : piece) symbols.push_back(*byte_ids_[static_cast<unsigned char>(byte)]);
        continue;
      }
    }
    if (unk_token_.empty()) continue;  // `tokenizers` drops what it cannot represent when there is no unk_token
    MK_CHECK(unk_id_.has_value(),
             "model: text has a character outside the vocabulary and unk_token \"{}\" is not in "
             "the vocabulary",
             unk_token_);
    if (pending_unk && fuse_unk_) continue;
    if (pending_unk) symbols.push_back(*pending_unk);
    pending_unk = unk_id_;
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

void BpeModel::merge(std::vector<int32_t>& symbols) const {
  const auto count = static_cast<int32_t>(symbols.size());
  if (count < 2 || merges_.empty()) return;
  std::vector<int32_t> previous(count), next(count);
  std::vector<bool> alive(count, true);
  for (int32_t i = 0; i < count; ++i) {
    previous[i] = i - 1;
    next[i] = i + 1;
  }
  struct Candidate {
    int32_t rank, pos, new_id;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto push_pair = [&](int32_t pos) {
    if (next[pos] >= count) return;
    const auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < count; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    // Entries go stale when a neighbour merged since they were queued.
    if (!alive[top.pos] || next[top.pos] >= count) continue;
    const int32_t right = next[top.pos];
    const auto it = merges_.find(pair_key(symbols[top.pos], symbols[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    symbols[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] < count) previous[next[right]] = top.pos;
    if (previous[top.pos] >= 0) push_pair(previous[top.pos]);
    push_pair(top.pos);
  }
  size_t kept = 0;
  for (int32_t i = 0; i < count; ++i)
    if (alive[i]) symbols[kept++] = symbols[i];
  symbols.resize(kept);
}

}  // namespace mk::text
