// What the GPU tests share: the fixture that skips without a usable Hopper GPU, and small model configurations.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "mk/check.h"
#include "mk/gpu.h"
#include "mk/model_config.h"
#include "mk/schedule.h"

namespace mk {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    info_ = query_gpu();
    if (!info_.usable) GTEST_SKIP() << "no suitable GPU: " << info_.reason;
  }
  Schedule schedule_for(const Graph& graph, SchedulePolicy policy = SchedulePolicy::kCostModel) const {
    return make_schedule(graph, derive_dependencies(graph), policy, info_.sm_count);
  }
  GpuInfo info_;
};

inline ModelConfig small_config(int64_t d_model, int64_t d_ff, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                bool rope, bool embedding_and_head, int64_t n_layers = 2) {
  ModelConfig c;
  c.name = fmt::format("d{}-ff{}-h{}-kv{}-hd{}{}{}", d_model, d_ff, n_heads, n_kv_heads, head_dim, rope ? "-rope" : "",
                       embedding_and_head ? "-lm" : "");
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.vocab_size = 1000;
  c.max_position_embeddings = 4096;
  c.rope = rope ? RopeConfig{RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 128} : RopeConfig{};
  c.has_embedding = embedding_and_head;
  c.has_lm_head = embedding_and_head;
  c.validate();
  return c;
}

// A wait that can never be met, planted on the first instruction of `opcode` that waits: one signal more than its
// first counter ever gets. The task and counter a stall report must then name.
struct PlantedWait {
  bool planted = false;
  uint32_t task = 0;
  uint32_t counter = 0;
};

inline PlantedWait plant_missing_signal(Schedule& schedule, Opcode opcode) {
  for (Instruction& in : schedule.instructions) {
    if (in.opcode != opcode || in.num_waits == 0) continue;
    const Wait original = schedule.waits[in.wait_begin];
    schedule.waits.push_back({original.counter, original.target + 1});
    in.wait_begin = uint32_t(schedule.waits.size() - 1);
    in.num_waits = 1;
    return {true, in.task, original.counter};
  }
  return {};
}

// What one run of `gpu` throws ("" when it succeeds).
inline std::string error_of_run(GpuEngine& gpu) {
  try {
    gpu.run();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace mk
