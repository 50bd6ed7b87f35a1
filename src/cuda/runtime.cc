// The gpu engine: checks, model and schedule upload, launch with a watchdog, tracing, and readback of outputs and of
// the error slot.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "device/config.cuh"
#include "device_memory.h"
#include "kernel_limits.h"
#include "megakernel.h"
#include "mk/check.h"
#include "mk/generate.h"
#include "mk/gpu.h"
#include "mk/kv_cache.h"
#include "mk/ops.h"
#include "model_on_device.h"
#include "trace_stamps.h"

namespace mk {

using gpu::check_cuda;
using gpu::KernelConfig;
using gpu::MegakernelParams;

namespace {
void check_kernel(bool& broken, cudaError_t status, const char* what);
}  // namespace

struct GpuEngine::Impl {
  const Graph& graph;
  GpuOptions options;
  int32_t num_sms = 0;
  uint32_t max_signals = 1;  // most signals any counter receives per launch
  uint32_t num_counters = 1;
  bool broken = false;
  MegakernelParams params{};
  int pass_epochs = 1;  // the last timed pass's launches: params.epoch - pass_epochs + 1 was its first's epoch
  gpu::DeviceArena arena;
  cudaStream_t stream = nullptr;
  std::vector<void*> buffer_address;          // (graph buffers): device address of each
  std::vector<uint32_t> sm_begin;             // (num_sms + 1): the schedule's, to name trace records
  std::vector<uint32_t> task_of_instruction;  // (num_instructions)
  uint64_t* trace_records = nullptr;          // (num_instructions, kTraceSlots), allocated on the first trace
  uint64_t* trace_sms = nullptr;              // (num_sms, 4)

  Schedule schedule;                          // the host copy, cut into steps on the first per-step run
  struct StepLists {
    const Instruction* instructions;
    const uint32_t* sm_begin;
  };
  std::vector<StepLists> steps;  // (program steps): device lists of time_runs_per_step, uploaded on its first call

  // NOTE: a decode step is about a millisecond, and it made four synchronous copies of a few bytes (the step's
  // positions and tokens, the error slot, the sampled ids), each a host round trip. They ride the stream from pinned
  // memory now, with one wait. What it saves is not settled: p50 minus one traced step's span read 36.5 us before
  // and 13 us after, but another traced step of the earlier build read 35 us (docs/perf.md, ninth session, run 4).
  struct PassEvents {
    gpu::Event start, stop, done, input_copied;
  };
  std::unique_ptr<PassEvents> events;  // created on first use: the constructor checks for a GPU first
  bool input_in_flight = false;        // input_staging may still be read by a copy (input_copied says when not)
  gpu::PinnedBuffer input_staging;     // positions, then tokens
  gpu::PinnedBuffer error_staging;     // (1) gpu::DeviceError
  gpu::PinnedBuffer readback_staging;  // run_steps_and_read_sampled's ids
  int32_t* kept_ids = nullptr;         // (kMaxStepsPerSync, batch): a decode group's ids, allocated on the first group

  Impl(const Graph& g, const GpuOptions& o) : graph(g), options(o) {}
  ~Impl() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  void upload_schedule(const Schedule& schedule);
  void upload_steps();
  // One timed pass: `enqueue` puts its launches on the stream between two events, `read_back` (if any) its copies
  // after them, beside the error slot's; then the watchdog waits for all of it and the error slot is checked.
  // Milliseconds between the events.
  // `epochs`: the launches of one pass, each with an epoch of its own (params.epoch + 1 each after the first). The
  // watchdog allows each a stall's time: under compute-sanitizer a healthy decode step takes seconds (run 5 of the
  // fifteenth session; after a real stall the abort flag makes the later launches leave at their first wait).
  float timed_pass(const std::function<void()>& enqueue, const std::function<void()>& read_back = nullptr,
                   int epochs = 1);
  // The error the kernel recorded in its slot, as an mk::Error naming SM, instruction, task and counter.
  [[noreturn]] void throw_device_error(const gpu::DeviceError& error) const;
  // Positions and token ids to their device buffers, on the stream (the next launch follows them there).
  void upload_ids(const std::vector<int32_t>& positions, const std::vector<int32_t>& tokens);
  PassEvents& pass_events() {
    if (!events) events = std::make_unique<PassEvents>();
    return *events;
  }
  void launch(const MegakernelParams& launch_params, bool programmatic = false) {
    check_kernel(broken, gpu::launch_megakernel(launch_params, num_sms, stream, programmatic),
                 "launching the megakernel");
  }
  // After a device error (a stall report or a sticky CUDA error) the engine refuses all further work.
  void check_usable() const { MK_CHECK(!broken, "gpu engine: unusable after an earlier device error"); }
};

namespace {

// A failed launch or kernel leaves the CUDA context unusable (a sticky error), and with it the engine: every later
// call says so, and this message names the error.
void check_kernel(bool& broken, cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  broken = true;
  throw Error(fmt::format("gpu engine: {} failed: {} ({}); the engine is unusable", what, cudaGetErrorName(status),
                          cudaGetErrorString(status)));
}

}  // namespace

GpuEngine::GpuEngine(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                     const GpuOptions& options)
    : impl_(std::make_unique<Impl>(graph, options)) {
  // NOTE: the timeout becomes a count of nanoseconds (a uint64_t: NaN or a negative value would not convert).
  MK_CHECK(options.stall_timeout_s >= kMinStallTimeoutS && options.stall_timeout_s <= kMaxStallTimeoutS,
           "gpu engine: stall_timeout_s must be in [{}, {}] seconds, got {}", kMinStallTimeoutS, kMaxStallTimeoutS,
           options.stall_timeout_s);
  const GpuInfo info = query_gpu();
  MK_CHECK(info.usable, "gpu engine: {}", info.reason);
  const ModelConfig& c = graph.config();
  gpu::check_kernel_limits(graph);
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
  int ctas_per_sm = 0;
  check_cuda(gpu::megakernel_ctas_per_sm(&ctas_per_sm), "querying the megakernel's occupancy");
  MK_CHECK(ctas_per_sm >= 1,
           "gpu engine: a megakernel CTA ({} threads, {} KB of shared memory) cannot be resident on an SM of {}: a "
           "persistent launch needs every CTA resident at once",
           KernelConfig::kThreads, KernelConfig::kSmemBytes / 1024, info.name);
  const MegakernelParams* shared = nullptr;
  if (options.weights_of != nullptr) {
    const Impl& source = *options.weights_of->impl_;
    MK_CHECK(first_difference(source.graph.config(), c).empty(), "gpu engine: shared weights of another model");
    const RunShape& from = source.graph.shape();
    MK_CHECK(std::max(from.seq_len, from.max_context) >= std::max(graph.shape().seq_len, graph.shape().max_context),
             "internal error: shared RoPE table too short");
    shared = &source.params;
  }
  impl.buffer_address = gpu::upload_model(impl.arena, graph, weights, options.kv_cache, shared, impl.params);
  impl.upload_schedule(schedule);
  impl.params.stall_timeout_ns = uint64_t(options.stall_timeout_s * 1e9);
  impl.params.pipeline_stall_timeout_ns = impl.params.stall_timeout_ns + impl.params.stall_timeout_ns / 8;
  impl.params.skip_dependency_waits = options.skip_dependency_waits ? 1u : 0u;
  impl.params.epoch = 0;
}

void GpuEngine::Impl::upload_schedule(const Schedule& schedule) {
  MegakernelParams& p = params;
  p.instructions = arena.upload(schedule.instructions, "uploading instructions");
  p.sm_begin = arena.upload(schedule.sm_begin, "uploading the schedule");
  p.waits = arena.upload(schedule.waits.empty() ? std::vector<Wait>{Wait{0, 0}} : schedule.waits, "uploading waits");
  // NOTE: checked even unverified: the decode kernels run a combine only in its group's last attention task, so a
  // group not wholly linked would leave its combine unrun (o_proj stalls), and an unlinked combine is refused there
  // as a bad instruction; a linked task's fields address its ticket.
  check_combine_links(graph, schedule);
  // NOTE: decode_o_proj_combine runs on the CPU engines only: staging a row's partials in every o_proj tile measured
  // slower than a combine of its own (docs/perf.md, sixth session, run 6), and its device path, a copy of the combine
  // in each GEMM staging site, was 16-17% of the decode kernels' code (twentieth session).
  for (size_t i = 0; i < schedule.instructions.size(); ++i)
    MK_CHECK(schedule.instructions[i].opcode != Opcode::kDecodeOProjCombine,
             "gpu engine: instruction {} is a decode_o_proj_combine, which only the CPU engines run (the gpu "
             "engine's decode programs combine with decode_combine, then decode_o_proj)",
             i);
  // Linked decode combines' tickets (MegakernelParams::combine_tickets) follow the counters, cleared with them.
  const ModelConfig& c = graph.config();
  const RunShape& shape = graph.shape();
  const bool linked = std::any_of(schedule.instructions.begin(), schedule.instructions.end(),
                                  [](const Instruction& in) { return (in.flags & kAttentionRunsCombine) != 0; });
  const int64_t tickets = linked ? c.n_layers * shape.batch * c.n_kv_heads : 0;
  MK_CHECK(uint64_t(schedule.num_counters) + uint64_t(tickets) < (uint64_t(1) << 32),
           "gpu engine: {} counters and {} combine tickets overflow 32-bit indices", schedule.num_counters, tickets);
  num_counters = std::max<uint32_t>(schedule.num_counters + uint32_t(tickets), 1);
  p.counters = arena.allocate<uint32_t>(num_counters, "allocating counters");
  check_cuda(cudaMemset(p.counters, 0, num_counters * sizeof(uint32_t)), "clearing counters");
  p.combine_tickets = p.counters + schedule.num_counters;
  p.error = arena.allocate<gpu::DeviceError>(1, "allocating the error slot");
  check_cuda(cudaMemset(p.error, 0, sizeof(gpu::DeviceError)), "clearing the error slot");
  // Counters grow by their signals per launch; the fastest-growing one bounds the epochs before a reset.
  std::vector<uint32_t> signals(num_counters, 0);
  for (const Instruction& in : schedule.instructions) ++signals[in.signal_counter];
  for (uint32_t count : signals) max_signals = std::max(max_signals, count);
  if (linked) max_signals = std::max(max_signals, uint32_t(kv_split(c, shape).splits));  // tickets a launch
  sm_begin = schedule.sm_begin;
  for (const Instruction& in : schedule.instructions) task_of_instruction.push_back(in.task);
  this->schedule = schedule;
}

void GpuEngine::Impl::upload_steps() {
  for (const Schedule& step : split_schedule_by_step(graph, schedule)) {
    // A step without instructions still uploads one, unread (the SMs' lists are empty): uploads must not be empty.
    const std::vector<Instruction> instructions =
        step.instructions.empty() ? std::vector<Instruction>(1) : step.instructions;
    steps.push_back({arena.upload(instructions, "uploading a step's instructions"),
                     arena.upload(step.sm_begin, "uploading a step's schedule")});
  }
}

GpuEngine::~GpuEngine() = default;

void GpuEngine::set_input(const ref::ModelInput& input) {
  Impl& impl = *impl_;
  impl.check_usable();
  const ModelConfig& c = impl.graph.config();
  MK_CHECK(input.shape.batch == impl.graph.shape().batch && input.shape.seq_len == impl.graph.shape().seq_len,
           "gpu engine: input of batch {} x seq {} for an engine built for batch {} x seq {}", input.shape.batch,
           input.shape.seq_len, impl.graph.shape().batch, impl.graph.shape().seq_len);
  ref::validate_input(c, input);
  const std::vector<int32_t> none;
  const bool positions = impl.graph.buffer_table().has(BufferKind::kPositions);
  if (positions || c.has_embedding)
    impl.upload_ids(positions ? input.positions : none, c.has_embedding ? input.tokens : none);
  if (!c.has_embedding) {
    std::vector<uint16_t> hidden(input.hidden.data.size());
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = to_bf16(input.hidden.data[i]).bits;
    check_cuda(cudaMemcpy(impl.params.hidden, hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice), "uploading hidden states");
  }
}

void GpuEngine::Impl::upload_ids(const std::vector<int32_t>& positions, const std::vector<int32_t>& tokens) {
  PassEvents& e = pass_events();
  // the previous upload's copies must have read the staging before it is rewritten
  if (input_in_flight) check_cuda(cudaEventSynchronize(e.input_copied.get()), "uploading token ids");
  const size_t count = positions.size() + tokens.size();
  auto* staging = static_cast<int32_t*>(input_staging.reserve(count * 4, "allocating pinned input staging"));
  std::copy(positions.begin(), positions.end(), staging);
  std::copy(tokens.begin(), tokens.end(), staging + positions.size());
  if (!positions.empty())
    check_cuda(cudaMemcpyAsync(const_cast<int32_t*>(params.positions), staging, positions.size() * 4,
                               cudaMemcpyHostToDevice, stream),
               "uploading positions");
  if (!tokens.empty())
    check_cuda(cudaMemcpyAsync(const_cast<int32_t*>(params.tokens), staging + positions.size(), tokens.size() * 4,
                               cudaMemcpyHostToDevice, stream),
               "uploading tokens");
  check_cuda(cudaEventRecord(e.input_copied.get(), stream), "recording an event");
  input_in_flight = true;
}

void GpuEngine::set_input_device(const void* data) {
  Impl& impl = *impl_;
  impl.check_usable();
  const ModelConfig& c = impl.graph.config();
  gpu::check_device_pointer(data, "gpu engine: the input");
  const size_t tokens = size_t(impl.graph.shape().tokens());
  void* destination =
      c.has_embedding ? static_cast<void*>(const_cast<int32_t*>(impl.params.tokens)) : impl.params.hidden;
  const size_t bytes = c.has_embedding ? tokens * sizeof(int32_t) : tokens * size_t(c.d_model) * sizeof(bf16);
  // NOTE: on the engine's stream, then synchronized: the launches that read it follow on that stream, and the
  // caller may free or overwrite its buffer as soon as this returns.
  check_cuda(cudaMemcpyAsync(destination, data, bytes, cudaMemcpyDeviceToDevice, impl.stream), "copying the input");
  check_cuda(cudaStreamSynchronize(impl.stream), "copying the input");
}

void GpuEngine::run() { time_runs(1); }

void GpuEngine::Impl::throw_device_error(const gpu::DeviceError& error) const {
  const std::string task =
      error.task < graph.tasks().size() ? graph.describe(graph.tasks()[error.task]) : std::string("?");
  if (error.kind == gpu::kErrorCounterStall) {
    // In a group of launches (decode steps fed on the device), the target says which launch stalled: it is that
    // launch's epoch times the wait's signals a launch.
    std::string step;
    const uint32_t per_launch = schedule.wait_target(int32_t(error.sm), error.instruction, error.counter);
    const int64_t first_epoch = int64_t(params.epoch) - pass_epochs + 1;
    const int64_t launch = per_launch > 0 ? int64_t(error.target / per_launch) - first_epoch : -1;
    if (pass_epochs > 1 && launch >= 0 && launch < pass_epochs)
      step = fmt::format(" (step {} of the {} launched together)", launch + 1, pass_epochs);
    throw Error(fmt::format("megakernel stall: SM {} instruction {} (task {}: {}) waited {:.1f} s on counter {}, "
                            "which reached {} of {}{}",
                            error.sm, error.instruction, error.task, task, options.stall_timeout_s, error.counter,
                            error.value, error.target, step));
  }
  if (error.kind == gpu::kErrorPipelineStall) {
    throw Error(fmt::format("megakernel pipeline stall: SM {} instruction {} (task {}: {}) waited {:.1f} s on a "
                            "shared-memory stage",
                            error.sm, error.instruction, error.task, task,
                            double(params.pipeline_stall_timeout_ns) * 1e-9));
  }
  throw Error(fmt::format("megakernel error {} at SM {} instruction {} (task {}: {})", error.kind, error.sm,
                          error.instruction, error.task, task));
}

float GpuEngine::Impl::timed_pass(const std::function<void()>& enqueue, const std::function<void()>& read_back,
                                  int epochs) {
  PassEvents& e = pass_events();
  cudaEvent_t start = e.start.get(), stop = e.stop.get();
  auto* error_slot =
      static_cast<gpu::DeviceError*>(error_staging.reserve(sizeof(gpu::DeviceError), "allocating pinned memory"));
  // Counters grow by one target per launch; start over before epoch * target could overflow 32 bits.
  if (uint64_t(params.epoch + epochs) * max_signals >= (uint64_t(1) << 32)) {
    check_cuda(cudaMemset(params.counters, 0, num_counters * sizeof(uint32_t)), "resetting counters");
    params.epoch = 0;
  }
  params.epoch += 1;
  pass_epochs = epochs;
  check_cuda(cudaEventRecord(start, stream), "recording an event");
  enqueue();
  check_cuda(cudaEventRecord(stop, stream), "recording an event");
  check_kernel(broken, cudaMemcpyAsync(error_slot, params.error, sizeof(gpu::DeviceError), cudaMemcpyDeviceToHost,
                                       stream),
               "reading the error slot");
  if (read_back) read_back();
  check_cuda(cudaEventRecord(e.done.get(), stream), "recording an event");
  // Watchdog: the kernel bounds every wait itself; if it still does not finish, no recovery is possible.
  const double watchdog_s = epochs * 2 * options.stall_timeout_s + 30.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(watchdog_s);
  // NOTE: polled without sleeping for the first 10 ms: a decode step takes about a millisecond, and a sleep of
  // the scheduler's granularity (~50 us) would add to every token's latency.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
  cudaError_t status;
  while ((status = cudaEventQuery(e.done.get())) == cudaErrorNotReady) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      std::fprintf(stderr, "mk: fatal: the megakernel did not finish within %.0f s; exiting\n", watchdog_s);
      std::_Exit(3);
    }
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  check_kernel(broken, status, "running the megakernel");
  input_in_flight = false;  // the stream is past the input's copies
  if (error_slot->kind != gpu::kErrorNone) {
    broken = true;
    throw_device_error(*error_slot);
  }
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "reading event times");
  return ms;
}

std::vector<float> GpuEngine::time_runs(int launches) {
  Impl& impl = *impl_;
  impl.check_usable();
  std::vector<float> times;
  for (int i = 0; i < launches; ++i) times.push_back(impl.timed_pass([&] { impl.launch(impl.params); }));
  return times;
}

std::vector<int32_t> GpuEngine::run_steps_and_read_sampled(int steps) {
  Impl& impl = *impl_;
  impl.check_usable();
  MK_CHECK(steps >= 1 && steps <= kMaxStepsPerSync && uint64_t(steps) * impl.max_signals < (uint64_t(1) << 32),
           "internal error: {} decode steps in one pass", steps);
  MK_CHECK(impl.graph.shape().pass == PassKind::kDecode,
           "internal error: steps without the host are a decode pass's, fed by its sampled ids");
  // NOTE: a launch's trace stamps are written before its griddepcontrol.wait: a traced group would mix two steps'.
  MK_CHECK(impl.params.trace_records == nullptr, "internal error: a group of steps is not traced");
  const int batch = int(impl.graph.shape().batch);
  if (impl.kept_ids == nullptr)
    impl.kept_ids = impl.arena.allocate<int32_t>(size_t(kMaxStepsPerSync) * batch, "allocating the kept ids");
  auto* ids =
      static_cast<int32_t*>(impl.readback_staging.reserve(size_t(steps) * batch * 4, "allocating pinned memory"));
  // NOTE: the first launch is a plain one, after the input's copies; the others are programmatic dependents of the
  // kernel before them (PDL), so that a step's CTAs start as the previous kernel's leave. After each step,
  // decode_advance keeps its ids in kept_ids and, but after the last, feeds them to the next step.
  impl.timed_pass(
      [&] {
        for (int step = 0; step < steps; ++step) {
          if (step > 0) impl.params.epoch += 1;
          impl.launch(impl.params, step > 0);
          check_kernel(impl.broken,
                       gpu::launch_decode_advance(impl.params, batch, impl.kept_ids + step * batch, step + 1 < steps,
                                                  impl.stream),
                       "keeping the sampled ids");
        }
      },
      [&] {
        check_kernel(impl.broken,
                     cudaMemcpyAsync(ids, impl.kept_ids, size_t(steps) * batch * 4, cudaMemcpyDeviceToHost,
                                     impl.stream),
                     "reading back ids");
      },
      steps);
  return std::vector<int32_t>(ids, ids + steps * batch);
}

std::vector<float> GpuEngine::time_runs_per_step(int launches) {
  Impl& impl = *impl_;
  impl.check_usable();
  MK_CHECK(impl.params.trace_records == nullptr, "internal error: per-step launches are not traced");
  if (impl.steps.empty()) impl.upload_steps();
  std::vector<float> times;
  for (int i = 0; i < launches; ++i) {
    times.push_back(impl.timed_pass([&] {
      MegakernelParams step_params = impl.params;  // the pass's epoch, set by timed_pass
      for (const Impl::StepLists& step : impl.steps) {
        step_params.instructions = step.instructions;
        step_params.sm_begin = step.sm_begin;
        impl.launch(step_params);
      }
    }));
  }
  return times;
}

Trace GpuEngine::run_traced() {
  Impl& impl = *impl_;
  const size_t num_instructions = impl.task_of_instruction.size();
  if (impl.trace_records == nullptr) {
    impl.trace_records = impl.arena.allocate<uint64_t>(num_instructions * gpu::kTraceSlots, "allocating the trace");
    impl.trace_sms = impl.arena.allocate<uint64_t>(size_t(impl.num_sms) * 4, "allocating the trace");
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

  return gpu::trace_of_stamps(records, sms, impl.sm_begin, impl.task_of_instruction, impl.num_sms,
                              double(times.at(0)) * 1e6);
}

ref::Matrix GpuEngine::output() const {
  const uint32_t id = impl_->graph.output_buffer();
  return gpu::download_buffer(impl_->graph.buffers()[id], impl_->buffer_address[id]);
}

void GpuEngine::copy_output_to_device(void* destination) const {
  const Impl& impl = *impl_;
  impl.check_usable();
  gpu::check_device_pointer(destination, "gpu engine: the output destination");
  const Buffer& buffer = impl.graph.buffers()[impl.graph.output_buffer()];
  const size_t bytes = size_t(buffer.rows * buffer.cols) * sizeof(bf16);
  check_cuda(cudaMemcpyAsync(destination, impl.buffer_address[impl.graph.output_buffer()], bytes,
                             cudaMemcpyDeviceToDevice, impl.stream),
             "copying the output");
  check_cuda(cudaStreamSynchronize(impl.stream), "copying the output");
}

std::vector<ref::Matrix> GpuEngine::buffers() const {
  std::vector<ref::Matrix> out;
  for (size_t b = 0; b < impl_->graph.buffers().size(); ++b)
    out.push_back(gpu::download_buffer(impl_->graph.buffers()[b], impl_->buffer_address[b]));
  return out;
}

ref::Matrix GpuEngine::buffer(BufferRef ref) const {
  impl_->check_usable();
  const uint32_t id = impl_->graph.buffer_table().id(ref);
  return gpu::download_buffer(impl_->graph.buffers()[id], impl_->buffer_address[id]);
}

size_t GpuEngine::device_bytes() const { return impl_->arena.bytes(); }

}  // namespace mk
