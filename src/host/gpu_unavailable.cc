// The gpu engine in a build without CUDA: every entry point explains why there is no GPU engine.
#include "mk/check.h"
#include "mk/generate.h"
#include "mk/gpu.h"

namespace mk {

GpuInfo query_gpu() {
  GpuInfo info;
  info.reason = "this build has no CUDA support (nvcc was not found when it was configured)";
  return info;
}

struct GpuEngine::Impl {};

GpuEngine::GpuEngine(const Graph&, const Schedule&, const ModelWeights&, const GpuOptions&) {
  throw Error("gpu engine: " + query_gpu().reason);
}
GpuEngine::~GpuEngine() = default;
void GpuEngine::set_input(const ref::ModelInput&) {}
void GpuEngine::set_input_device(const void*) {}
void GpuEngine::run() {}
std::vector<float> GpuEngine::time_runs(int) { return {}; }
std::vector<int32_t> GpuEngine::run_steps_and_read_sampled(int) { return {}; }
std::vector<float> GpuEngine::time_runs_per_step(int) { return {}; }
Trace GpuEngine::run_traced() { return {}; }
ref::Matrix GpuEngine::output() const { return {}; }
void GpuEngine::copy_output_to_device(void*) const {}
std::vector<ref::Matrix> GpuEngine::buffers() const { return {}; }
ref::Matrix GpuEngine::buffer(BufferRef) const { return {}; }
size_t GpuEngine::device_bytes() const { return 0; }

std::unique_ptr<DecodeEngine> make_gpu_decoder(const ModelWeights&, const DecodeSetup&) {
  throw Error("gpu engine: " + query_gpu().reason);
}

}  // namespace mk
