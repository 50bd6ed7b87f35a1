// Special ids around an encoding and the model's BOS/EOS ids, from tokenizer.json and the config files beside it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mk::text {

// The ids that add_special_tokens puts before and after the encoded text (the single-sequence case).
struct Affixes {
  std::vector<int32_t> prefix, suffix;
};

// tokenizer.json's "post_processor"; null adds nothing. Throws mk::Error for an unsupported type.
Affixes parse_post_processor(const nlohmann::json& processor);

// The JSON files of a model directory; null where a file is absent.
struct ConfigFiles {
  nlohmann::json tokenizer_config, generation_config, model_config;
  std::filesystem::path dir;  // where they were read, to name them in SpecialIds::eos_source
};

struct SpecialIds {
  std::optional<int32_t> bos;
  std::vector<int32_t> eos;
  std::string eos_source;  // the file and entry eos came from, as "DIR/FILE: entry"; empty when eos is
};

// BOS and EOS by the precedence of include/mk/tokenizer.h. Where tokenizer_config.json sets add_bos_token or
// add_eos_token, affixes is replaced by what they ask for, as transformers' LlamaTokenizerFast does.
SpecialIds resolve_special_ids(const ConfigFiles& files,
                               const std::function<std::optional<int32_t>(std::string_view)>& id_of, Affixes& affixes);

}  // namespace mk::text
