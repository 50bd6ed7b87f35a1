// Tokenizer units: invalid UTF-8, bad tokenizer.json files, config-file BOS/EOS, and small hand-made tokenizers
// whose expected ids were checked against Hugging Face `tokenizers`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "mk/tokenizer.h"
#include "test_util.h"

namespace {

using mk::testing_util::error_of;
using mk::testing_util::TempDir;
using nlohmann::json;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

const std::filesystem::path kFixtures = MK_TOKENIZER_FIXTURES;

// A minimal tokenizer.json around a BPE model; the other components are null unless given.
json tiny(json model_overrides = json::object()) {
  json model = {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"fuse_unk", true},
                {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}, {"▁", 4}, {"▁ab", 5}}},
                {"merges", {"a b", "▁ ab"}}};
  model.update(model_overrides);
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model", model}};
}

mk::Tokenizer from(const json& tokenizer_json) { return mk::Tokenizer::from_json(tokenizer_json.dump()); }

void write(const std::filesystem::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(TokenizerUtf8, InvalidInputIsAnErrorNamingTheOffset) {
  const mk::Tokenizer tokenizer = mk::Tokenizer::load(kFixtures / "llama3");
  EXPECT_THAT(error_of([&] { tokenizer.encode("ab\xC3(cd"); }), HasSubstr("byte offset 2 (bytes C3 28 63 64)"));
  EXPECT_THAT(error_of([&] { tokenizer.encode("x\xE2\x82"); }), HasSubstr("byte offset 1"));         // truncated
  EXPECT_THAT(error_of([&] { tokenizer.encode("\xC0\x80"); }), HasSubstr("byte offset 0"));          // overlong
  EXPECT_THAT(error_of([&] { tokenizer.encode("a\xED\xA0\x80"); }), HasSubstr("byte offset 1"));     // surrogate
  EXPECT_THAT(error_of([&] { tokenizer.encode("\xF4\x90\x80\x80"); }), HasSubstr("byte offset 0"));  // > U+10FFFF
  EXPECT_THAT(error_of([&] {
                tokenizer.encode(
                    "\xFF"
                    "abcdef");
              }),
              HasSubstr("(bytes FF 61 62 63 ...)"));
  EXPECT_NO_THROW(tokenizer.encode(std::string("nul \0 inside", 12)));
}

// As Python's bytes.decode("utf-8", errors="replace"): one U+FFFD per maximal ill-formed subpart.
TEST(TokenizerUtf8, ReplaceInvalidLikePython) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(mk::replace_invalid_utf8("a\xC3(b"), "a" + r + "(b");
  EXPECT_EQ(mk::replace_invalid_utf8("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(mk::replace_invalid_utf8("\xE2\x82"), r);
  EXPECT_EQ(mk::replace_invalid_utf8("\xF0\x9F\x98!"), r + "!");
  EXPECT_EQ(mk::replace_invalid_utf8("\xC0\x80"), r + r);
  EXPECT_EQ(mk::replace_invalid_utf8("ok \xE4\xB8\xAD"), "ok \xE4\xB8\xAD");
}

TEST(TokenizerFiles, MissingOrNotATokenizer) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr("no tokenizer.json at"));
  write(dir.path() / "tokenizer.model", "sentencepiece");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr("tokenizer.model"));
  write(dir.path() / "tokenizer.json", "{\"model\": ");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr("is not valid JSON"));
  write(dir.path() / "tokenizer.json", "[1, 2]");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr("top level must be an object"));
  write(dir.path() / "tokenizer.json", "{\"version\": \"1.0\"}");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr("no \"model\""));
  write(dir.path() / "tokenizer.json", tiny().dump());
  write(dir.path() / "generation_config.json", "{oops");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }),
              HasSubstr("generation_config.json: not valid JSON"));
}

// Each malformed or unsupported part is named in the error, never a crash.
TEST(TokenizerFiles, BadOrUnsupportedComponents) {
  const auto error_with = [](const std::string& key, const json& value) {
    json broken = tiny();
    broken[key] = value;
    return error_of([&] { from(broken); });
  };
  EXPECT_THAT(error_with("model", {{"type", "WordPiece"}, {"vocab", json::object()}}),
              HasSubstr("model type \"WordPiece\" is not supported"));
  EXPECT_THAT(error_with("model", {{"type", "Unigram"}, {"vocab", json::array()}}),
              HasSubstr("model type \"Unigram\" is not supported"));
  EXPECT_THAT(error_with("model", {{"vocab", json::object()}}), HasSubstr("no \"type\" and no \"merges\""));
  EXPECT_THAT(error_with("normalizer", {{"type", "NFKC"}}), HasSubstr("normalizer type \"NFKC\" is not supported"));
  EXPECT_THAT(error_with("pre_tokenizer", {{"type", "Whitespace"}}), HasSubstr("pre_tokenizer type \"Whitespace\""));
  EXPECT_THAT(error_with("decoder", {{"type", "WordPiece"}}), HasSubstr("decoder type \"WordPiece\""));
  EXPECT_THAT(error_with("post_processor", {{"type", "Nope"}}), HasSubstr("post_processor type \"Nope\""));
  EXPECT_THAT(
      error_with("pre_tokenizer",
                 {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}, {"invert", false}}),
      HasSubstr("bad regex '(a'"));
  EXPECT_THAT(error_with("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}}),
              HasSubstr("unknown behavior \"Sideways\""));
  EXPECT_THAT(error_with("version", "2.0"), HasSubstr("unknown tokenizer.json version"));
  EXPECT_THAT(error_with("decoder", {{"type", "Sequence"}, {"decoders", {nullptr}}}),
              HasSubstr("decoder Sequence: \"decoders\" holds a null entry"));
  EXPECT_THAT(error_with("added_tokens", {{{"id", 9}, {"content", 5}}}), HasSubstr("\"content\" must be a string"));
}

TEST(TokenizerFiles, BadBpeModels) {
  const auto error_with = [](const json& overrides) { return error_of([&] { from(tiny(overrides)); }); };
  EXPECT_THAT(error_with({{"merges", {"a c"}}}), HasSubstr("merges entry 0 (\"a\" \"c\") needs \"c\""));
  EXPECT_THAT(error_with({{"merges", {"b a"}}}), HasSubstr("needs \"ba\", which is not in the vocabulary"));
  EXPECT_THAT(error_with({{"merges", {"a  b"}}}), HasSubstr("two tokens separated by one space"));
  EXPECT_THAT(error_with({{"merges", {"ab"}}}), HasSubstr("two tokens separated by one space"));
  EXPECT_THAT(error_with({{"merges", {{"a"}}}}), HasSubstr("must be a pair of tokens"));
  EXPECT_THAT(error_with({{"merges", "a b"}}), HasSubstr("\"merges\" must be a list"));
  EXPECT_THAT(error_with({{"vocab", {{"a", -1}}}}), HasSubstr("vocab id of \"a\""));
  EXPECT_THAT(error_with({{"vocab", {{"a", "x"}}}}), HasSubstr("vocab id of \"a\""));
  EXPECT_THAT(error_with({{"vocab", {{"a", 0}, {"b", 0}}}, {"merges", json::array()}}),
              HasSubstr("vocab id 0 is given to both"));
  EXPECT_THAT(error_with({{"dropout", 0.1}}), HasSubstr("dropout 0.1 is not supported"));
  EXPECT_NO_THROW(from(tiny({{"dropout", 0.0}})));
}

// Expected ids from `tokenizers` 0.23 on the same JSON.
TEST(TokenizerBpe, UnknownTokensAndMergeFormats) {
  EXPECT_EQ(from(tiny()).encode("axyb"), (Ids{1, 0, 2}));  // fuse_unk: one <unk> for "xy"
  EXPECT_EQ(from(tiny({{"fuse_unk", false}})).encode("axyb"), (Ids{1, 0, 0, 2}));
  EXPECT_EQ(from(tiny({{"unk_token", nullptr}})).encode("axyb"), (Ids{3}));  // dropped, then "a" "b" merge
  const json pairs = json::array({json::array({"a", "b"}), json::array({"▁", "ab"})});
  EXPECT_EQ(from(tiny({{"merges", pairs}})).encode("ab"), (Ids{3}));
  EXPECT_EQ(from(tiny()).decode(Ids{1, 2, 3}), "a b ab");  // no decoder: tokens joined with spaces
  json metaspace = tiny();
  metaspace["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(from(metaspace).decode(Ids{4, 5, 4, 1, 4}), " ab a ");
  metaspace["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(from(metaspace).decode(Ids{4, 5, 4, 1, 4}), "  ab a ");
}

TEST(TokenizerDecode, UnknownIdsAreErrors) {
  const mk::Tokenizer tokenizer = mk::Tokenizer::load(kFixtures / "llama3");
  EXPECT_THAT(error_of([&] { tokenizer.decode(Ids{1, 99999}); }), HasSubstr("token id 99999 is not in the vocabulary"));
  EXPECT_THAT(error_of([&] { tokenizer.decode(Ids{-1}); }), HasSubstr("token id -1"));
  mk::StreamDecoder stream = tokenizer.stream_decoder();
  EXPECT_THAT(error_of([&] { stream.push(99999); }), HasSubstr("token id 99999"));
  const int32_t h = tokenizer.encode("h", {.add_special_tokens = false}).at(0);
  EXPECT_EQ(stream.push(h), "h");
}

TEST(TokenizerSpecial, BosAndEosFromConfigFiles) {
  const mk::Tokenizer llama3 = mk::Tokenizer::load(kFixtures / "llama3");
  EXPECT_EQ(llama3.bos_id(), llama3.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3.eos_ids(), (Ids{*llama3.token_to_id("<|end_of_text|>"), *llama3.token_to_id("<|eot_id|>")}));
  EXPECT_TRUE(llama3.is_special(*llama3.bos_id()));
  EXPECT_FALSE(llama3.is_special(*llama3.token_to_id("@@user")));
  const mk::Tokenizer llama2 = mk::Tokenizer::load(kFixtures / "llama2");
  EXPECT_EQ(llama2.bos_id(), 1);
  EXPECT_EQ(llama2.eos_ids(), Ids{2});
  EXPECT_EQ(llama2.id_to_token(1), "<s>");
  EXPECT_EQ(llama2.vocab_size(), *llama2.token_to_id("<<SYS>>") + 1);
  // The tokenizer.json file alone knows no BOS/EOS ids, but its post-processor still adds BOS.
  const mk::Tokenizer bare = mk::Tokenizer::load(kFixtures / "metaspace" / "tokenizer.json");
  EXPECT_EQ(bare.bos_id(), std::nullopt);
  EXPECT_TRUE(bare.eos_ids().empty());
  EXPECT_EQ(bare.encode("hi").front(), 1);
}

TEST(TokenizerSpecial, ConfigIdsBeyondInt32AreRefusedNotWrapped) {
  TempDir dir;
  write(dir.path() / "tokenizer.json", tiny().dump());
  // 2^32 was cast to int32 and became id 0, which the vocabulary holds: EOS <unk>, with no word said.
  for (const char* config : {R"({"eos_token_id": 4294967296})", R"({"bos_token_id": [4294967297]})"}) {
    write(dir.path() / "generation_config.json", config);
    EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }),
                HasSubstr("must be a token id (a whole number in [0, 2^31))"))
        << config;
  }
}

// They were refused as "special id N is outside the vocabulary", naming neither the file nor the entry.
TEST(TokenizerSpecial, IdsOutsideTheVocabularyNameWhereTheyCameFrom) {
  TempDir dir;
  write(dir.path() / "tokenizer.json", tiny().dump());
  const int64_t vocab = from(tiny()).vocab_size();
  const int64_t outside = vocab + 34;
  const auto eos_message = [&](const char* file) {
    return fmt::format("EOS id {} (from {}: eos_token_id) is outside the tokenizer's vocabulary [0, {})", outside,
                       (dir.path() / file).string(), vocab);
  };
  write(dir.path() / "config.json", json({{"eos_token_id", {1, outside}}}).dump());
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr(eos_message("config.json")));
  write(dir.path() / "generation_config.json", json({{"eos_token_id", outside}}).dump());
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }), HasSubstr(eos_message("generation_config.json")));

  json with_template = tiny();
  with_template["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {outside}}, {"tokens", {"<s>"}}}}}}};
  write(dir.path() / "tokenizer.json", with_template.dump());
  std::filesystem::remove(dir.path() / "generation_config.json");
  std::filesystem::remove(dir.path() / "config.json");
  EXPECT_THAT(error_of([&] { mk::Tokenizer::load(dir.path()); }),
              HasSubstr(fmt::format("{}: post_processor: special id {} is outside the vocabulary [0, {})",
                                    (dir.path() / "tokenizer.json").string(), outside, vocab)));
}

// tokenizer_config.json's add_bos_token/add_eos_token replace the post-processor, as in transformers' Llama class.
TEST(TokenizerSpecial, AddBosAndEosTokenFlags) {
  TempDir dir;
  std::filesystem::copy_file(kFixtures / "llama2" / "tokenizer.json", dir.path() / "tokenizer.json");
  const auto encode_with = [&](const json& config) {
    write(dir.path() / "tokenizer_config.json", config.dump());
    return mk::Tokenizer::load(dir.path()).encode("hi");
  };
  const Ids hi = mk::Tokenizer::load(kFixtures / "llama2").encode("hi", {.add_special_tokens = false});
  const json tokens = {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}, {"special", true}}}};
  const auto with = [&](const char* key, bool value) {
    json config = tokens;
    config[key] = value;
    return config;
  };
  const auto around = [&](Ids prefix, Ids suffix) {
    prefix.insert(prefix.end(), hi.begin(), hi.end());
    prefix.insert(prefix.end(), suffix.begin(), suffix.end());
    return prefix;
  };
  EXPECT_EQ(encode_with(with("add_eos_token", true)), around({1}, {2}));
  EXPECT_EQ(encode_with(with("add_bos_token", false)), hi);
  EXPECT_EQ(encode_with(tokens), around({1}, {}));  // no flags: the post-processor's template
  EXPECT_THAT(error_of([&] {
                encode_with({{"add_bos_token", true}, {"bos_token", "<nope>"}});
              }),
              HasSubstr("bos_token \"<nope>\" is not in the vocabulary"));
  write(dir.path() / "tokenizer_config.json", "{}");
  write(dir.path() / "config.json", json({{"bos_token_id", 1}, {"eos_token_id", {2, 0}}}).dump());
  const mk::Tokenizer with_model_config = mk::Tokenizer::load(dir.path());
  EXPECT_EQ(with_model_config.bos_id(), 1);
  EXPECT_EQ(with_model_config.eos_ids(), (Ids{2, 0}));
}

struct MkResult {
  int status = -1;     // the exit status; -1 when mk died of a signal
  std::string output;  // stdout, then stderr
};

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

MkResult run_mk(const std::string& args, const TempDir& dir) {
  const std::filesystem::path out = dir.path() / "mk_stdout", err = dir.path() / "mk_stderr";
  const int status =
      std::system(fmt::format("'{}' {} > '{}' 2> '{}'", MK_BINARY, args, out.string(), err.string()).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out) + read(err)};
}

// ids as mk tokenize prints them (separator " ") or as --ids takes them (",").
std::string joined(const Ids& ids, const char* separator) {
  std::string out;
  for (const int32_t id : ids) out += fmt::format("{}{}", out.empty() ? "" : separator, id);
  return out;
}

TEST(TokenizerCli, TokenizeAndDetokenize) {
  TempDir dir;
  const std::string llama3 = (kFixtures / "llama3").string();
  const mk::Tokenizer tokenizer = mk::Tokenizer::load(llama3);
  const std::string text = "Hello, wörld <|eot_id|> 😀";
  const std::string ids = joined(tokenizer.encode(text), " "), commas = joined(tokenizer.encode(text), ",");
  const MkResult tokenized = run_mk(fmt::format("tokenize --tokenizer '{}' --text '{}'", llama3, text), dir);
  EXPECT_EQ(tokenized.status, 0) << tokenized.output;
  EXPECT_EQ(tokenized.output, ids + "\n");
  const MkResult plain = run_mk(fmt::format("tokenize --tokenizer '{}' --text hi --no-special", llama3), dir);
  EXPECT_EQ(plain.output, joined(tokenizer.encode("hi", {.add_special_tokens = false}), " ") + "\n");
  const MkResult text_back = run_mk(fmt::format("detokenize --tokenizer '{}' --ids '{}'", llama3, commas), dir);
  EXPECT_EQ(text_back.status, 0) << text_back.output;
  EXPECT_EQ(text_back.output, "<|begin_of_text|>" + text);  // exactly the text: no newline added
  const MkResult skipped =
      run_mk(fmt::format("detokenize --tokenizer '{}' --ids '{}' --skip-special", llama3, ids), dir);
  EXPECT_EQ(skipped.output, "Hello, wörld  😀");
}

TEST(TokenizerCli, Errors) {
  TempDir dir;
  const std::string llama3 = (kFixtures / "llama3").string();
  write(dir.path() / "bad.txt", "ok\xFF");
  const MkResult bad_text =
      run_mk(fmt::format("tokenize --tokenizer '{}' --file '{}'", llama3, (dir.path() / "bad.txt").string()), dir);
  EXPECT_EQ(bad_text.status, 1);
  EXPECT_THAT(bad_text.output, HasSubstr("bad.txt: text is not valid UTF-8 at byte offset 2"));
  const MkResult bad_id = run_mk(fmt::format("detokenize --tokenizer '{}' --ids 1,x", llama3), dir);
  EXPECT_EQ(bad_id.status, 1);
  EXPECT_THAT(bad_id.output, HasSubstr("\"x\" is not a token id"));
  EXPECT_EQ(run_mk(fmt::format("tokenize --tokenizer '{}'", llama3), dir).status, 2);  // no --text or --file
  const MkResult missing = run_mk("tokenize --tokenizer /nonexistent --text hi", dir);
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.output, HasSubstr("no tokenizer.json at /nonexistent"));
}

}  // namespace
