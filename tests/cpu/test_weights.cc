// Tests of model weights: seeded random init, Hugging Face save/load round trips, sharded checkpoints, load errors,
// the norm weights' fold.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/compare.h"
#include "mk/model_config.h"
#include "mk/random.h"
#include "mk/reference.h"
#include "mk/safetensors.h"
#include "mk/weights.h"
#include "test_util.h"

namespace {

using mk::testing_util::as_bytes;
using mk::testing_util::error_of;
using mk::testing_util::TempDir;

using ::testing::HasSubstr;

struct NamedTensor {
  std::vector<int64_t> shape;
  std::vector<uint16_t> bits;
};

// Every tensor of a model by its Hugging Face name, as raw bf16 bits so that comparisons are bitwise.
std::map<std::string, NamedTensor> tensors_of(const mk::ModelWeights& weights) {
  std::map<std::string, NamedTensor> result;
  mk::for_each_weight(const_cast<mk::ModelWeights&>(weights),
                      [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<mk::bf16>& data) {
                        NamedTensor& tensor = result[name];
                        tensor.shape = shape;
                        for (mk::bf16 value : data) tensor.bits.push_back(value.bits);
                      });
  return result;
}

void expect_bitwise_equal(const mk::ModelWeights& a, const mk::ModelWeights& b) {
  const auto ta = tensors_of(a);
  const auto tb = tensors_of(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, tensor] : ta) {
    auto found = tb.find(name);
    ASSERT_NE(found, tb.end()) << name;
    EXPECT_EQ(tensor.shape, found->second.shape) << name;
    EXPECT_TRUE(tensor.bits == found->second.bits) << name << " differs";
  }
}

std::span<const uint8_t> as_bytes(const std::vector<mk::bf16>& values) {
  return {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(mk::bf16)};
}

// The model's tensors as write_safetensors input, optionally filtered and reshaped.
std::vector<mk::TensorToWrite> to_write(mk::ModelWeights& weights,
                                        const std::function<bool(const std::string&)>& keep = nullptr) {
  std::vector<mk::TensorToWrite> result;
  mk::for_each_weight(weights, [&](const std::string& name, const std::vector<int64_t>& shape,
                                   std::vector<mk::bf16>& data) {
    if (!keep || keep(name)) result.push_back({name, mk::DType::kBF16, shape, as_bytes(data)});
  });
  return result;
}

// The smallest model that exercises every tensor kind, for tests that write files by hand.
mk::ModelConfig micro_config(bool tied) {
  mk::ModelConfig c;
  c.name = tied ? "micro-tied" : "micro";
  c.d_model = 32;
  c.d_ff = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.max_position_embeddings = 64;
  c.rope = mk::RopeConfig{mk::RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 16};
  c.tie_word_embeddings = tied;
  return c;
}

}  // namespace

TEST(Weights, RandomIsDeterministicPerSeed) {
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const mk::ModelWeights a = mk::random_weights(tiny, 7);
  const mk::ModelWeights b = mk::random_weights(tiny, 7);
  expect_bitwise_equal(a, b);

  const mk::ModelWeights c = mk::random_weights(tiny, 8);
  const auto ta = tensors_of(a);
  const auto tc = tensors_of(c);
  for (const auto& [name, tensor] : ta) EXPECT_FALSE(tensor.bits == tc.at(name).bits) << name << " ignores the seed";
  // Different tensors of one model must not repeat each other's numbers.
  EXPECT_FALSE(ta.at("model.layers.0.mlp.gate_proj.weight").bits == ta.at("model.layers.0.mlp.up_proj.weight").bits);
  EXPECT_FALSE(ta.at("model.layers.0.self_attn.k_proj.weight").bits ==
               ta.at("model.layers.1.self_attn.k_proj.weight").bits);
}

// The weights are filled in parallel ranges (Random::skip); each tensor must still hold its own generator's draws in
// order, as one thread draws them: the values every earlier session's random-weight figures were taken on.
TEST(Weights, RandomIsEachTensorsOwnSequenceInOrder) {
  mk::ModelConfig config = mk::find_preset("tiny").config;
  config.n_layers = 3;
  for (int threads : {1, 2, 3, 7, 17}) {  // ranges that start and end inside tensors and at their edges
    mk::ModelWeights weights = mk::random_weights(config, 11, threads);
    uint64_t tensor_index = 0;
    mk::for_each_weight(weights, [&](const std::string& name, const std::vector<int64_t>& shape,
                                     std::vector<mk::bf16>& data) {
      mk::Random random(11 * 1000003 + tensor_index++);
      for (size_t i = 0; i < data.size(); ++i) {
        const float expected = shape.size() == 1 ? random.uniform(0.5f, 1.5f) : random.symmetric(0.02f);
        ASSERT_EQ(data[i].bits, mk::to_bf16(expected).bits)
            << name << " element " << i << ", " << threads << " threads";
      }
    });
    EXPECT_EQ(tensor_index, 3 + 9 * 3) << "the embedding, 9 tensors a layer, the final norm and the LM head";
  }
}

TEST(Random, SkipDrawsAsIfTheNumbersHadBeenDrawn) {
  mk::Random drawn(42), skipped(42);
  for (int i = 0; i < 1000; ++i) drawn.next_u64();
  skipped.skip(1000);
  EXPECT_EQ(drawn.next_u64(), skipped.next_u64());
}

TEST(Weights, RandomHasTheDocumentedShapesAndRanges) {
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const mk::ModelWeights w = mk::random_weights(tiny, 1);
  ASSERT_EQ(w.layers.size(), size_t(tiny.n_layers));
  EXPECT_EQ(w.embedding.size(), size_t(tiny.vocab_size * tiny.d_model));
  EXPECT_EQ(w.lm_head.size(), size_t(tiny.vocab_size * tiny.d_model));
  EXPECT_EQ(w.layers[0].wk.size(), size_t(tiny.kv_dim() * tiny.d_model));
  EXPECT_EQ(w.layers[1].w_down.size(), size_t(tiny.d_model * tiny.d_ff));
  for (const auto& [name, tensor] : tensors_of(w)) {
    // Uniform with std 0.02 spans +-sqrt(3) * 0.02; norm weights span [0.5, 1.5].
    const bool is_norm = tensor.shape.size() == 1;
    double sum_squares = 0;
    for (uint16_t bits : tensor.bits) {
      const float value = mk::to_float(mk::bf16{bits});
      sum_squares += double(value) * value;
      if (is_norm) {
        ASSERT_GE(value, 0.5f) << name;
        ASSERT_LE(value, 1.5f) << name;
      } else {
        ASSERT_LE(std::fabs(value), 0.0347f) << name;
      }
    }
    if (!is_norm) {
      EXPECT_NEAR(std::sqrt(sum_squares / double(tensor.bits.size())), 0.02, 0.002) << name;
    }
  }
}

TEST(Weights, SaveAndLoadRoundTripBitExactly) {
  TempDir dir;
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  const mk::ModelWeights saved = mk::random_weights(tiny, 3);
  mk::save_hf_model(dir.path() / "model", saved);
  ASSERT_TRUE(std::filesystem::exists(dir.path() / "model" / "config.json"));
  ASSERT_TRUE(std::filesystem::exists(dir.path() / "model" / "model.safetensors"));

  // Through config.json as well: what `mk run --model` does.
  const mk::ModelConfig loaded_config = mk::load_model_config(dir.path() / "model" / "config.json");
  EXPECT_EQ(loaded_config.qkv_dim(), tiny.qkv_dim());
  const mk::ModelWeights loaded = mk::load_weights(dir.path() / "model", loaded_config);
  expect_bitwise_equal(saved, loaded);

  mk::SafetensorsFile file(dir.path() / "model" / "model.safetensors");
  EXPECT_EQ(file.tensors().size(), tensors_of(saved).size());  // nothing extra written
  for (const mk::TensorInfo& tensor : file.tensors()) EXPECT_EQ(tensor.dtype, mk::DType::kBF16) << tensor.name;
}

// The seed's model has no embedding, LM head or RoPE, which a Hugging Face config.json cannot say: it is saved with
// mk's own config form, and a model directory is read back the same way `mk run --model` reads it.
TEST(Weights, ModelsHuggingFaceCannotDescribeRoundTripThroughMkConfig) {
  TempDir dir;
  mk::ModelConfig seed = mk::find_preset("seed").config;
  seed.n_layers = 1;
  seed.d_model = 256;
  seed.n_heads = seed.n_kv_heads = 2;
  seed.d_ff = 512;
  const mk::ModelWeights saved = mk::random_weights(seed, 5);
  EXPECT_EQ(mk::save_model(dir.path(), saved), "mk_config.json");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "config.json"));
  const mk::ModelConfig loaded_config = mk::load_model_dir_config(dir.path());
  EXPECT_EQ(mk::first_difference(loaded_config, seed), "");
  expect_bitwise_equal(saved, mk::load_weights(dir.path(), loaded_config));

  TempDir hf_dir;
  const mk::ModelConfig& tiny = mk::find_preset("tiny").config;
  EXPECT_EQ(mk::save_model(hf_dir.path(), mk::random_weights(tiny, 3)), "config.json");
  EXPECT_EQ(mk::first_difference(mk::load_model_dir_config(hf_dir.path()), tiny), "");
}

TEST(Weights, LoadsAShardedCheckpoint) {
  TempDir dir;
  mk::ModelWeights weights = mk::random_weights(micro_config(false), 11);
  // Layer 0 and the embedding in one shard, the rest in the other, as transformers splits by size.
  auto in_first = [](const std::string& name) {
    return name.starts_with("model.layers.0.") || name == "model.embed_tokens.weight";
  };
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  mk::write_safetensors(dir.path() / first, to_write(weights, in_first));
  mk::write_safetensors(dir.path() / second, to_write(weights, [&](const std::string& name) { return !in_first(name); }));
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [name, tensor] : tensors_of(weights)) weight_map[name] = in_first(name) ? first : second;
  std::ofstream(dir.path() / "model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 1234}}}, {"weight_map", weight_map}}.dump(2);

  const mk::ModelWeights loaded = mk::load_weights(dir.path(), weights.config);
  expect_bitwise_equal(weights, loaded);

  // A tensor the index does not list is an error that names it, even if a shard happens to hold it.
  weight_map.erase("model.norm.weight");
  std::ofstream(dir.path() / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
  const std::string message = error_of([&] { mk::load_weights(dir.path(), weights.config); });
  EXPECT_THAT(message, HasSubstr("'model.norm.weight' is missing from the weight_map"));
  EXPECT_THAT(message, HasSubstr("model.safetensors.index.json"));
}

// A config that leaves tensors unused (fewer layers than the weights, an lm_head beside tied embeddings) loads, as
// transformers loads it, with a warning naming them; the rotary tables some checkpoints carry are not counted.
TEST(Weights, TensorsTheConfigLeavesUnusedAreNamed) {
  TempDir dir;
  mk::ModelWeights two_layers = mk::random_weights(micro_config(false), 12);
  std::vector<mk::TensorToWrite> tensors = to_write(two_layers);
  const std::vector<mk::bf16> inv_freq(4, mk::to_bf16(1.0f));
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", mk::DType::kBF16, {4}, as_bytes(inv_freq)});
  mk::write_safetensors(dir.path() / "model.safetensors", tensors);

  const mk::ModelWeights whole = mk::load_weights(dir.path(), two_layers.config);
  EXPECT_TRUE(whole.unused_tensors.empty());
  EXPECT_EQ(mk::unused_tensors_warning(dir.path(), whole), "");

  mk::ModelConfig one_layer = two_layers.config;
  one_layer.n_layers = 1;
  const mk::ModelWeights truncated = mk::load_weights(dir.path(), one_layer);
  ASSERT_EQ(truncated.unused_tensors.size(), 9u);  // layer 1's nine tensors
  for (const std::string& name : truncated.unused_tensors) EXPECT_TRUE(name.starts_with("model.layers.1.")) << name;
  const std::string warning = mk::unused_tensors_warning(dir.path(), truncated);
  EXPECT_THAT(warning, HasSubstr("9 tensor(s)"));
  EXPECT_THAT(warning, HasSubstr("model.layers.1.input_layernorm.weight"));
  EXPECT_THAT(warning, HasSubstr("num_hidden_layers (1)"));

  mk::ModelConfig tied = two_layers.config;
  tied.tie_word_embeddings = true;
  EXPECT_EQ(mk::load_weights(dir.path(), tied).unused_tensors, std::vector<std::string>{"lm_head.weight"});
}

TEST(Weights, ShardIndexErrors) {
  TempDir dir;
  const std::filesystem::path index = dir.path() / "model.safetensors.index.json";
  const mk::ModelConfig config = micro_config(false);

  std::ofstream(index) << "{\"weight_map\": ";
  EXPECT_THAT(error_of([&] { mk::load_weights(dir.path(), config); }), HasSubstr("not valid JSON"));

  std::ofstream(index) << R"({"metadata": {}})";
  EXPECT_THAT(error_of([&] { mk::load_weights(dir.path(), config); }), HasSubstr("missing object 'weight_map'"));

  std::ofstream(index) << R"({"weight_map": {"model.embed_tokens.weight": 3}})";
  EXPECT_THAT(error_of([&] { mk::load_weights(dir.path(), config); }), HasSubstr("is not a file name"));

  // A shard the index names but that is not there: the error names the shard file.
  std::ofstream(index) << R"({"weight_map": {"model.embed_tokens.weight": "gone.safetensors"}})";
  std::string message = error_of([&] { mk::load_weights(dir.path(), config); });
  EXPECT_THAT(message, HasSubstr("gone.safetensors"));
  EXPECT_THAT(message, HasSubstr("cannot open"));
}

TEST(Weights, WeightMapCannotLeaveTheModelDirectory) {
  TempDir dir;
  const mk::ModelConfig config = micro_config(false);
  mk::ModelWeights weights = mk::random_weights(config, 2);
  // A real, loadable file outside the model directory: only the path check can stop it.
  std::filesystem::create_directories(dir.path() / "model");
  mk::write_safetensors(dir.path() / "outside.safetensors", to_write(weights));
  for (const std::string& target :
       std::vector<std::string>{"../outside.safetensors", (dir.path() / "outside.safetensors").string(), ".."}) {
    nlohmann::json weight_map = nlohmann::json::object();
    for (const auto& [name, tensor] : tensors_of(weights)) weight_map[name] = target;
    std::ofstream(dir.path() / "model" / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}};
    const std::string message = error_of([&] { mk::load_weights(dir.path() / "model", config); });
    EXPECT_THAT(message, HasSubstr("points outside the model directory")) << target;
    EXPECT_THAT(message, HasSubstr(target));
  }
}

TEST(Weights, MissingTensorIsNamed) {
  TempDir dir;
  mk::ModelWeights weights = mk::random_weights(micro_config(false), 4);
  const std::string dropped = "model.layers.1.self_attn.v_proj.weight";
  mk::write_safetensors(dir.path() / "model.safetensors",
                        to_write(weights, [&](const std::string& name) { return name != dropped; }));
  const std::string message = error_of([&] { mk::load_weights(dir.path(), weights.config); });
  EXPECT_THAT(message, HasSubstr("missing tensor '" + dropped + "'"));
  EXPECT_THAT(message, HasSubstr((dir.path() / "model.safetensors").string()));
}

TEST(Weights, MisshapedTensorNamesBothShapes) {
  TempDir dir;
  mk::ModelWeights weights = mk::random_weights(micro_config(false), 5);
  std::vector<mk::TensorToWrite> tensors = to_write(weights);
  // down_proj stored transposed: the same number of values, so only the shape check can catch it.
  for (mk::TensorToWrite& tensor : tensors)
    if (tensor.name == "model.layers.0.mlp.down_proj.weight") tensor.shape = {48, 32};
  mk::write_safetensors(dir.path() / "model.safetensors", tensors);
  std::string message = error_of([&] { mk::load_weights(dir.path(), weights.config); });
  EXPECT_THAT(message, HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight' has shape [48, 32], expected [32, 48]"));
}

TEST(Weights, MissingModelFiles) {
  TempDir dir;
  const std::string message = error_of([&] { mk::load_weights(dir.path(), micro_config(false)); });
  EXPECT_THAT(message, HasSubstr(dir.path().string()));
  EXPECT_THAT(message, HasSubstr("neither model.safetensors nor model.safetensors.index.json exists"));
}

TEST(Weights, InvalidConfigIsRejectedBeforeLoading) {
  TempDir dir;
  mk::ModelConfig bad = micro_config(false);
  bad.n_kv_heads = 3;
  EXPECT_THAT(error_of([&] { mk::load_weights(dir.path(), bad); }), HasSubstr("num_key_value_heads"));
  EXPECT_THAT(error_of([&] { mk::random_weights(bad, 1); }), HasSubstr("num_key_value_heads"));
}

TEST(Weights, FoldingANormWeightScalesEachColumn) {
  auto bf16s = [](std::vector<float> values) {
    std::vector<mk::bf16> out;
    for (float v : values) out.push_back(mk::to_bf16(v));
    return out;
  };
  const std::vector<mk::bf16> folded = mk::fold_norm_weight(bf16s({1.5f, -2.0f, 0.25f, 3.0f}), bf16s({2.0f, 0.5f}));
  ASSERT_EQ(folded.size(), 4u);
  const std::vector<float> expected = {3.0f, -1.0f, 0.5f, 1.5f};  // (2 rows, 2 columns) times (2, 0.5) per column
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(mk::to_float(folded[i]), expected[i]) << i;
  EXPECT_THAT(error_of([&] { mk::fold_norm_weight(bf16s({1, 2, 3}), bf16s({1, 2})); }), HasSubstr("folding"));
}

// The gpu engine's weights (norms folded into the matrices after them) compute the same model within the tolerance
// policy, tied embeddings or not; a norm weight dropped instead of folded would not (they are drawn in [0.5, 1.5]).
TEST(Weights, FoldedNormWeightsKeepTheModelsFunction) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    mk::ModelConfig config = mk::find_preset("tiny").config;
    config.tie_word_embeddings = tied;
    const mk::ModelWeights weights = mk::random_weights(config, 7);
    const mk::ModelWeights folded = mk::fold_norm_weights(weights);
    // The same model to a schedule (the gpu test's bisect runs its cpu-vm on these), the LM head a matrix of its own.
    EXPECT_EQ(mk::first_difference(folded.config, config), "");
    EXPECT_EQ(&folded.lm_head_matrix(), &folded.lm_head);
    EXPECT_EQ(folded.lm_head.size(), weights.lm_head_matrix().size());
    std::vector<const std::vector<mk::bf16>*> norms = {&folded.final_norm};
    for (const mk::LayerWeights& layer : folded.layers) norms.insert(norms.end(), {&layer.attn_norm, &layer.mlp_norm});
    for (const std::vector<mk::bf16>* norm : norms) {
      ASSERT_EQ(norm->size(), size_t(config.d_model));
      for (mk::bf16 g : *norm) ASSERT_EQ(mk::to_float(g), 1.0f);
    }
    const mk::ref::ModelInput input = mk::ref::random_input(config, {2, 24}, 8);
    const mk::TolerancePolicy policy = mk::check_tolerance(mk::ref::forward(folded, input), weights, input);
    EXPECT_TRUE(policy.passed) << policy.describe();
  }
}

TEST(Weights, TiedEmbeddingsNeedNoLmHead) {
  TempDir dir;
  const mk::ModelConfig config = micro_config(true);
  const mk::ModelWeights saved = mk::random_weights(config, 6);
  EXPECT_TRUE(saved.lm_head.empty());
  EXPECT_EQ(&saved.lm_head_matrix(), &saved.embedding);
  EXPECT_EQ(tensors_of(saved).count("lm_head.weight"), 0u);

  mk::save_hf_model(dir.path(), saved);
  {
    mk::SafetensorsFile file(dir.path() / "model.safetensors");
    EXPECT_EQ(file.find("lm_head.weight"), nullptr);
    EXPECT_NE(file.find("model.embed_tokens.weight"), nullptr);
  }
  const mk::ModelConfig loaded_config = mk::load_model_config(dir.path() / "config.json");
  EXPECT_TRUE(loaded_config.tie_word_embeddings);
  const mk::ModelWeights loaded = mk::load_weights(dir.path(), loaded_config);
  expect_bitwise_equal(saved, loaded);
  EXPECT_TRUE(loaded.lm_head.empty());
  EXPECT_EQ(loaded.lm_head_matrix().size(), size_t(config.vocab_size * config.d_model));

  // The untied model does need it.
  mk::ModelConfig untied = loaded_config;
  untied.tie_word_embeddings = false;
  EXPECT_THAT(error_of([&] { mk::load_weights(dir.path(), untied); }), HasSubstr("missing tensor 'lm_head.weight'"));
}

TEST(Weights, LoadConvertsF32Checkpoints) {
  TempDir dir;
  mk::ModelWeights weights = mk::random_weights(micro_config(false), 9);
  // Store everything as F32 (exactly the bf16 values widened): loading must narrow back to the same bits.
  std::vector<std::vector<float>> storage;
  std::vector<mk::TensorToWrite> tensors;
  mk::for_each_weight(weights, [&](const std::string& name, const std::vector<int64_t>& shape,
                                   std::vector<mk::bf16>& data) {
    std::vector<float>& wide = storage.emplace_back();
    for (mk::bf16 value : data) wide.push_back(mk::to_float(value));
    tensors.push_back({name, mk::DType::kF32, shape,
                       {reinterpret_cast<const uint8_t*>(wide.data()), wide.size() * sizeof(float)}});
  });
  mk::write_safetensors(dir.path() / "model.safetensors", tensors);
  expect_bitwise_equal(weights, mk::load_weights(dir.path(), weights.config));
}
