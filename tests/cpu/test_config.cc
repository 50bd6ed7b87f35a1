// Tests of ModelConfig: presets, config.json parsing (both transformers generations), validation errors, export.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "mk/check.h"
#include "mk/model_config.h"
#include "mk/program.h"
#include "test_util.h"

namespace {

using mk::testing_util::error_of;
using mk::testing_util::TempDir;

using ::testing::HasSubstr;
using nlohmann::json;

// The message of the mk::Error that `body` throws; fails the test when it throws nothing or something else.

std::string parse_error(const json& config) {
  return error_of([&] { mk::model_config_from_hf_json(config, "cfg.json"); });
}

// Meta-Llama-3.1-8B's config.json as published (transformers 4.43): no head_dim, rope_theta + rope_scaling.
json llama31_8b_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": true,
    "vocab_size": 128256
  })");
}

// A small valid config that the error tests break one field at a time.
json small_config() {
  return json{{"model_type", "llama"},
              {"hidden_size", 256},
              {"intermediate_size", 512},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 384},
              {"max_position_embeddings", 1024},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0}};
}

void expect_same_shape(const mk::ModelConfig& a, const mk::ModelConfig& b) {
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
  EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
  EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
  EXPECT_EQ(a.has_embedding, b.has_embedding);
  EXPECT_EQ(a.has_lm_head, b.has_lm_head);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
}

}  // namespace

TEST(Presets, AllValidateAndHaveUniqueNames) {
  ASSERT_GE(mk::presets().size(), 4u);
  std::set<std::string> names;
  for (const mk::Preset& preset : mk::presets()) {
    EXPECT_NO_THROW(preset.config.validate()) << preset.config.name;
    EXPECT_TRUE(names.insert(preset.config.name).second) << "duplicate preset " << preset.config.name;
    EXPECT_GT(preset.shape.tokens(), 0) << preset.config.name;
    EXPECT_EQ(&mk::find_preset(preset.config.name), &preset);
  }
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  const std::string message = error_of([] { mk::find_preset("nope"); });
  EXPECT_THAT(message, HasSubstr("unknown preset 'nope'"));
  for (const mk::Preset& preset : mk::presets()) EXPECT_THAT(message, HasSubstr(preset.config.name));
}

TEST(Presets, ParameterCountsMatchThePublishedModels) {
  // Hugging Face reports these exact counts for the real checkpoints, so the accounting covers every tensor.
  EXPECT_EQ(mk::forward_cost(mk::find_preset("llama-3.1-8b").config, {1, 1}).parameters, 8'030'261'248);
  EXPECT_EQ(mk::forward_cost(mk::find_preset("llama-3.2-1b").config, {1, 1}).parameters, 1'235'814'400);
}

TEST(Presets, DModelOverrideMustBeAMultipleOfHeadDim) {
  // heads = d_model / head_dim was rounded down: d_model 200 ran with one head.
  const std::string message = error_of([] { mk::preset_config("seed", {.d_model = 200}); });
  EXPECT_THAT(message, HasSubstr("d_model 200 is not a multiple of the head_dim 128 of preset 'seed'"));
  const mk::ModelConfig with_heads = mk::preset_config("seed", {.d_model = 256, .heads = 3});
  EXPECT_EQ(with_heads.n_heads, 3);
  EXPECT_EQ(with_heads.n_kv_heads, 3);
}

TEST(ConfigJson, ParsesLlama31WithRopeScaling) {
  const mk::ModelConfig c = mk::model_config_from_hf_json(llama31_8b_config(), "llama31/config.json");
  EXPECT_EQ(c.name, "llama31/config.json");
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.d_ff, 14336);
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not in the file: hidden_size / num_attention_heads
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope.type, mk::RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.has_embedding);
  EXPECT_TRUE(c.has_lm_head);
  expect_same_shape(c, mk::find_preset("llama-3.1-8b").config);
}

TEST(ConfigJson, ParsesTransformers5RopeParameters) {
  // transformers >= 5 folds rope_theta into rope_parameters and writes no top-level rope_theta.
  json config = llama31_8b_config();
  config.erase("rope_scaling");
  config.erase("rope_theta");
  config["hidden_size"] = 2048;
  config["intermediate_size"] = 8192;
  config["num_hidden_layers"] = 16;
  config["head_dim"] = 64;
  config["tie_word_embeddings"] = true;
  config["rope_parameters"] = {{"rope_type", "llama3"},
                               {"rope_theta", 500000.0},
                               {"factor", 32.0},
                               {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 8192}};
  const mk::ModelConfig c = mk::model_config_from_hf_json(config, "v5.json");
  EXPECT_EQ(c.rope.type, mk::RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  expect_same_shape(c, mk::find_preset("llama-3.2-1b").config);
}

TEST(ConfigJson, DefaultRopeWithoutScaling) {
  json config = small_config();
  config["rope_theta"] = 250000.0;
  mk::ModelConfig c = mk::model_config_from_hf_json(config, "cfg.json");
  EXPECT_EQ(c.rope.type, mk::RopeType::kDefault);
  EXPECT_EQ(c.rope.theta, 250000.0);

  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  c = mk::model_config_from_hf_json(config, "cfg.json");
  EXPECT_EQ(c.rope.type, mk::RopeType::kDefault);
  EXPECT_EQ(c.rope.theta, 1234.0);  // rope_parameters wins over the top-level field
}

TEST(ConfigJson, DerivesHeadDimAndKvHeads) {
  json config = small_config();
  config["hidden_size"] = 96;
  config["num_attention_heads"] = 3;
  config.erase("num_key_value_heads");  // absent: plain multi-head attention
  const mk::ModelConfig c = mk::model_config_from_hf_json(config, "cfg.json");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.n_kv_heads, 3);

  config["head_dim"] = 48;  // given explicitly, it need not be hidden_size / heads
  EXPECT_EQ(mk::model_config_from_hf_json(config, "cfg.json").head_dim, 48);
}

TEST(ConfigJson, MissingFieldIsNamed) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "vocab_size", "max_position_embeddings"}) {
    json config = small_config();
    config.erase(field);
    const std::string message = parse_error(config);
    EXPECT_THAT(message, HasSubstr("cfg.json")) << field;
    EXPECT_THAT(message, HasSubstr(std::string("missing field '") + field + "'"));
  }
  json config = small_config();
  config["hidden_size"] = nullptr;  // null reads as absent
  EXPECT_THAT(parse_error(config), HasSubstr("missing field 'hidden_size'"));
}

TEST(ConfigJson, WrongTypeIsNamed) {
  const std::vector<std::pair<const char*, json>> cases = {
      {"hidden_size", "256"},          {"hidden_size", 256.5},        {"num_hidden_layers", true},
      {"num_key_value_heads", json::array({2})}, {"vocab_size", json::object()}, {"rope_theta", "big"},
      {"tie_word_embeddings", "yes"},  {"rms_norm_eps", false},       {"model_type", 7},
  };
  for (const auto& [field, value] : cases) {
    json config = small_config();
    config[field] = value;
    const std::string message = parse_error(config);
    EXPECT_THAT(message, HasSubstr(std::string("field '") + field + "' has the wrong type")) << value.dump();
    EXPECT_THAT(message, HasSubstr("cfg.json"));
  }
  json config = small_config();
  config["hidden_size"] = 256.0;  // a whole number written as a float is still a size
  EXPECT_EQ(mk::model_config_from_hf_json(config, "cfg.json").d_model, 256);
}

TEST(ConfigJson, HiddenSizeNotDivisibleByHeads) {
  json config = small_config();
  config["hidden_size"] = 250;
  const std::string message = parse_error(config);
  EXPECT_THAT(message, HasSubstr("hidden_size (250)"));
  EXPECT_THAT(message, HasSubstr("num_attention_heads (4)"));
  EXPECT_THAT(message, HasSubstr("head_dim"));
}

TEST(ConfigJson, KvHeadsMustDivideHeads) {
  json config = small_config();
  config["num_key_value_heads"] = 3;
  const std::string message = parse_error(config);
  EXPECT_THAT(message, HasSubstr("num_key_value_heads (3) must divide num_attention_heads (4)"));
  EXPECT_THAT(message, HasSubstr("cfg.json"));
}

TEST(ConfigJson, UnsupportedRopeType) {
  json config = small_config();
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THAT(parse_error(config), HasSubstr("rope type 'yarn' is not supported"));
  // transformers < 4.43 spelled the key "type".
  config["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_THAT(parse_error(config), HasSubstr("rope type 'dynamic' is not supported"));
}

TEST(ConfigJson, Llama3RopeNeedsItsParameters) {
  for (const char* field : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    json config = small_config();
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
    config["rope_scaling"].erase(field);
    EXPECT_THAT(parse_error(config), HasSubstr(std::string("missing field '") + field + "'"));
  }
}

TEST(ConfigJson, NegativeOrZeroSizesAreNamed) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim"}) {
    for (int value : {-64, 0}) {
      json config = small_config();
      config["head_dim"] = 64;  // so that hidden_size is not divided by a bad head count first
      config[field] = value;
      const std::string message = parse_error(config);
      EXPECT_THAT(message, HasSubstr(std::string(field) + " must be positive")) << value;
      EXPECT_THAT(message, HasSubstr("cfg.json"));
    }
  }
  json config = small_config();
  config["rms_norm_eps"] = -1e-6;
  EXPECT_THAT(parse_error(config), HasSubstr("rms_norm_eps must be positive"));
}

TEST(ConfigJson, UnsupportedArchitectureFeatures) {
  json config = small_config();
  config["model_type"] = "mistral";
  EXPECT_THAT(parse_error(config), HasSubstr("model_type 'mistral'"));
  config = small_config();
  config["hidden_act"] = "gelu";
  EXPECT_THAT(parse_error(config), HasSubstr("hidden_act 'gelu'"));
  config = small_config();
  config["attention_bias"] = true;
  EXPECT_THAT(parse_error(config), HasSubstr("attention_bias"));
  EXPECT_THAT(parse_error(json::array({1, 2})), HasSubstr("expected a JSON object"));
}

TEST(ConfigJson, LoadNamesTheFile) {
  TempDir dir;
  const std::filesystem::path missing = dir.path() / "absent" / "config.json";
  std::string message = error_of([&] { mk::load_model_config(missing); });
  EXPECT_THAT(message, HasSubstr(missing.string()));
  EXPECT_THAT(message, HasSubstr("cannot open"));

  const std::filesystem::path broken = dir.path() / "config.json";
  std::ofstream(broken) << "{\"hidden_size\": 256,";
  message = error_of([&] { mk::load_model_config(broken); });
  EXPECT_THAT(message, HasSubstr(broken.string()));
  EXPECT_THAT(message, HasSubstr("not valid JSON"));

  std::ofstream(broken) << llama31_8b_config().dump(2);
  EXPECT_EQ(mk::load_model_config(broken).d_model, 4096);
}

TEST(ConfigJson, HfExportRoundTrips) {
  for (const char* name : {"tiny", "llama-3.2-1b", "llama-3.1-8b"}) {
    const mk::ModelConfig& preset = mk::find_preset(name).config;
    const json exported = mk::model_config_to_hf_json(preset);
    EXPECT_EQ(exported["model_type"], "llama");
    EXPECT_EQ(exported["architectures"], json::array({"LlamaForCausalLM"}));
    // Through text, as a file on disk would go.
    const mk::ModelConfig parsed = mk::model_config_from_hf_json(json::parse(exported.dump()), name);
    SCOPED_TRACE(name);
    expect_same_shape(parsed, preset);
  }
  mk::ModelConfig plain = mk::find_preset("tiny").config;
  plain.rope = mk::RopeConfig{mk::RopeType::kDefault, 10000.0};
  const json exported = mk::model_config_to_hf_json(plain);
  EXPECT_TRUE(exported["rope_scaling"].is_null());
  expect_same_shape(mk::model_config_from_hf_json(exported, "plain"), plain);
}

TEST(ConfigJson, MkJsonRoundTripsEveryField) {
  std::vector<mk::ModelConfig> configs;
  for (const mk::Preset& preset : mk::presets()) configs.push_back(preset.config);
  // Every field away from its default, so that a field the JSON dropped would come back different.
  mk::ModelConfig odd = mk::find_preset("tiny").config;
  odd.name = "odd";
  odd.rms_norm_eps = 3e-7f;
  odd.rope = mk::RopeConfig{mk::RopeType::kLlama3, 12345.5, 3.5, 1.25, 5.5, 96};
  odd.max_position_embeddings = 777;
  odd.tie_word_embeddings = true;
  configs.push_back(odd);
  for (const mk::ModelConfig& config : configs) {
    SCOPED_TRACE(config.name);
    const json text = json::parse(mk::model_config_to_json(config).dump());  // through text, as files hold it
    const mk::ModelConfig back = mk::model_config_from_json(text, "test");
    EXPECT_EQ(mk::first_difference(back, config), "");
    EXPECT_EQ(back.name, config.name);
    EXPECT_EQ(back.rms_norm_eps, config.rms_norm_eps);
    EXPECT_EQ(back.rope.theta, config.rope.theta);
  }
  json broken = mk::model_config_to_json(odd);
  broken.erase("d_ff");
  EXPECT_THAT(error_of([&] { mk::model_config_from_json(broken, "x.sched"); }), HasSubstr("missing field 'd_ff'"));
  broken = mk::model_config_to_json(odd);
  broken["rope_type"] = "yarn";
  EXPECT_THAT(error_of([&] { mk::model_config_from_json(broken, "x.sched"); }), HasSubstr("unknown rope_type 'yarn'"));
}

TEST(ConfigJson, FirstDifferenceNamesTheField) {
  const mk::ModelConfig tiny = mk::find_preset("tiny").config;
  mk::ModelConfig other = tiny;
  other.name = "renamed";
  EXPECT_EQ(mk::first_difference(tiny, other), "");  // names aside
  other.d_ff = 1024;
  EXPECT_EQ(mk::first_difference(tiny, other), "d_ff 512 vs 1024");
  other = tiny;
  other.rope.type = mk::RopeType::kDefault;
  EXPECT_EQ(mk::first_difference(tiny, other), "rope_type \"llama3\" vs \"default\"");
}

TEST(ConfigJson, HfExportRejectsTheSeedModel) {
  EXPECT_THAT(error_of([] { mk::model_config_to_hf_json(mk::find_preset("seed").config); }),
              HasSubstr("no embedding"));
  mk::ModelConfig no_rope = mk::find_preset("tiny").config;
  no_rope.rope.type = mk::RopeType::kNone;
  EXPECT_THAT(error_of([&] { mk::model_config_to_hf_json(no_rope); }), HasSubstr("no RoPE"));
}
