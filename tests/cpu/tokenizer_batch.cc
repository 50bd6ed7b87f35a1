// Test helper: encodes and decodes a batch from a JSON file with mk::Tokenizer, for scripts that compare it with
// Hugging Face `tokenizers` (scripts/check_tokenizers_live.py).
// Usage: tokenizer_batch TOKENIZER IN.json OUT.json, or tokenizer_batch --unicode-version (of its regex classes)
//   IN:  {"texts": [...], "id_lists": [[...], ...]}
//   OUT: {"encoded": ids with special tokens, "plain": without, "split_special": without and with special-token
//         text as plain text, "decoded": decode(id_lists), "decoded_skip": the same skipping special tokens,
//         "streamed": StreamDecoder's pieces of each id list joined}
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "mk/check.h"
#include "mk/tokenizer.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--unicode-version") {
    fmt::print("{}\n", mk::Tokenizer::unicode_version());
    return 0;
  }
  if (argc != 4) {
    fmt::print(stderr, "usage: tokenizer_batch TOKENIZER IN.json OUT.json | tokenizer_batch --unicode-version\n");
    return 2;
  }
  try {
    const mk::Tokenizer tokenizer = mk::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2]);
    MK_CHECK(in.good(), "cannot open {}", argv[2]);
    const nlohmann::json input = nlohmann::json::parse(in);
    nlohmann::json out;
    for (const char* key : {"encoded", "plain", "split_special", "decoded", "decoded_skip", "streamed"})
      out[key] = nlohmann::json::array();
    for (const auto& text : input.at("texts")) {
      const std::string s = text.get<std::string>();
      out["encoded"].push_back(tokenizer.encode(s));
      out["plain"].push_back(tokenizer.encode(s, {.add_special_tokens = false}));
      out["split_special"].push_back(tokenizer.encode(s, {.add_special_tokens = false, .split_special_tokens = true}));
    }
    for (const auto& list : input.at("id_lists")) {
      const std::vector<int32_t> ids = list.get<std::vector<int32_t>>();
      out["decoded"].push_back(tokenizer.decode(ids));
      out["decoded_skip"].push_back(tokenizer.decode(ids, true));
      mk::StreamDecoder stream = tokenizer.stream_decoder();
      std::string streamed;
      for (const int32_t id : ids) streamed += stream.push(id);
      out["streamed"].push_back(streamed + stream.finish());
    }
    std::ofstream(argv[3]) << out.dump();
  } catch (const std::exception& error) {
    fmt::print(stderr, "tokenizer_batch: {}\n", error.what());
    return 1;
  }
  return 0;
}
