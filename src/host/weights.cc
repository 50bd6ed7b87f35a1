// Model weights: the Hugging Face name mapping, random initialization, safetensors loading (sharded too) and saving.
#include "mk/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "mk/check.h"
#include "mk/files.h"
#include "mk/limits.h"
#include "mk/parallel.h"
#include "mk/random.h"
#include "mk/safetensors.h"

namespace mk {

void for_each_weight(ModelWeights& weights, const WeightVisitor& visit) {
  const ModelConfig& c = weights.config;
  if (c.has_embedding) visit("model.embed_tokens.weight", {c.vocab_size, c.d_model}, weights.embedding);
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    LayerWeights& w = weights.layers[size_t(layer)];
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    visit(prefix + "input_layernorm.weight", {c.d_model}, w.attn_norm);
    visit(prefix + "self_attn.q_proj.weight", {c.q_dim(), c.d_model}, w.wq);
    visit(prefix + "self_attn.k_proj.weight", {c.kv_dim(), c.d_model}, w.wk);
    visit(prefix + "self_attn.v_proj.weight", {c.kv_dim(), c.d_model}, w.wv);
    visit(prefix + "self_attn.o_proj.weight", {c.d_model, c.q_dim()}, w.wo);
    visit(prefix + "post_attention_layernorm.weight", {c.d_model}, w.mlp_norm);
    visit(prefix + "mlp.gate_proj.weight", {c.d_ff, c.d_model}, w.w_gate);
    visit(prefix + "mlp.up_proj.weight", {c.d_ff, c.d_model}, w.w_up);
    visit(prefix + "mlp.down_proj.weight", {c.d_model, c.d_ff}, w.w_down);
  }
  if (c.has_lm_head) {
    visit("model.norm.weight", {c.d_model}, weights.final_norm);
    if (!c.tie_word_embeddings) visit("lm_head.weight", {c.vocab_size, c.d_model}, weights.lm_head);
  }
}

namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) count = checked_mul(count, dim, "a weight's element count");
  return count;
}

ModelWeights empty_weights(const ModelConfig& config) {
  config.validate();
  ModelWeights weights;
  weights.config = config;
  weights.layers.resize(size_t(config.n_layers));
  return weights;
}

}  // namespace

int64_t parameter_count(const ModelConfig& config) {
  ModelWeights shapes = empty_weights(config);  // no data: only the shapes are visited
  int64_t count = 0;
  for_each_weight(shapes, [&](const std::string&, const std::vector<int64_t>& shape, std::vector<bf16>&) {
    count = checked_add(count, product(shape), "the parameter count");
  });
  return count;
}

std::vector<bf16> fold_norm_weight(const std::vector<bf16>& matrix, const std::vector<bf16>& norm_weight) {
  const int64_t k = int64_t(norm_weight.size()), rows = k > 0 ? int64_t(matrix.size()) / k : 0;
  MK_CHECK(rows * k == int64_t(matrix.size()), "folding a norm weight of {} into a matrix of {} elements", k,
           matrix.size());
  std::vector<bf16> out(matrix.size());
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const bf16* in = matrix.data() + row * k;  // (k)
      bf16* scaled = out.data() + row * k;       // (k)
      for (int64_t col = 0; col < k; ++col) scaled[col] = to_bf16(to_float(in[col]) * to_float(norm_weight[col]));
    }
  });
  return out;
}

LayerWeights fold_norm_weights(LayerWeights layer) {
  for (std::vector<bf16>* matrix : {&layer.wq, &layer.wk, &layer.wv})
    *matrix = fold_norm_weight(*matrix, layer.attn_norm);
  for (std::vector<bf16>* matrix : {&layer.w_gate, &layer.w_up}) *matrix = fold_norm_weight(*matrix, layer.mlp_norm);
  layer.attn_norm.assign(layer.attn_norm.size(), to_bf16(1.0f));
  layer.mlp_norm.assign(layer.mlp_norm.size(), to_bf16(1.0f));
  return layer;
}

std::vector<bf16> folded_lm_head(const ModelWeights& weights) {
  return fold_norm_weight(weights.lm_head_matrix(), weights.final_norm);
}

double folded_lm_head_copy_bytes(const ModelConfig& config) {
  return config.tie_word_embeddings ? 2.0 * double(config.vocab_size) * double(config.d_model) : 0.0;
}

ModelWeights fold_norm_weights(const ModelWeights& weights) {
  ModelWeights out = weights;
  for (LayerWeights& layer : out.layers) layer = fold_norm_weights(std::move(layer));
  if (out.config.has_lm_head) {
    out.lm_head = folded_lm_head(weights);
    out.final_norm.assign(weights.final_norm.size(), to_bf16(1.0f));
  }
  return out;
}

// Each tensor draws from its own generator, element e being its draw e; the elements of all tensors are filled in
// ranges over the machine's cores (Random::skip), to the values one thread would draw. NOTE: one thread draws ~3.5 ns
// a value (2-core build machine): ~30 s for the Llama-3.1-8B shape's 8 billion, each `mk generate` call on the GPU
// machine spending them before it times anything.
ModelWeights random_weights(const ModelConfig& config, uint64_t seed, int max_threads) {
  struct Tensor {
    bf16* data;
    int64_t first;  // the tensor's first element among all tensors'
    uint64_t seed;
    bool is_norm;
  };
  ModelWeights weights = empty_weights(config);
  std::vector<Tensor> tensors;
  int64_t total = 0;
  for_each_weight(weights, [&](const std::string&, const std::vector<int64_t>& shape, std::vector<bf16>& data) {
    data.resize(size_t(product(shape)));
    tensors.push_back({data.data(), total, seed * 1000003 + tensors.size(), shape.size() == 1});
    total = checked_add(total, int64_t(data.size()), "the parameter count");
  });
  parallel_for(total, [&](int64_t begin, int64_t end) {
    auto tensor = std::upper_bound(tensors.begin(), tensors.end(), begin,
                                   [](int64_t element, const Tensor& t) { return element < t.first; }) - 1;
    for (int64_t element = begin; element < end; ++tensor) {
      const int64_t tensor_end = tensor + 1 == tensors.end() ? total : (tensor + 1)->first;
      Random random(tensor->seed);
      random.skip(uint64_t(element - tensor->first));
      for (; element < std::min(end, tensor_end); ++element) {
        tensor->data[element - tensor->first] =
            to_bf16(tensor->is_norm ? random.uniform(0.5f, 1.5f) : random.symmetric(0.02f));
      }
    }
  }, max_threads);
  return weights;
}

namespace {

constexpr uint64_t kMaxIndexJsonBytes = uint64_t(16) << 20;  // real ones list a few thousand tensors

// Where each tensor of a model directory lives: one model.safetensors, or the shards of the index.
struct WeightLayout {
  std::filesystem::path index_path;             // empty for a single file
  std::map<std::string, std::string> shard_of;  // tensor name -> shard file name, for an index
  std::vector<std::filesystem::path> files;     // every file the weights are read from
};

WeightLayout weight_layout(const std::filesystem::path& dir) {
  WeightLayout layout;
  const std::filesystem::path single = dir / "model.safetensors";
  if (std::filesystem::exists(single)) {
    layout.files.push_back(single);
    return layout;
  }
  layout.index_path = dir / "model.safetensors.index.json";
  const std::string index_name = layout.index_path.string();
  MK_CHECK(std::filesystem::exists(layout.index_path),
           "{}: neither model.safetensors nor model.safetensors.index.json exists", dir.string());
  const nlohmann::json index = read_json_file(layout.index_path, kMaxIndexJsonBytes);
  MK_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           "{}: missing object 'weight_map'", index_name);
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    MK_CHECK(shard.is_string(), "{}: weight_map entry '{}' is not a file name", index_name, printable(name));
    const std::string shard_name = shard.get<std::string>();
    MK_CHECK(
        !shard_name.empty() && shard_name.find('/') == std::string::npos && shard_name != "." && shard_name != "..",
        "{}: weight_map entry '{}' points outside the model directory: '{}'", index_name, printable(name),
        printable(shard_name));
    layout.shard_of[name] = shard_name;
    if (shards.insert(shard_name).second) layout.files.push_back(dir / shard_name);
  }
  return layout;
}

// Every tensor name of the layout's files but those used and the rotary tables some checkpoints carry (mk computes
// RoPE itself, as transformers does). Shards only the index names are not opened.
std::vector<std::string> unused_tensors(const WeightLayout& layout,
                                        const std::map<std::string, std::unique_ptr<SafetensorsFile>>& open_files,
                                        const std::set<std::string>& used) {
  std::vector<std::string> names;
  if (layout.index_path.empty()) {
    for (const TensorInfo& tensor : open_files.at("model.safetensors")->tensors()) names.push_back(tensor.name);
  } else {
    for (const auto& [name, shard] : layout.shard_of) names.push_back(name);
  }
  std::vector<std::string> unused;
  for (const std::string& name : names)
    if (!used.count(name) && !name.ends_with("rotary_emb.inv_freq")) unused.push_back(name);
  std::sort(unused.begin(), unused.end());
  return unused;
}

}  // namespace

std::vector<std::filesystem::path> weight_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files = weight_layout(dir).files;
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) files.push_back(index_path);
  return files;
}

std::vector<std::filesystem::path> model_dir_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (const char* config :
       {"config.json", "mk_config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    files.push_back(dir / config);
  for (std::filesystem::path& file : weight_files(dir)) files.push_back(std::move(file));
  return files;
}

ModelWeights load_weights(const std::filesystem::path& dir, const ModelConfig& config) {
  ModelWeights weights = empty_weights(config);
  const WeightLayout layout = weight_layout(dir);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open_files;
  auto file_for = [&](const std::string& name) -> const SafetensorsFile& {
    std::string file_name = "model.safetensors";
    if (!layout.index_path.empty()) {
      auto found = layout.shard_of.find(name);
      MK_CHECK(found != layout.shard_of.end(), "{}: tensor '{}' is missing from the weight_map",
               layout.index_path.string(), name);
      file_name = found->second;
    }
    auto& file = open_files[file_name];
    if (!file) file = std::make_unique<SafetensorsFile>(dir / file_name);
    return *file;
  };

  std::set<std::string> used;
  for_each_weight(weights, [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<bf16>& data) {
    used.insert(name);
    const SafetensorsFile& file = file_for(name);
    const TensorInfo* tensor = file.find(name);
    MK_CHECK(tensor != nullptr, "{}: missing tensor '{}'", file.path(), name);
    MK_CHECK(tensor->shape == shape, "{}: tensor '{}' has shape [{}], expected [{}]", file.path(), name,
             fmt::join(tensor->shape, ", "), fmt::join(shape, ", "));
    data = file.read_bf16(*tensor);
  });
  weights.unused_tensors = unused_tensors(layout, open_files, used);
  return weights;
}

std::string unused_tensors_warning(const std::filesystem::path& dir, const ModelWeights& weights) {
  const std::vector<std::string>& unused = weights.unused_tensors;
  if (unused.empty()) return "";
  constexpr size_t kNamesShown = 4;
  const std::vector<std::string> shown(unused.begin(), unused.begin() + std::min(unused.size(), kNamesShown));
  return fmt::format("{} holds {} tensor(s) the model's config leaves unused ({}{}): does its "
                     "num_hidden_layers ({}) or tie_word_embeddings match the weights?",
                     dir.string(), unused.size(), fmt::join(shown, ", "), unused.size() > kNamesShown ? ", ..." : "",
                     weights.config.n_layers);
}

namespace {

bool hf_can_describe(const ModelConfig& config) {
  return config.has_embedding && config.has_lm_head && config.rope.type != RopeType::kNone;
}

void make_directory(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  MK_CHECK(!error && std::filesystem::is_directory(dir), "{}: cannot create the directory: {}", dir.string(),
           error ? error.message() : "a file of that name exists");
}

void write_json(const std::filesystem::path& path, const nlohmann::json& json) {
  write_file(path, json.dump(2) + "\n");
}

void write_weights(const std::filesystem::path& dir, const ModelWeights& weights) {
  std::vector<TensorToWrite> tensors;
  // for_each_weight takes a mutable model; saving only reads it.
  for_each_weight(const_cast<ModelWeights&>(weights),
                  [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<bf16>& data) {
                    tensors.push_back({name, DType::kBF16, shape,
                                       {reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(bf16)}});
                  });
  write_safetensors(dir / "model.safetensors", tensors);
}

}  // namespace

void save_hf_model(const std::filesystem::path& dir, const ModelWeights& weights) {
  const nlohmann::json config_json = model_config_to_hf_json(weights.config);
  make_directory(dir);
  write_json(dir / "config.json", config_json);
  write_weights(dir, weights);
}

std::string save_model(const std::filesystem::path& dir, const ModelWeights& weights) {
  if (hf_can_describe(weights.config)) {
    save_hf_model(dir, weights);
    return "config.json";
  }
  make_directory(dir);
  write_json(dir / "mk_config.json", model_config_to_json(weights.config));
  write_weights(dir, weights);
  return "mk_config.json";
}

}  // namespace mk
