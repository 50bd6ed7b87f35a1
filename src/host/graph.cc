// Graph: the tile tasks of one forward pass, their regions and costs, and dependency derivation from the regions.
#include "mk/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "mk/check.h"

namespace mk {

namespace {

constexpr uint32_t kPerLayerBuffers = 6;  // attn_norm, qkv, attn, hidden_mid, mlp_norm, act

const char* buffer_kind_name(BufferKind kind) {
  switch (kind) {
    case BufferKind::kTokens: return "tokens";
    case BufferKind::kHidden: return "hidden";
    case BufferKind::kAttnNorm: return "attn_norm";
    case BufferKind::kQkv: return "qkv";
    case BufferKind::kAttn: return "attn";
    case BufferKind::kHiddenMid: return "hidden_mid";
    case BufferKind::kMlpNorm: return "mlp_norm";
    case BufferKind::kAct: return "act";
    case BufferKind::kFinalNorm: return "final_norm";
    case BufferKind::kLogits: return "logits";
  }
  return "?";
}

int32_t ceil_div(int64_t a, int64_t b) { return int32_t((a + b - 1) / b); }

}  // namespace

const char* opcode_name(Opcode opcode) {
  switch (opcode) {
    case Opcode::kNop: return "nop";
    case Opcode::kEmbed: return "embed";
    case Opcode::kAttnNorm: return "attn_norm";
    case Opcode::kQkv: return "qkv";
    case Opcode::kAttention: return "attention";
    case Opcode::kOProj: return "o_proj";
    case Opcode::kMlpNorm: return "mlp_norm";
    case Opcode::kGateUp: return "gate_up";
    case Opcode::kDown: return "down";
    case Opcode::kFinalNorm: return "final_norm";
    case Opcode::kLmHead: return "lm_head";
    case Opcode::kNumOpcodes: break;
  }
  return "invalid";
}

std::string Buffer::name() const {
  if (layer < 0) return buffer_kind_name(kind);
  return fmt::format("{}[{}]", buffer_kind_name(kind), layer);
}

Graph::Graph(const ModelConfig& config, const RunShape& shape, const TileConfig& tiles)
    : config_(config), shape_(shape), tiles_(tiles) {
  config.validate();
  const ModelConfig& c = config_;
  const int64_t T = shape.tokens();
  MK_CHECK(shape.batch > 0 && shape.seq_len > 0, "batch ({}) and sequence length ({}) must be positive", shape.batch,
           shape.seq_len);
  MK_CHECK(T < (int64_t(1) << 30), "{} tokens are more than the 2^30 one schedule addresses", T);
  // Layers are 16-bit in instructions (65535 marks tasks outside the layers); columns and rows are 32-bit.
  MK_CHECK(c.n_layers < 65535, "model '{}': {} layers are more than the 65534 one schedule addresses", c.name,
           c.n_layers);
  for (auto [value, field] : {std::pair{c.d_model, "hidden_size"}, std::pair{c.qkv_dim(), "(heads + 2 kv heads) * head_dim"},
                              std::pair{c.d_ff, "intermediate_size"}, std::pair{c.vocab_size, "vocab_size"}}) {
    MK_CHECK(value < (int64_t(1) << 30), "model '{}': {} {} is more than the 2^30 columns one schedule addresses",
             c.name, field, value);
  }
  MK_CHECK(tiles.block_m > 0 && tiles.block_n > 0 && tiles.block_n_wide > 0 && tiles.block_k > 0 && tiles.block_q > 0 &&
               tiles.block_rows > 0 && tiles.group_m > 0,
           "tile sizes must be positive");
  for (auto [value, field] : {std::pair{c.d_model, "hidden_size"}, std::pair{c.q_dim(), "num_heads * head_dim"},
                              std::pair{c.d_ff, "intermediate_size"}}) {
    MK_CHECK(value % tiles.block_k == 0,
             "model '{}': {} ({}) must be a multiple of {} (the GEMM K step); this tiling cannot serve it", c.name,
             field, value, tiles.block_k);
  }
  MK_CHECK(c.head_dim == 64 || c.head_dim == 128,
           "model '{}': head_dim {} is not supported: attention tiles and the RoPE epilogue need 64 or 128", c.name,
           c.head_dim);
  MK_CHECK(tiles.block_n_wide % c.head_dim == 0,
           "model '{}': qkv tiles of {} columns must hold whole heads of {} for RoPE in the QKV epilogue", c.name,
           tiles.block_n_wide, c.head_dim);
  if (c.rope.type != RopeType::kNone) {
    MK_CHECK(shape.seq_len <= c.max_position_embeddings,
             "sequence length {} exceeds the model's max_position_embeddings {}", shape.seq_len,
             c.max_position_embeddings);
  }

  // Buffers: tokens, hidden[0..n_layers], then kPerLayerBuffers per layer, then final_norm and logits.
  buffers_.push_back({BufferKind::kTokens, -1, T, 1, true});
  for (int32_t l = 0; l <= c.n_layers; ++l)
    buffers_.push_back({BufferKind::kHidden, l, T, c.d_model, l == 0 && !c.has_embedding});
  first_layer_buffer_ = uint32_t(buffers_.size());
  for (int32_t l = 0; l < c.n_layers; ++l) {
    buffers_.push_back({BufferKind::kAttnNorm, l, T, c.d_model, false});
    buffers_.push_back({BufferKind::kQkv, l, T, c.qkv_dim(), false});
    buffers_.push_back({BufferKind::kAttn, l, T, c.q_dim(), false});
    buffers_.push_back({BufferKind::kHiddenMid, l, T, c.d_model, false});
    buffers_.push_back({BufferKind::kMlpNorm, l, T, c.d_model, false});
    buffers_.push_back({BufferKind::kAct, l, T, c.d_ff, false});
  }
  if (c.has_lm_head) {
    buffers_.push_back({BufferKind::kFinalNorm, -1, T, c.d_model, false});
    buffers_.push_back({BufferKind::kLogits, -1, T, c.vocab_size, false});
  }

  // Tasks in a topological order: op after op, layer after layer.
  const int32_t num_m_blocks = ceil_div(T, tiles.block_m);
  auto row_tiles = [&](Opcode opcode, int32_t layer, int64_t width) {
    for (int32_t row_begin = 0; row_begin < T; row_begin += tiles.block_rows) {
      const int32_t row_end = int32_t(std::min<int64_t>(T, row_begin + tiles.block_rows));
      tasks_.push_back({opcode, uint16_t(layer), row_begin, row_end, 0, int32_t(width), -1, -1});
    }
  };
  // k: the reduction length; weight_rows: rows of the op's weight matrix (gate_up reads two per output column)
  auto gemm_tiles = [&](Opcode opcode, int32_t layer, int64_t n, int32_t block_n, int64_t k, int64_t weight_rows) {
    const int32_t group_m = 2 * weight_rows * k > tiles.l2_resident_weight_bytes ? tiles.group_m : 1;
    for (int32_t group = 0; group < num_m_blocks; group += group_m) {
      const int32_t group_end = std::min(num_m_blocks, group + group_m);
      for (int64_t col_begin = 0; col_begin < n; col_begin += block_n) {
        const int32_t col_end = int32_t(std::min<int64_t>(n, col_begin + block_n));
        for (int32_t m = group; m < group_end; ++m) {
          const int32_t row_begin = m * tiles.block_m;
          const int32_t row_end = int32_t(std::min<int64_t>(T, row_begin + tiles.block_m));
          tasks_.push_back({opcode, uint16_t(layer), row_begin, row_end, int32_t(col_begin), col_end, -1, -1});
        }
      }
    }
  };
  if (c.has_embedding) row_tiles(Opcode::kEmbed, 0, c.d_model);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    row_tiles(Opcode::kAttnNorm, l, c.d_model);
    gemm_tiles(Opcode::kQkv, l, c.qkv_dim(), tiles.block_n_wide, c.d_model, c.qkv_dim());
    for (int32_t b = 0; b < shape.batch; ++b) {
      for (int64_t q = 0; q < shape.seq_len; q += tiles.block_q) {
        const int32_t row_begin = int32_t(b * shape.seq_len + q);
        const int32_t row_end = int32_t(b * shape.seq_len + std::min<int64_t>(shape.seq_len, q + tiles.block_q));
        for (int32_t h = 0; h < c.n_heads; ++h) {
          const int32_t col_begin = int32_t(h * c.head_dim);
          tasks_.push_back({Opcode::kAttention, uint16_t(l), row_begin, row_end, col_begin,
                            int32_t(col_begin + c.head_dim), b, h});
        }
      }
    }
    gemm_tiles(Opcode::kOProj, l, c.d_model, tiles.block_n, c.q_dim(), c.d_model);
    row_tiles(Opcode::kMlpNorm, l, c.d_model);
    gemm_tiles(Opcode::kGateUp, l, c.d_ff, tiles.block_n, c.d_model, 2 * c.d_ff);
    gemm_tiles(Opcode::kDown, l, c.d_model, tiles.block_n, c.d_ff, c.d_model);
  }
  if (c.has_lm_head) {
    row_tiles(Opcode::kFinalNorm, -1, c.d_model);
    gemm_tiles(Opcode::kLmHead, -1, c.vocab_size, tiles.block_n_wide, c.d_model, c.vocab_size);
  }
}

uint32_t Graph::buffer_id(BufferKind kind, int32_t layer) const {
  switch (kind) {
    case BufferKind::kTokens: return 0;
    case BufferKind::kHidden: return uint32_t(1 + layer);
    case BufferKind::kAttnNorm:
    case BufferKind::kQkv:
    case BufferKind::kAttn:
    case BufferKind::kHiddenMid:
    case BufferKind::kMlpNorm:
    case BufferKind::kAct:
      return first_layer_buffer_ + uint32_t(layer) * kPerLayerBuffers + (uint32_t(kind) - uint32_t(BufferKind::kAttnNorm));
    case BufferKind::kFinalNorm: return first_layer_buffer_ + uint32_t(config_.n_layers) * kPerLayerBuffers;
    case BufferKind::kLogits: return first_layer_buffer_ + uint32_t(config_.n_layers) * kPerLayerBuffers + 1;
  }
  throw Error("internal error: unknown buffer kind");
}

uint32_t Graph::output_buffer() const {
  return config_.has_lm_head ? buffer_id(BufferKind::kLogits) : buffer_id(BufferKind::kHidden, int32_t(config_.n_layers));
}

TaskRegions Graph::regions(const Task& t) const {
  const ModelConfig& c = config_;
  const int32_t layer = t.layer;
  TaskRegions r;
  auto rows_of = [&](uint32_t buffer, int32_t col_begin, int32_t col_end) {
    return Region{buffer, t.row_begin, t.row_end, col_begin, col_end};
  };
  auto full_rows = [&](BufferKind kind, int32_t buffer_layer) {
    const uint32_t id = buffer_id(kind, buffer_layer);
    return rows_of(id, 0, int32_t(buffers_[id].cols));
  };
  auto read = [&](Region region) { r.reads[r.num_reads++] = region; };
  const Region own_cols{0, t.row_begin, t.row_end, t.col_begin, t.col_end};
  auto write_own = [&](BufferKind kind, int32_t buffer_layer) {
    r.write = own_cols;
    r.write.buffer = buffer_id(kind, buffer_layer);
  };
  switch (t.opcode) {
    case Opcode::kEmbed:
      write_own(BufferKind::kHidden, 0);
      read(full_rows(BufferKind::kTokens, -1));
      break;
    case Opcode::kAttnNorm:
      write_own(BufferKind::kAttnNorm, layer);
      read(full_rows(BufferKind::kHidden, layer));
      break;
    case Opcode::kQkv:
      write_own(BufferKind::kQkv, layer);
      read(full_rows(BufferKind::kAttnNorm, layer));
      break;
    case Opcode::kAttention: {
      write_own(BufferKind::kAttn, layer);
      const uint32_t qkv = buffer_id(BufferKind::kQkv, layer);
      const int32_t kv_head = t.head / int32_t(c.group_size());
      const int32_t k_col = int32_t(c.q_dim() + kv_head * c.head_dim);
      const int32_t v_col = int32_t(c.q_dim() + c.kv_dim() + kv_head * c.head_dim);
      const int32_t sequence_begin = int32_t(t.sequence * shape_.seq_len);
      const int32_t hd = int32_t(c.head_dim);
      read(rows_of(qkv, t.col_begin, t.col_end));                      // q of this head and query block
      read({qkv, sequence_begin, t.row_end, k_col, k_col + hd});      // causal: keys up to the last query
      read({qkv, sequence_begin, t.row_end, v_col, v_col + hd});
      break;
    }
    case Opcode::kOProj:
      write_own(BufferKind::kHiddenMid, layer);
      read(full_rows(BufferKind::kAttn, layer));
      read(rows_of(buffer_id(BufferKind::kHidden, layer), t.col_begin, t.col_end));
      break;
    case Opcode::kMlpNorm:
      write_own(BufferKind::kMlpNorm, layer);
      read(full_rows(BufferKind::kHiddenMid, layer));
      break;
    case Opcode::kGateUp:
      write_own(BufferKind::kAct, layer);
      read(full_rows(BufferKind::kMlpNorm, layer));
      break;
    case Opcode::kDown:
      write_own(BufferKind::kHidden, layer + 1);
      read(full_rows(BufferKind::kAct, layer));
      read(rows_of(buffer_id(BufferKind::kHiddenMid, layer), t.col_begin, t.col_end));
      break;
    case Opcode::kFinalNorm:
      write_own(BufferKind::kFinalNorm, -1);
      read(full_rows(BufferKind::kHidden, int32_t(c.n_layers)));
      break;
    case Opcode::kLmHead:
      write_own(BufferKind::kLogits, -1);
      read(full_rows(BufferKind::kFinalNorm, -1));
      break;
    case Opcode::kNop:
    case Opcode::kNumOpcodes:
      throw Error(fmt::format("task has no regions: opcode {}", int(t.opcode)));
  }
  return r;
}

TaskWork Graph::work(const Task& t) const {
  const ModelConfig& c = config_;
  const double rows = t.row_end - t.row_begin;
  const double cols = t.col_end - t.col_begin;
  auto gemm = [&](double k, double weight_rows, bool residual) {
    return TaskWork{2.0 * rows * weight_rows * k, 2.0 * (rows + weight_rows) * k + 2.0 * rows * cols * (residual ? 2 : 1)};
  };
  switch (t.opcode) {
    case Opcode::kEmbed:
    case Opcode::kAttnNorm:
    case Opcode::kMlpNorm:
    case Opcode::kFinalNorm:
      return {4.0 * rows * cols, 4.0 * rows * cols};
    case Opcode::kQkv: return gemm(double(c.d_model), cols, false);
    case Opcode::kOProj: return gemm(double(c.q_dim()), cols, true);
    case Opcode::kGateUp: return gemm(double(c.d_model), 2 * cols, false);
    case Opcode::kDown: return gemm(double(c.d_ff), cols, true);
    case Opcode::kLmHead: return gemm(double(c.d_model), cols, false);
    case Opcode::kAttention: {
      const double first_query = t.row_begin - double(t.sequence) * shape_.seq_len;
      const double keys = first_query + (rows + 1) / 2;  // mean keys per query under the causal mask
      return {4.0 * rows * keys * c.head_dim, 2.0 * c.head_dim * (2.0 * rows + 2.0 * (first_query + rows))};
    }
    case Opcode::kNop:
    case Opcode::kNumOpcodes: break;
  }
  return {};
}

std::string Graph::describe(const Task& t) const {
  std::string where = t.opcode == Opcode::kAttention ? fmt::format(" seq {} head {}", t.sequence, t.head) : "";
  std::string layer = is_after_layers(t.opcode) ? "" : fmt::format(" L{}", t.layer);
  return fmt::format("{}{}{} rows [{},{}) cols [{},{})", opcode_name(t.opcode), layer, where, t.row_begin, t.row_end,
                     t.col_begin, t.col_end);
}

Dependencies derive_dependencies(const Graph& graph) {
  const std::vector<Task>& tasks = graph.tasks();
  Dependencies deps;
  deps.counter_of_task.resize(tasks.size());

  // Counters: the tasks of one op and layer that write the same rows.
  struct CounterKey {
    Opcode opcode;
    uint16_t layer;
    int32_t row_begin;
    int32_t row_end;
    bool operator==(const CounterKey&) const = default;
  };
  struct CounterKeyHash {
    size_t operator()(const CounterKey& k) const {
      return (size_t(k.opcode) * 0x9e3779b97f4a7c15ull) ^ (size_t(k.layer) << 40) ^ (size_t(k.row_begin) << 20) ^
             size_t(k.row_end);
    }
  };
  std::unordered_map<CounterKey, uint32_t, CounterKeyHash> counter_of_key;
  // One band per counter: the rectangle of one buffer its tasks write.
  struct Band {
    int32_t row_begin, row_end, col_begin, col_end;
    uint32_t counter;
  };
  std::vector<std::vector<Band>> bands_of_buffer(graph.buffers().size());
  std::vector<std::pair<uint32_t, uint32_t>> band_of_counter;  // (buffer, index in its band list)

  CounterKey previous_key{Opcode::kNop, 0, 0, 0};
  uint32_t previous_counter = std::numeric_limits<uint32_t>::max();
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Task& t = tasks[i];
    const CounterKey key{t.opcode, t.layer, t.row_begin, t.row_end};
    uint32_t counter;
    if (i > 0 && key == previous_key) {
      counter = previous_counter;  // NOTE: tasks of a counter are generated consecutively; skip the hash lookup
    } else {
      auto [it, inserted] = counter_of_key.try_emplace(key, deps.num_counters);
      if (inserted) {
        ++deps.num_counters;
        deps.counter_target.push_back(0);
        const Region write = graph.regions(t).write;
        band_of_counter.emplace_back(write.buffer, uint32_t(bands_of_buffer[write.buffer].size()));
        bands_of_buffer[write.buffer].push_back({write.row_begin, write.row_end, write.col_begin, write.col_end, it->second});
      }
      counter = it->second;
    }
    deps.counter_of_task[i] = counter;
    ++deps.counter_target[counter];
    Band& band = bands_of_buffer[band_of_counter[counter].first][band_of_counter[counter].second];
    band.col_begin = std::min(band.col_begin, t.col_begin);
    band.col_end = std::max(band.col_end, t.col_end);
    previous_key = key;
    previous_counter = counter;
  }
  for (auto& bands : bands_of_buffer) {
    std::sort(bands.begin(), bands.end(), [](const Band& a, const Band& b) { return a.row_begin < b.row_begin; });
    for (size_t i = 1; i < bands.size(); ++i)
      MK_CHECK(bands[i].row_begin >= bands[i - 1].row_end, "internal error: counters of one buffer overlap in rows");
  }

  // Waits: every counter whose band intersects a region the task reads.
  deps.wait_begin.resize(tasks.size());
  deps.num_waits.resize(tasks.size());
  std::vector<uint32_t> counters;
  std::vector<uint32_t> previous_counters;
  // Identical wait lists are stored once: tasks of one row block of a GEMM share theirs even when, grouped for L2
  // reuse, they are not neighbours. Keyed by a hash of the list; equal hashes are compared in full.
  std::unordered_multimap<uint64_t, uint32_t> list_by_hash;  // hash -> wait_begin
  auto hash_of = [](const std::vector<uint32_t>& list) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t v : list) h = (h ^ v) * 0x100000001b3ull;
    return h;
  };
  auto find_list = [&](uint64_t hash) -> int64_t {
    auto [begin, end] = list_by_hash.equal_range(hash);
    for (auto it = begin; it != end; ++it) {
      bool same = true;
      for (size_t k = 0; k < counters.size() && same; ++k) same = deps.waits[it->second + k].counter == counters[k];
      if (same) return it->second;
    }
    return -1;
  };
  for (size_t i = 0; i < tasks.size(); ++i) {
    const TaskRegions regions = graph.regions(tasks[i]);
    counters.clear();
    for (int r = 0; r < regions.num_reads; ++r) {
      const Region& read = regions.reads[r];
      const std::vector<Band>& bands = bands_of_buffer[read.buffer];
      auto band = std::upper_bound(bands.begin(), bands.end(), read.row_begin,
                                   [](int32_t row, const Band& b) { return row < b.row_end; });
      for (; band != bands.end() && band->row_begin < read.row_end; ++band) {
        if (band->col_begin < read.col_end && read.col_begin < band->col_end) counters.push_back(band->counter);
      }
    }
    std::sort(counters.begin(), counters.end());
    counters.erase(std::unique(counters.begin(), counters.end()), counters.end());
    if (i > 0 && counters == previous_counters) {
      deps.wait_begin[i] = deps.wait_begin[i - 1];
    } else {
      // The hash includes the length: lists of different lengths never compare equal.
      const uint64_t hash = hash_of(counters) ^ (uint64_t(counters.size()) << 56);
      const int64_t existing = find_list(hash);
      if (existing >= 0) {
        deps.wait_begin[i] = uint32_t(existing);
      } else {
        deps.wait_begin[i] = uint32_t(deps.waits.size());
        for (uint32_t counter : counters) deps.waits.push_back({counter, deps.counter_target[counter]});
        list_by_hash.emplace(hash, deps.wait_begin[i]);
      }
      previous_counters = counters;
    }
    deps.num_waits[i] = uint32_t(counters.size());
  }
  return deps;
}

}  // namespace mk
