// cpu-vm: runs per-SM instruction lists on std::threads with atomic counters, tiles computed by the reference ops.
#include "mk/cpu_vm.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <system_error>
#include <thread>

#include "mk/check.h"
#include "mk/random.h"
#include "mk/writer_grid.h"

namespace mk {

namespace {

using Clock = std::chrono::steady_clock;

// The weights, once they are known to be for the model of the schedule.
const ModelWeights& weights_for(const ModelWeights& weights, const ModelConfig& config) {
  const std::string difference = first_difference(weights.config, config);
  MK_CHECK(difference.empty(), "cpu-vm: the weights are for another model than the schedule ({})", difference);
  return weights;
}

}  // namespace

class CpuVmSession::Impl {
 public:
  Impl(const Graph& graph, const Schedule& schedule, const ModelWeights& weights, const CpuVmOptions& options,
       std::vector<ref::Matrix>* cache)
      : graph_(graph), schedule_(schedule), options_(options), config_(graph.config()),
        counters_(schedule.num_counters),
        operands_(weights_for(weights, graph.config()), graph.shape().seq_len, graph.shape().max_context),
        cpu_{config_, operands_, input_, graph.buffer_table(), {}} {
    MK_CHECK(options.max_delay_us >= 0 && options.max_delay_us <= kMaxCpuVmDelayUs,
             "cpu-vm: max_delay_us must be in [0, {}], got {}", kMaxCpuVmDelayUs, options.max_delay_us);
    MK_CHECK(options.launches >= 1 && std::isfinite(options.stall_timeout_s) && options.stall_timeout_s > 0,
             "cpu-vm: launches ({}) and stall_timeout_s ({}) must be positive", options.launches,
             options.stall_timeout_s);
    const std::vector<Buffer>& buffers = graph.buffers();
    for (const Buffer& b : buffers) {
      const bool external = b.kind == BufferKind::kKvCache && cache != nullptr;
      run_.buffers.emplace_back(external ? 0 : b.rows, external ? 0 : b.cols);
      std::fill(run_.buffers.back().data.begin(), run_.buffers.back().data.end(), NAN);  // poison
    }
    for (size_t id = 0; id < buffers.size(); ++id) {
      const bool external = buffers[id].kind == BufferKind::kKvCache && cache != nullptr;
      if (external) {
        ref::Matrix& layer = cache->at(size_t(buffers[id].layer));
        MK_CHECK(layer.rows == buffers[id].rows && layer.cols == buffers[id].cols,
                 "cpu-vm: the KV cache's layer {} is ({}, {}), the schedule's ({}, {})", buffers[id].layer, layer.rows,
                 layer.cols, buffers[id].rows, buffers[id].cols);
      }
      out_.push_back(external ? &cache->at(size_t(buffers[id].layer)) : &run_.buffers[id]);
      cpu_.buffers.push_back(out_.back());
    }
    if (options.detect_races) {
      grids_ = build_writer_grids(graph, [](uint32_t, uint32_t, const Region&) {});
      position_of_task_.resize(graph.tasks().size());
      for (uint32_t sm = 0; sm < uint32_t(schedule.num_sms); ++sm)
        for (uint32_t i = schedule.sm_begin[sm]; i < schedule.sm_begin[sm + 1]; ++i)
          position_of_task_[schedule.instructions[i].task] = {sm, i - schedule.sm_begin[sm]};
      const size_t num_sms = size_t(schedule.num_sms);
      sm_clock_.assign(num_sms, std::vector<uint32_t>(num_sms, 0));
      counter_clock_.assign(schedule.num_counters, std::vector<uint32_t>(num_sms, 0));
      counter_clock_mutex_ = std::vector<std::mutex>(schedule.num_counters);
    }
  }

  void set_input(const ref::ModelInput& input) {
    MK_CHECK(input.shape == graph_.shape(), "cpu-vm: input of {} for a schedule built for {}", describe(input.shape),
             describe(graph_.shape()));
    ref::validate_input(config_, input);
    input_ = input;
    if (!config_.has_embedding) *out_[graph_.buffer_id(BufferKind::kHidden, 0)] = input.hidden;
  }

  const ref::Matrix& buffer(uint32_t id) const { return *out_.at(id); }
  const Trace& trace() const { return run_.trace; }
  CpuVmRun release() { return std::move(run_); }

  // Counters are never reset: launch e waits for e * target, as on the GPU.
  void launch() {
    MK_CHECK(error_.empty(), "cpu-vm: the session failed before: {}", error_);
    const uint32_t epoch = ++epoch_;
    if (options_.detect_races) {
      for (auto& clock : sm_clock_) std::fill(clock.begin(), clock.end(), 0);
      for (auto& clock : counter_clock_) std::fill(clock.begin(), clock.end(), 0);
    }
    if (options_.record_trace) {
      run_.trace.engine = "cpu-vm";
      run_.trace.num_sms = schedule_.num_sms;
      run_.trace.records.assign(schedule_.instructions.size(), TraceRecord{});
    }
    launch_start_ = Clock::now();
    std::vector<std::thread> threads;
    try {
      for (int32_t sm = 0; sm < schedule_.num_sms; ++sm)
        threads.emplace_back([this, sm, epoch] { run_sm(uint32_t(sm), epoch); });
    } catch (const std::system_error& error) {
      // Out of threads: stop the ones started, then report instead of terminating.
      fail(fmt::format("cpu-vm: cannot start a thread for each of {} SMs ({} started): {}", schedule_.num_sms,
                       threads.size(), error.what()));
    }
    for (std::thread& thread : threads) thread.join();
    run_.trace.launch_ns = since_launch();
    if (!error_.empty()) throw Error(error_);
  }

 private:
  void fail(const std::string& message) {
    std::lock_guard lock(error_mutex_);
    if (error_.empty()) error_ = message;
    stop_.store(true);
  }

  std::string where(uint32_t sm, uint32_t index) const {
    const Instruction& in = schedule_.instructions[schedule_.sm_begin[sm] + index];
    return fmt::format("SM {} instruction {} (task {}: {})", sm, index, in.task, graph_.describe(graph_.tasks()[in.task]));
  }

  // Acquire-waits until counter >= target, backing off from spinning to sleeping; false on stall or stop.
  bool wait_for(uint32_t sm, uint32_t index, const Wait& wait, uint32_t epoch) {
    const uint32_t target = epoch * wait.target;
    std::atomic<uint32_t>& counter = counters_[wait.counter];
    const auto deadline = Clock::now() + std::chrono::duration<double>(options_.stall_timeout_s);
    for (int attempt = 0; counter.load(std::memory_order_acquire) < target; ++attempt) {
      if (stop_.load(std::memory_order_relaxed)) return false;
      if (attempt < 64) {
        std::this_thread::yield();
        continue;
      }
      if (Clock::now() > deadline) {
        fail(fmt::format("cpu-vm stall: {} waited {} s on counter {} (value {}, target {})", where(sm, index),
                         options_.stall_timeout_s, wait.counter, counter.load(), target));
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(attempt, 1000)));
    }
    return true;
  }

  double since_launch() const { return std::chrono::duration<double, std::nano>(Clock::now() - launch_start_).count(); }

  void run_sm(uint32_t sm, uint32_t epoch) {
    Random random(options_.delay_seed * 7919 + sm * 31 + epoch);
    for (uint32_t i = schedule_.sm_begin[sm]; i < schedule_.sm_begin[sm + 1]; ++i) {
      const Instruction& in = schedule_.instructions[i];
      const uint32_t index = i - schedule_.sm_begin[sm];
      TraceRecord* record = options_.record_trace ? &run_.trace.records[i] : nullptr;
      if (options_.max_delay_us > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(random.next_u64() % uint64_t(options_.max_delay_us + 1)));
      if (std::find(options_.slow_tasks.begin(), options_.slow_tasks.end(), in.task) != options_.slow_tasks.end())
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.slow_task_delay_ms));
      if (record) *record = TraceRecord{sm, index, in.task, since_launch()};
      for (uint32_t k = 0; k < in.num_waits; ++k) {
        const Wait& wait = schedule_.waits[in.wait_begin + k];
        if (!wait_for(sm, index, wait, epoch)) return;
        if (options_.detect_races) join_clock(sm, wait.counter);
      }
      if (record) record->waits_done = since_launch();
      try {
        if (options_.detect_races) check_reads(sm, in);
        execute(in);
      } catch (const std::exception& error) {
        fail(fmt::format("{}: {}", where(sm, index), error.what()));
        return;
      }
      if (record) record->math_done = since_launch();
      if (options_.detect_races) {
        sm_clock_[sm][sm] = index + 1;
        std::lock_guard lock(counter_clock_mutex_[in.signal_counter]);
        auto& clock = counter_clock_[in.signal_counter];
        for (size_t s = 0; s < clock.size(); ++s) clock[s] = std::max(clock[s], sm_clock_[sm][s]);
      }
      counters_[in.signal_counter].fetch_add(1, std::memory_order_release);
      if (record) record->end = since_launch();
    }
  }

  void join_clock(uint32_t sm, uint32_t counter) {
    std::lock_guard lock(counter_clock_mutex_[counter]);
    const auto& clock = counter_clock_[counter];
    for (size_t s = 0; s < clock.size(); ++s) sm_clock_[sm][s] = std::max(sm_clock_[sm][s], clock[s]);
  }

  // Every writer of every region this instruction reads must happen-before it.
  void check_reads(uint32_t sm, const Instruction& in) {
    const TaskRegions regions = graph_.regions(graph_.tasks()[in.task]);
    for (int r = 0; r < regions.num_reads; ++r) {
      const Region& read = regions.reads[r];
      if (graph_.buffers()[read.buffer].host_written) continue;
      grids_[read.buffer].for_each_writer(read, [&](uint32_t writer) {
        MK_CHECK(writer != WriterGrid::kNoWriter, "reads {} where no task writes", graph_.buffers()[read.buffer].name());
        const auto [writer_sm, writer_index] = position_of_task_[writer];
        MK_CHECK(sm_clock_[sm][writer_sm] > writer_index,
                 "race: reads {} written by {}, which is not ordered before it by any wait", graph_.buffers()[read.buffer].name(),
                 where(writer_sm, writer_index));
      });
    }
  }

  // Interprets the instruction as the megakernel does, from its own fields.
  void execute(const Instruction& in) {
    const Task task{in.opcode, in.layer, in.row_begin, in.row_end, in.col_begin, in.col_end, in.sequence, in.head};
    const OpDescriptor& op = op_descriptor(task.opcode);
    op.run_cpu(cpu_, task, *out_[graph_.buffer_table().id(op.output(task.layer))]);
  }

  const Graph& graph_;
  const Schedule& schedule_;
  const CpuVmOptions options_;
  const ModelConfig& config_;
  std::vector<std::atomic<uint32_t>> counters_;  // (num_counters)
  uint32_t epoch_ = 0;
  CpuVmRun run_;                     // the buffers the session owns (not an external cache's), and the trace
  std::vector<ref::Matrix*> out_;    // (graph buffers): where each buffer lives
  const ref::ModelOperands operands_;
  ref::ModelInput input_;
  CpuTile cpu_;  // reads out_ and input_
  std::atomic<bool> stop_{false};
  Clock::time_point launch_start_;
  std::mutex error_mutex_;
  std::string error_;
  // race detector state
  std::vector<WriterGrid> grids_;
  std::vector<std::pair<uint32_t, uint32_t>> position_of_task_;  // (sm, index)
  std::vector<std::vector<uint32_t>> sm_clock_;       // (num_sms, num_sms): instructions of each SM known complete
  std::vector<std::vector<uint32_t>> counter_clock_;  // (num_counters, num_sms): join of the signalers' clocks
  std::vector<std::mutex> counter_clock_mutex_;
};

CpuVmSession::CpuVmSession(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                           const CpuVmOptions& options, std::vector<ref::Matrix>* cache)
    : impl_(std::make_unique<Impl>(graph, schedule, weights, options, cache)) {}
CpuVmSession::~CpuVmSession() = default;
void CpuVmSession::set_input(const ref::ModelInput& input) { impl_->set_input(input); }
void CpuVmSession::launch() { impl_->launch(); }
const ref::Matrix& CpuVmSession::buffer(uint32_t id) const { return impl_->buffer(id); }
const Trace& CpuVmSession::trace() const { return impl_->trace(); }
CpuVmRun CpuVmSession::release() { return impl_->release(); }

CpuVmRun run_cpu_vm_unverified(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                               const ref::ModelInput& input, const CpuVmOptions& options) {
  CpuVmSession session(graph, schedule, weights, options);
  session.set_input(input);
  for (int launch = 0; launch < options.launches; ++launch) session.launch();
  return session.release();
}

CpuVmRun run_cpu_vm(const Graph& graph, const Schedule& schedule, const ModelWeights& weights,
                    const ref::ModelInput& input, const CpuVmOptions& options) {
  verify_schedule(graph, schedule);
  return run_cpu_vm_unverified(graph, schedule, weights, input, options);
}

}  // namespace mk
