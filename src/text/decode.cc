// Decoders (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace) with `tokenizers`' semantics,
// including how each treats bytes that do not form UTF-8 (U+FFFD) and tokens it does not recognise.
#include "decode.h"

#include <charconv>

#include "json_fields.h"
#include "mk/tokenizer.h"
#include "pretokenize.h"
#include "regex.h"
#include "utf8.h"

namespace mk::text {

namespace {

using nlohmann::json;

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Characters back to the bytes they stand for, all tokens into one string; a token with a character outside the
// byte alphabet (an added token, say) contributes its UTF-8 as it is.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      std::string mapped;
      bool all_mapped = true;
      for (size_t i = 0; i < token.size() && all_mapped; i += utf8_char_length(token, i)) {
        const int byte = byte_level_byte(code_point_at(token, i));
        all_mapped = byte >= 0;
        mapped += static_cast<char>(byte);
      }
      bytes += all_mapped ? mapped : token;
    }
    tokens.assign(1, replace_invalid_utf8(bytes));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex regex, std::string content) : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::string out;
      size_t previous = 0;
      for (const auto& [begin, end] : regex_.find_all(token)) {
        out.append(token, previous, begin - previous);
        out += content_;
        previous = end;
      }
      out.append(token, previous);
      token = std::move(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

// Runs of <0xNN> tokens become the text they spell; a run that is not valid UTF-8 becomes one U+FFFD per token.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    const auto flush = [&] {
      if (run_tokens == 0) return;
      if (!first_invalid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementCharacter);
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& token : tokens) {
      if (const auto byte = byte_token(token)) {
        run += static_cast<char>(*byte);
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  // "<0xNN>" as Rust's u8::from_str_radix reads NN (which also takes a leading '+').
  static std::optional<unsigned> byte_token(const std::string& token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
    std::string_view digits(token.data() + 3, 2);
    if (digits.front() == '+') digits.remove_prefix(1);
    unsigned value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
    if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return value;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

// Up to start leading and stop trailing copies of one character, removed from every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t n = 0; n < start_ && begin < end && token.compare(begin, content_.size(), content_) == 0; ++n)
        begin += content_.size();
      for (size_t n = 0; n < stop_ && end - begin >= content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++n)
        end -= content_.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// The replacement character back to spaces; in the first token, unless prepend_scheme is "never", it is dropped.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          if (i != 0 || !drop_in_first_) out += ' ';
          at += replacement_.size();
        } else {
          const size_t length = utf8_char_length(token, at);
          out.append(token, at, length);
          at += length;
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool drop_in_first_;
};

size_t count_field(const json& json_entry, const char* key, std::string_view what) {
  const json& value = required_field(json_entry, key, what);
  MK_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
           "{}: \"{}\" must be a non-negative integer, got {}", what, key, brief(value));
  return value.get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& json_entry) {
  if (json_entry.is_null()) return nullptr;
  const std::string type = type_of(json_entry, "decoder");
  const std::string what = "decoder " + type;
  if (type == "Sequence")
    return std::make_unique<SequenceDecoder>(parse_steps(json_entry, "decoders", what, parse_decoder));
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(parse_pattern(json_entry, what), string_field(json_entry, "content", what));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = string_field(json_entry, "content", what);
    MK_CHECK(!content.empty() && !first_invalid_utf8(content) && utf8_char_length(content, 0) == content.size(),
             "{}: content must be one character, got \"{}\"", what, content);
    return std::make_unique<StripDecoder>(content, count_field(json_entry, "start", what),
                                          count_field(json_entry, "stop", what));
  }
  if (type == "Metaspace") {
    const std::string scheme = json_entry.contains("prepend_scheme") ? string_field(json_entry, "prepend_scheme", what)
                                                                     : std::string("always");
    const bool add_prefix_space = bool_field(json_entry, "add_prefix_space", true, what);
    return std::make_unique<MetaspaceDecoder>(string_field(json_entry, "replacement", what),
                                              scheme != "never" && add_prefix_space);
  }
  throw Error(
      fmt::format("decoder type \"{}\" is not supported (supported: Sequence, ByteLevel, Replace, "
                  "ByteFallback, Fuse, Strip, Metaspace)",
                  type));
}

}  // namespace mk::text
