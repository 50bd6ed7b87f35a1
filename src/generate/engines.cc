// The decode engines: the reference (each pass op by op over whole outputs, include/mk/reference.h) and the cpu-vm
// (the verified prefill and decode schedules, the decode one built once and launched every step).
#include <fmt/format.h>

#include "mk/check.h"
#include "mk/generate.h"
#include "mk/graph.h"
#include "mk/kv_cache.h"
#include "decode_inputs.h"

namespace mk {

namespace {

using namespace decode_inputs;

class ReferenceDecoder final : public DecodeEngine {
 public:
  ReferenceDecoder(const ModelWeights& weights, const DecodeSetup& setup)
      : weights_(weights),
        setup_(checked(weights.config, setup)),
        operands_(weights, 1, setup.max_context),
        cache_(ref::make_kv_cache(weights.config, decode_shape(setup))) {}

  void prefill(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t first_sequence) override {
    const ref::ModelInput input = prefill_input(setup_, tokens, seq_len, first_sequence);
    const ref::ModelOperands operands(weights_, seq_len, input.shape.max_context);
    std::vector<ref::Matrix> part = part_cache(weights_.config, setup_, input.shape);
    ref::run_pass(operands, input, part.empty() ? &cache_ : &part);
    copy_prefill_rows(part, cache_, first_sequence, seq_len, setup_.max_context);
  }
  std::vector<int32_t> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) override {
    std::vector<ref::Matrix> by_kind = ref::run_pass(operands_, step_input(setup_, tokens, positions), &cache_);
    logits_ = std::move(by_kind[size_t(BufferKind::kLogits)]);
    return token_ids(by_kind[size_t(BufferKind::kSampled)]);
  }
  const ref::Matrix& logits() const override { return logits_; }
  const DecodeSetup& setup() const override { return setup_; }
  std::string describe() const override { return "reference: each pass op by op over whole outputs"; }

 private:
  const ModelWeights& weights_;
  const DecodeSetup setup_;
  const ref::ModelOperands operands_;  // of the decode step: RoPE for every cache position
  std::vector<ref::Matrix> cache_;
  ref::Matrix logits_;
};

class CpuVmDecoder final : public DecodeEngine {
 public:
  CpuVmDecoder(const ModelWeights& weights, const DecodeSetup& setup)
      : weights_(weights),
        setup_(checked(weights.config, setup)),
        decode_graph_(weights.config, decode_shape(setup)),
        decode_schedule_(verified_schedule(decode_graph_)),
        cache_(ref::make_kv_cache(weights.config, decode_shape(setup))),
        session_(decode_graph_, decode_schedule_, weights, setup.vm, &cache_) {}

  void prefill(const std::vector<int32_t>& tokens, int64_t seq_len, int64_t first_sequence) override {
    const ref::ModelInput input = prefill_input(setup_, tokens, seq_len, first_sequence);
    const Graph graph(weights_.config, input.shape);
    const Schedule schedule = verified_schedule(graph);
    std::vector<ref::Matrix> part = part_cache(weights_.config, setup_, input.shape);
    CpuVmSession session(graph, schedule, weights_, setup_.vm, part.empty() ? &cache_ : &part);
    session.set_input(input);
    session.launch();
    copy_prefill_rows(part, cache_, first_sequence, seq_len, setup_.max_context);
  }
  std::vector<int32_t> step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions) override {
    session_.set_input(step_input(setup_, tokens, positions));
    session_.launch();
    logits_ = session_.buffer(decode_graph_.buffer_id(BufferKind::kLogits));
    return token_ids(session_.buffer(decode_graph_.buffer_id(BufferKind::kSampled)));
  }
  const ref::Matrix& logits() const override { return logits_; }
  const DecodeSetup& setup() const override { return setup_; }
  std::string describe() const override {
    return fmt::format("cpu-vm: decode step of {} instructions on {} SMs ({}), built and verified once",
                       decode_schedule_.instructions.size(), decode_schedule_.num_sms,
                       schedule_policy_name(decode_schedule_.policy));
  }

 private:
  Schedule verified_schedule(const Graph& graph) const {
    Schedule schedule = make_schedule(graph, derive_dependencies(graph), setup_.policy, setup_.num_sms);
    verify_schedule(graph, schedule);
    return schedule;
  }

  const ModelWeights& weights_;
  const DecodeSetup setup_;
  const Graph decode_graph_;
  const Schedule decode_schedule_;  // built and verified once, launched every step
  std::vector<ref::Matrix> cache_;
  CpuVmSession session_;
  ref::Matrix logits_;
};

}  // namespace

std::vector<std::vector<int32_t>> DecodeEngine::steps(std::vector<int32_t> tokens, std::vector<int32_t> positions,
                                                      int64_t count) {
  std::vector<std::vector<int32_t>> made;
  for (int64_t i = 0; i < count; ++i) {
    made.push_back(step(tokens, positions));
    tokens = made.back();
    for (int32_t& position : positions) ++position;
  }
  return made;
}

std::string DecodeEngine::trace_step(const std::vector<int32_t>&, const std::vector<int32_t>&,
                                     const std::filesystem::path&) {
  throw Error("tracing a decode step needs the gpu engine");
}

std::unique_ptr<DecodeEngine> make_reference_decoder(const ModelWeights& weights, const DecodeSetup& setup) {
  return std::make_unique<ReferenceDecoder>(weights, setup);
}

std::unique_ptr<DecodeEngine> make_cpu_vm_decoder(const ModelWeights& weights, const DecodeSetup& setup) {
  return std::make_unique<CpuVmDecoder>(weights, setup);
}

}  // namespace mk
