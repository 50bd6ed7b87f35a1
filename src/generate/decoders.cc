// Choosing a decode engine by name. Part of mk_gpu (with or without CUDA), since the gpu decoder lives there.
#include <fmt/format.h>

#include "mk/check.h"
#include "mk/generate.h"
#include "mk/gpu.h"

namespace mk {

void check_decode_engine(const std::string& engine) {
  if (engine == "reference" || engine == "cpu-vm") return;
  if (engine == "gpu") {
    const GpuInfo info = query_gpu();
    MK_CHECK(info.usable, "gpu engine: {}", info.reason);
    return;
  }
  throw Error(fmt::format("unknown engine '{}' (available: reference, cpu-vm, gpu)", engine));
}

std::string resolve_decode_engine(const std::string& engine) {
  if (engine != "auto") return engine;
  return query_gpu().usable ? "gpu" : "cpu-vm";
}

GenerationMemory engine_generation_memory(const std::string& engine, const ModelConfig& config, int64_t batch,
                                          int64_t prefill_len, int64_t max_context, int64_t prefill_batch) {
  return generation_memory(config, batch, prefill_len, max_context, engine != "gpu", prefill_batch);
}

// NOTE: the GPU's budget is its whole memory, of which the CUDA context and the allocations' granularity take some:
// a part sized to the last byte would fail to allocate where a smaller one runs.
constexpr double kGpuPartHeadroomBytes = double(int64_t(1) << 30);

int64_t engine_prefill_batch(const std::string& engine, const ModelConfig& config, int64_t batch, int64_t prefill_len,
                             int64_t max_context, double budget_bytes, const SettingNames& names) {
  const bool gpu = engine == "gpu";
  return prefill_batch_within(config, batch, prefill_len, max_context, !gpu, budget_bytes,
                              gpu ? kGpuPartHeadroomBytes : 0.0, names);
}

double engine_memory_bytes(const std::string& engine, double host_bytes) {
  return engine == "gpu" ? double(query_gpu().memory_bytes) : host_bytes;
}

std::unique_ptr<DecodeEngine> make_decoder(const std::string& engine, const ModelWeights& weights,
                                           const DecodeSetup& setup) {
  check_decode_engine(engine);
  if (engine == "gpu") return make_gpu_decoder(weights, setup);
  return engine == "reference" ? make_reference_decoder(weights, setup) : make_cpu_vm_decoder(weights, setup);
}

}  // namespace mk
