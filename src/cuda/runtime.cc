// Host runtime of the megakernel: device checks, weight packing and upload, activation buffers, tensor maps,
// schedule upload, launch with a watchdog, and readback of outputs and of the error slot.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "device/config.cuh"
#include "megakernel.h"
#include "mk/check.h"
#include "mk/gpu.h"

namespace mk {

namespace {

using gpu::KernelConfig;
using gpu::MegakernelParams;

void check_cuda(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  if (status == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(fmt::format("GPU out of memory during {} ({:.2f} GiB free of {:.2f} GiB)", what,
                            double(free_bytes) / (1 << 30), double(total_bytes) / (1 << 30)));
  }
  throw Error(fmt::format("CUDA error during {}: {} ({})", what, cudaGetErrorString(status), int(status)));
}

// bf16 bits of a host vector, as the device stores them.
std::vector<uint16_t> bits_of(const std::vector<bf16>& values) {
  std::vector<uint16_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(uint16_t));
  return bits;
}

void append(std::vector<uint16_t>& out, const std::vector<bf16>& values) {
  const size_t at = out.size();
  out.resize(at + values.size());
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(uint16_t));
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult result{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &result),
               "looking up cuTensorMapEncodeTiled");
    MK_CHECK(result == cudaDriverEntryPointSuccess && function != nullptr,
             "the CUDA driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A bf16 tensor (planes, rows, cols), read in boxes of (box_rows, 64) with the 128-byte swizzle; out-of-range
// elements read as zeros.
CUtensorMap make_tensor_map(const void* base, uint64_t planes, uint64_t rows, uint64_t cols, uint32_t box_rows,
                            const char* what) {
  MK_CHECK(cols % 8 == 0, "tensor map {}: {} columns; TMA needs rows of a multiple of 16 bytes", what, cols);
  CUtensorMap map;
  const cuuint64_t dims[3] = {cols, rows, planes};
  const cuuint64_t strides[2] = {cols * 2, rows * cols * 2};
  const cuuint32_t box[3] = {uint32_t(KernelConfig::kBlockK), box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MK_CHECK(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed for {} (error {})", what, int(result));
  return map;
}

// A CUDA event destroyed on every path out of its scope.
class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "creating an event"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

GpuInfo query_gpu() {
  GpuInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    info.reason = status != cudaSuccess
                      ? fmt::format("no CUDA GPU or driver on this machine (cudaGetDeviceCount: {})", cudaGetErrorString(status))
                      : std::string("no CUDA device");
    return info;
  }
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, 0) != cudaSuccess) {
    info.reason = "cannot read the properties of CUDA device 0";
    return info;
  }
  info.name = props.name;
  info.sm_count = props.multiProcessorCount;
  info.compute_major = props.major;
  info.compute_minor = props.minor;
  info.memory_bytes = props.totalGlobalMem;
  if (props.major != 9 || props.minor != 0) {
    info.reason = fmt::format("the megakernel needs a Hopper GPU (compute capability 9.0); device 0 is {} ({}.{})",
                              props.name, props.major, props.minor);
    return info;
  }
  if (size_t(props.sharedMemPerBlockOptin) < size_t(KernelConfig::kSmemBytes)) {
    info.reason = fmt::format("device 0 offers {} bytes of shared memory per block, the megakernel needs {}",
                              props.sharedMemPerBlockOptin, KernelConfig::kSmemBytes);
    return info;
  }
  info.usable = true;
  return info;
}

struct GpuEngine::Impl {
  const Graph& graph;
  GpuOptions options;
  int32_t num_sms = 0;
  uint32_t max_signals = 1;  // most signals any counter receives per launch
  uint32_t num_counters = 1;
  bool broken = false;
  MegakernelParams params{};
  std::vector<void*> allocations;  // every cudaMalloc, freed in the destructor
  size_t bytes = 0;
  cudaStream_t stream = nullptr;
  std::vector<void*> buffer_address;          // (graph buffers): device address of each
  std::vector<uint32_t> sm_begin;             // (num_sms + 1): the schedule's, to name trace records
  std::vector<uint32_t> task_of_instruction;  // (num_instructions)
  uint64_t* trace_records = nullptr;          // (num_instructions, kTraceSlots), allocated on the first trace
  uint64_t* trace_sms = nullptr;              // (num_sms, 4)

  Impl(const Graph& g, const GpuOptions& o) : graph(g), options(o) {}

  ~Impl() {
    if (stream != nullptr) cudaStreamDestroy(stream);
    for (void* pointer : allocations) cudaFree(pointer);
  }

  template <typename T>
  T* allocate(size_t count, const char* what) {
    void* pointer = nullptr;
    check_cuda(cudaMalloc(&pointer, std::max<size_t>(count * sizeof(T), 16)), what);
    allocations.push_back(pointer);
    bytes += count * sizeof(T);
    return static_cast<T*>(pointer);
  }

  template <typename T>
  T* upload(const std::vector<T>& host, const char* what) {
    T* device = allocate<T>(host.size(), what);
    check_cuda(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
    return device;
  }

  __nv_bfloat16* activation(size_t count, const char* what) {
    auto* pointer = allocate<__nv_bfloat16>(count, what);  // NOLINT
    check_cuda(cudaMemset(pointer, 0xff, count * 2), what);  // poison: 0xffff is a bf16 NaN
    return pointer;
  }
};

GpuEngine::GpuEngine(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                     const GpuOptions& options)
    : impl_(std::make_unique<Impl>(graph, options)) {
  const GpuInfo info = query_gpu();
  MK_CHECK(info.usable, "gpu engine: {}", info.reason);
  const ModelConfig& c = graph.config();
  MK_CHECK(schedule.num_sms <= info.sm_count, "gpu engine: the schedule is for {} SMs, {} has {}", schedule.num_sms,
           info.name, info.sm_count);
  MK_CHECK(!c.has_lm_head || c.vocab_size % 8 == 0,
           "gpu engine: vocab_size {} must be a multiple of 8 (TMA rows of a multiple of 16 bytes)", c.vocab_size);
  const std::string difference = first_difference(weights.config, c);
  MK_CHECK(difference.empty(), "gpu engine: the weights are for another model than the schedule ({})", difference);
  if (options.verify) verify_schedule(graph, schedule);

  Impl& impl = *impl_;
  impl.num_sms = schedule.num_sms;
  // NOTE: a blocking stream: the synchronous cudaMemset/cudaMemcpy calls below and in set_input run on the legacy
  // default stream, which a blocking stream waits for before each launch.
  check_cuda(cudaStreamCreate(&impl.stream), "creating a stream");
  check_cuda(gpu::prepare_megakernel(), "raising the megakernel's shared memory limit");

  const int64_t T = graph.shape().tokens();
  const int64_t L = c.n_layers;
  const int64_t D = c.d_model;
  MegakernelParams& p = impl.params;
  p.dims = {int32_t(T), int32_t(graph.shape().batch), int32_t(graph.shape().seq_len), int32_t(D), int32_t(c.q_dim()),
            int32_t(c.kv_dim()), int32_t(c.qkv_dim()), int32_t(c.d_ff), int32_t(c.vocab_size), int32_t(c.head_dim),
            int32_t(c.group_size()), int32_t(L), c.rope.type != RopeType::kNone ? 1 : 0, c.rms_norm_eps,
            float(1.4426950408889634 / std::sqrt(double(c.head_dim)))};

  // ---- weights, packed the way the tiles read them ----
  std::vector<uint16_t> wqkv, wo, w_gate_up, w_down, attn_norm_w, mlp_norm_w;
  const int64_t gate_up_tiles = (c.d_ff + KernelConfig::kBlockN - 1) / KernelConfig::kBlockN;
  for (const LayerWeights& w : weights.layers) {
    append(wqkv, w.wq);
    append(wqkv, w.wk);
    append(wqkv, w.wv);
    append(wo, w.wo);
    append(w_down, w.w_down);
    append(attn_norm_w, w.attn_norm);
    append(mlp_norm_w, w.mlp_norm);
    // gate_up tile t reads weight rows [256 t, 256 t + 256): gate rows [128 t, 128 t + 128), then the same up rows
    for (int64_t t = 0; t < gate_up_tiles; ++t) {
      for (const std::vector<bf16>* matrix : {&w.w_gate, &w.w_up}) {
        const size_t at = w_gate_up.size();
        w_gate_up.resize(at + size_t(KernelConfig::kBlockN * D), 0);
        const int64_t rows = std::min<int64_t>(KernelConfig::kBlockN, c.d_ff - t * KernelConfig::kBlockN);
        std::memcpy(w_gate_up.data() + at, matrix->data() + t * KernelConfig::kBlockN * D, size_t(rows * D) * 2);
      }
    }
  }
  const uint16_t* d_wqkv = impl.upload(wqkv, "uploading wq/wk/wv");
  const uint16_t* d_wo = impl.upload(wo, "uploading wo");
  const uint16_t* d_w_gate_up = impl.upload(w_gate_up, "uploading w_gate/w_up");
  const uint16_t* d_w_down = impl.upload(w_down, "uploading w_down");
  p.attn_norm_weight = reinterpret_cast<const __nv_bfloat16*>(impl.upload(attn_norm_w, "uploading norm weights"));
  p.mlp_norm_weight = reinterpret_cast<const __nv_bfloat16*>(impl.upload(mlp_norm_w, "uploading norm weights"));
  const uint16_t* d_embedding = nullptr;
  if (c.has_embedding) {
    d_embedding = impl.upload(bits_of(weights.embedding), "uploading the embedding");
    p.embedding = reinterpret_cast<const __nv_bfloat16*>(d_embedding);
  }
  const uint16_t* d_lm_head = nullptr;
  if (c.has_lm_head) {
    p.final_norm_weight = reinterpret_cast<const __nv_bfloat16*>(impl.upload(bits_of(weights.final_norm), "uploading the final norm"));
    d_lm_head = c.tie_word_embeddings ? d_embedding : impl.upload(bits_of(weights.lm_head), "uploading the LM head");
  }
  const ref::RopeTable rope = ref::make_rope_table(c, graph.shape().seq_len);
  if (c.rope.type != RopeType::kNone) {
    p.rope_cos = impl.upload(rope.cos, "uploading RoPE tables");
    p.rope_sin = impl.upload(rope.sin, "uploading RoPE tables");
  }

  // ---- activations, one bf16 buffer per graph buffer, stacked over layers per kind ----
  p.hidden = impl.activation(size_t((L + 1) * T * D), "allocating hidden");
  p.attn_norm = impl.activation(size_t(L * T * D), "allocating attn_norm");
  p.qkv = impl.activation(size_t(L * T * c.qkv_dim()), "allocating qkv");
  p.attn = impl.activation(size_t(L * T * c.q_dim()), "allocating attn");
  p.hidden_mid = impl.activation(size_t(L * T * D), "allocating hidden_mid");
  p.mlp_norm = impl.activation(size_t(L * T * D), "allocating mlp_norm");
  p.act = impl.activation(size_t(L * T * c.d_ff), "allocating act");
  if (c.has_lm_head) {
    p.final_norm = impl.activation(size_t(T * D), "allocating final_norm");
    p.logits = impl.activation(size_t(T * c.vocab_size), "allocating logits");
  }
  p.tokens = impl.allocate<int32_t>(size_t(T), "allocating tokens");
  impl.buffer_address.resize(graph.buffers().size(), nullptr);
  for (size_t b = 0; b < graph.buffers().size(); ++b) {
    const Buffer& buffer = graph.buffers()[b];
    const int64_t l = buffer.layer;
    void* address = nullptr;
    switch (buffer.kind) {
      case BufferKind::kTokens: address = const_cast<int32_t*>(p.tokens); break;
      case BufferKind::kHidden: address = p.hidden + l * T * D; break;
      case BufferKind::kAttnNorm: address = p.attn_norm + l * T * D; break;
      case BufferKind::kQkv: address = p.qkv + l * T * c.qkv_dim(); break;
      case BufferKind::kAttn: address = p.attn + l * T * c.q_dim(); break;
      case BufferKind::kHiddenMid: address = p.hidden_mid + l * T * D; break;
      case BufferKind::kMlpNorm: address = p.mlp_norm + l * T * D; break;
      case BufferKind::kAct: address = p.act + l * T * c.d_ff; break;
      case BufferKind::kFinalNorm: address = p.final_norm; break;
      case BufferKind::kLogits: address = p.logits; break;
    }
    impl.buffer_address[b] = address;
  }

  // ---- tensor maps ----
  using namespace gpu;
  const uint32_t rows_m = KernelConfig::kBlockM, rows_n = KernelConfig::kBlockN;
  p.maps[kMapAttnNorm] = make_tensor_map(p.attn_norm, L, T, D, rows_m, "attn_norm");
  p.maps[kMapAttn] = make_tensor_map(p.attn, L, T, c.q_dim(), rows_m, "attn");
  p.maps[kMapMlpNorm] = make_tensor_map(p.mlp_norm, L, T, D, rows_m, "mlp_norm");
  p.maps[kMapAct] = make_tensor_map(p.act, L, T, c.d_ff, rows_m, "act");
  p.maps[kMapWqkv] = make_tensor_map(d_wqkv, L, c.qkv_dim(), D, rows_n, "wqkv");
  p.maps[kMapWo] = make_tensor_map(d_wo, L, D, c.q_dim(), rows_n, "wo");
  p.maps[kMapWgateUp] = make_tensor_map(d_w_gate_up, L, 2 * gate_up_tiles * KernelConfig::kBlockN, D, 2 * rows_n, "w_gate_up");
  p.maps[kMapWdown] = make_tensor_map(d_w_down, L, D, c.d_ff, rows_n, "w_down");
  p.maps[kMapQkv] = make_tensor_map(p.qkv, L, T, c.qkv_dim(), rows_m, "qkv");
  p.maps[kMapHidden] = make_tensor_map(p.hidden, L + 1, T, D, rows_m, "hidden");
  p.maps[kMapHiddenMid] = make_tensor_map(p.hidden_mid, L, T, D, rows_m, "hidden_mid");
  if (c.has_lm_head) {
    p.maps[kMapFinalNorm] = make_tensor_map(p.final_norm, 1, T, D, rows_m, "final_norm");
    p.maps[kMapLmHead] = make_tensor_map(d_lm_head, 1, c.vocab_size, D, rows_n, "lm_head");
    p.maps[kMapLogits] = make_tensor_map(p.logits, 1, T, c.vocab_size, rows_m, "logits");
  }
  const int64_t planes = L * graph.shape().batch;
  p.maps[kMapQuery] = make_tensor_map(p.qkv, planes, graph.shape().seq_len, c.qkv_dim(), KernelConfig::kBlockQ, "queries");
  p.maps[kMapKeyValue] = make_tensor_map(p.qkv, planes, graph.shape().seq_len, c.qkv_dim(), KernelConfig::kBlockKv, "keys and values");
  p.maps[kMapAttnOut] = make_tensor_map(p.attn, planes, graph.shape().seq_len, c.q_dim(), KernelConfig::kBlockQ, "attention output");

  // ---- schedule, counters, error slot ----
  p.instructions = impl.upload(schedule.instructions, "uploading instructions");
  p.sm_begin = impl.upload(schedule.sm_begin, "uploading the schedule");
  p.waits = impl.upload(schedule.waits.empty() ? std::vector<Wait>{Wait{0, 0}} : schedule.waits, "uploading waits");
  p.counters = impl.allocate<uint32_t>(std::max<uint32_t>(schedule.num_counters, 1), "allocating counters");
  check_cuda(cudaMemset(p.counters, 0, std::max<uint32_t>(schedule.num_counters, 1) * 4), "clearing counters");
  p.error = impl.allocate<gpu::DeviceError>(1, "allocating the error slot");
  check_cuda(cudaMemset(p.error, 0, sizeof(gpu::DeviceError)), "clearing the error slot");
  // Counters grow by their signals per launch; the fastest-growing one bounds the epochs before a reset.
  std::vector<uint32_t> signals(std::max<uint32_t>(schedule.num_counters, 1), 0);
  for (const Instruction& in : schedule.instructions) ++signals[in.signal_counter];
  for (uint32_t count : signals) impl.max_signals = std::max(impl.max_signals, count);
  impl.num_counters = std::max<uint32_t>(schedule.num_counters, 1);
  impl.sm_begin = schedule.sm_begin;
  for (const Instruction& in : schedule.instructions) impl.task_of_instruction.push_back(in.task);
  p.stall_timeout_ns = uint64_t(options.stall_timeout_s * 1e9);
  p.epoch = 0;
}

GpuEngine::~GpuEngine() = default;

void GpuEngine::set_input(const ref::ModelInput& input) {
  Impl& impl = *impl_;
  const ModelConfig& c = impl.graph.config();
  MK_CHECK(input.shape.batch == impl.graph.shape().batch && input.shape.seq_len == impl.graph.shape().seq_len,
           "gpu engine: input of batch {} x seq {} for an engine built for batch {} x seq {}", input.shape.batch,
           input.shape.seq_len, impl.graph.shape().batch, impl.graph.shape().seq_len);
  ref::validate_input(c, input);
  if (c.has_embedding) {
    check_cuda(cudaMemcpy(const_cast<int32_t*>(impl.params.tokens), input.tokens.data(), input.tokens.size() * 4,
                          cudaMemcpyHostToDevice),
               "uploading tokens");
  } else {
    std::vector<uint16_t> hidden(input.hidden.data.size());
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = to_bf16(input.hidden.data[i]).bits;
    check_cuda(cudaMemcpy(impl.params.hidden, hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice), "uploading hidden states");
  }
}

void GpuEngine::run() { time_runs(1); }

std::vector<float> GpuEngine::time_runs(int launches) {
  Impl& impl = *impl_;
  MK_CHECK(!impl.broken, "gpu engine: unusable after an earlier device error");
  std::vector<float> times;
  Event start_event, stop_event;
  cudaEvent_t start = start_event.get(), stop = stop_event.get();
  for (int i = 0; i < launches; ++i) {
    // Counters grow by one target per launch; start over before epoch * target could overflow 32 bits.
    if (uint64_t(impl.params.epoch + 1) * impl.max_signals >= (uint64_t(1) << 32)) {
      check_cuda(cudaMemset(impl.params.counters, 0, impl.num_counters * sizeof(uint32_t)), "resetting counters");
      impl.params.epoch = 0;
    }
    impl.params.epoch += 1;
    check_cuda(cudaEventRecord(start, impl.stream), "recording an event");
    check_cuda(gpu::launch_megakernel(impl.params, impl.num_sms, impl.stream), "launching the megakernel");
    check_cuda(cudaEventRecord(stop, impl.stream), "recording an event");
    // Watchdog: the kernel bounds every wait itself; if it still does not finish, no recovery is possible.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(2 * impl.options.stall_timeout_s + 30.0);
    cudaError_t status;
    while ((status = cudaEventQuery(stop)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "mk: fatal: the megakernel did not finish within %.0f s; exiting\n",
                     2 * impl.options.stall_timeout_s + 30.0);
        std::_Exit(3);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    check_cuda(status, "running the megakernel");
    gpu::DeviceError error{};
    check_cuda(cudaMemcpy(&error, impl.params.error, sizeof(error), cudaMemcpyDeviceToHost), "reading the error slot");
    if (error.kind != gpu::kErrorNone) {
      impl.broken = true;
      const std::string task =
          error.task < impl.graph.tasks().size() ? impl.graph.describe(impl.graph.tasks()[error.task]) : std::string("?");
      if (error.kind == gpu::kErrorCounterStall) {
        throw Error(fmt::format("megakernel stall: SM {} instruction {} (task {}: {}) waited {:.1f} s on counter {}, "
                                "which reached {} of {}",
                                error.sm, error.instruction, error.task, task, impl.options.stall_timeout_s, error.counter,
                                error.value, error.target));
      }
      if (error.kind == gpu::kErrorPipelineStall) {
        throw Error(fmt::format("megakernel pipeline stall: SM {} instruction {} (task {}: {}) waited {:.1f} s on a "
                                "shared-memory stage",
                                error.sm, error.instruction, error.task, task, impl.options.stall_timeout_s));
      }
      throw Error(fmt::format("megakernel error {} at SM {} instruction {} (task {}: {})", error.kind, error.sm,
                              error.instruction, error.task, task));
    }
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "reading event times");
    times.push_back(ms);
  }
  return times;
}

Trace GpuEngine::run_traced() {
  Impl& impl = *impl_;
  const size_t num_instructions = impl.task_of_instruction.size();
  if (impl.trace_records == nullptr) {
    impl.trace_records = impl.allocate<uint64_t>(num_instructions * gpu::kTraceSlots, "allocating the trace");
    impl.trace_sms = impl.allocate<uint64_t>(size_t(impl.num_sms) * 4, "allocating the trace");
  }
  check_cuda(cudaMemset(impl.trace_records, 0, num_instructions * gpu::kTraceSlots * 8), "clearing the trace");
  impl.params.trace_records = impl.trace_records;
  impl.params.trace_sms = impl.trace_sms;
  std::vector<float> times;
  try {
    times = time_runs(1);
  } catch (...) {
    impl.params.trace_records = impl.params.trace_sms = nullptr;
    throw;
  }
  impl.params.trace_records = impl.params.trace_sms = nullptr;
  std::vector<uint64_t> records(num_instructions * gpu::kTraceSlots), sms(size_t(impl.num_sms) * 4);
  check_cuda(cudaMemcpy(records.data(), impl.trace_records, records.size() * 8, cudaMemcpyDeviceToHost), "reading the trace");
  check_cuda(cudaMemcpy(sms.data(), impl.trace_sms, sms.size() * 8, cudaMemcpyDeviceToHost), "reading the trace");

  // Each SM's clock64 runs at its own offset: map it onto the global timer with the SM's first and last stamps.
  uint64_t base = UINT64_MAX;
  for (int32_t s = 0; s < impl.num_sms; ++s) base = std::min(base, sms[size_t(4 * s)]);
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = impl.num_sms;
  trace.launch_ns = double(times.at(0)) * 1e6;
  for (int32_t s = 0; s < impl.num_sms; ++s) {
    const uint64_t* stamps = &sms[size_t(4 * s)];
    const double ns_per_clock =
        stamps[3] > stamps[1] ? double(stamps[2] - stamps[0]) / double(stamps[3] - stamps[1]) : 0.0;
    auto to_ns = [&](uint64_t clock) {
      return clock == 0 ? -1.0 : double(stamps[0] - base) + double(int64_t(clock - stamps[1])) * ns_per_clock;
    };
    for (uint32_t i = impl.sm_begin[size_t(s)]; i < impl.sm_begin[size_t(s) + 1]; ++i) {
      const uint64_t* slot = &records[size_t(i) * gpu::kTraceSlots];
      TraceRecord r;
      r.sm = uint32_t(s);
      r.index = i - impl.sm_begin[size_t(s)];
      r.task = impl.task_of_instruction[i];
      r.start = to_ns(slot[gpu::kTraceStart]);
      r.waits_done = to_ns(slot[gpu::kTraceWaitsDone]);
      r.math_done = to_ns(slot[gpu::kTraceMathDone]);
      r.end = to_ns(slot[gpu::kTraceEnd]);
      r.producer_start = to_ns(slot[gpu::kTraceProducerStart]);
      r.producer_waits_done = to_ns(slot[gpu::kTraceProducerWaitsDone]);
      r.producer_loads_issued = to_ns(slot[gpu::kTraceProducerLoadsIssued]);
      trace.records.push_back(r);
    }
  }
  return trace;
}

namespace {

ref::Matrix download_bf16(const void* address, int64_t rows, int64_t cols) {
  std::vector<uint16_t> bits(size_t(rows * cols));
  check_cuda(cudaMemcpy(bits.data(), address, bits.size() * 2, cudaMemcpyDeviceToHost), "downloading a buffer");
  ref::Matrix out(rows, cols);
  for (size_t i = 0; i < bits.size(); ++i) out.data[i] = to_float(bf16{bits[i]});
  return out;
}

}  // namespace

ref::Matrix GpuEngine::output() const {
  const Buffer& buffer = impl_->graph.buffers()[impl_->graph.output_buffer()];
  return download_bf16(impl_->buffer_address[impl_->graph.output_buffer()], buffer.rows, buffer.cols);
}

std::vector<ref::Matrix> GpuEngine::buffers() const {
  std::vector<ref::Matrix> out;
  for (size_t b = 0; b < impl_->graph.buffers().size(); ++b) {
    const Buffer& buffer = impl_->graph.buffers()[b];
    if (buffer.kind == BufferKind::kTokens) {
      std::vector<int32_t> tokens(size_t(buffer.rows));
      check_cuda(cudaMemcpy(tokens.data(), impl_->buffer_address[b], tokens.size() * 4, cudaMemcpyDeviceToHost),
                 "downloading tokens");
      ref::Matrix tokens_as_floats(buffer.rows, 1);
      for (size_t i = 0; i < tokens.size(); ++i) tokens_as_floats.data[i] = float(tokens[i]);
      out.push_back(std::move(tokens_as_floats));
    } else {
      out.push_back(download_bf16(impl_->buffer_address[b], buffer.rows, buffer.cols));
    }
  }
  return out;
}

size_t GpuEngine::device_bytes() const { return impl_->bytes; }

}  // namespace mk
