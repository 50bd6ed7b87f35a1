// Synchronization of the megakernel: the shared-memory stage ring, bounded counter and barrier waits, publication of
// finished tiles to other SMs, and the error slot that turns a stall into a report instead of a hang.
#pragma once

#include <cstdint>

#include "../megakernel_params.h"
#include "config.cuh"
#include "ptx.cuh"

namespace mk::gpu {

// Position in the ring of shared-memory stages. Producer and consumers advance identical copies in the same order.
struct PipelineState {
  uint32_t stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == KernelConfig::kNumStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

struct SharedState {
  uint8_t* stages;           // kNumStages x kStageBytes, 1024-byte aligned
  uint8_t* output;           // kOutputBytes: the output tile (see output_tile.cuh), 1024-byte aligned
  uint64_t* full;            // (kNumStages) TMA bytes landed
  uint64_t* empty;           // (kNumStages) every consumer warp is done with the stage
  uint64_t* staged;          // every consumer warp has written its part of the output tile
  uint64_t* output_free;     // the storer's TMA store has read the output tile
  uint64_t* loaded;          // a TMA load into the output tile has landed (a GEMM's residual, attention's Q)
  uint64_t* ready;           // (kNumStages) the counter poller saw all of one instruction's counters met
  uint64_t* ready_free;      // (kNumStages) its reader (the producer; consumer thread 0 in decode passes) took that
                             // report: the slot can carry a later one
  uint64_t* held_loaded;     // the second residual half of a wide GEMM tile has landed in the held stage
  volatile uint32_t* flag;   // consumer broadcast: did the counter waits succeed
  volatile uint32_t* freed;  // uses of the output tile whose store has read it (the storer counts; see output_tile.cuh)
  volatile uint32_t* held_stage;  // the ring stage a wide GEMM tile's second output half is staged in (consumers ->
                                  // storer, published by the staged arrive)
  volatile uint32_t* last_of_group;  // consumer broadcast: did this linked attention task take its group's last ticket
  __device__ __forceinline__ uint8_t* stage(uint32_t index) const { return stages + index * KernelConfig::kStageBytes; }
};

// Where the calling code is, for error reports.
struct Site {
  uint32_t sm;
  uint32_t instruction;
  uint32_t task;
};

__device__ __forceinline__ bool aborting(const MegakernelParams& p) {
  return *reinterpret_cast<volatile const uint32_t*>(&p.error->abort) != 0;
}

__device__ __forceinline__ void report_error(const MegakernelParams& p, ErrorKind kind, Site site, uint32_t counter,
                                          uint32_t value, uint32_t target) {
  if (atomicCAS(&p.error->kind, kErrorNone, uint32_t(kind)) == kErrorNone) {
    p.error->sm = site.sm;
    p.error->instruction = site.instruction;
    p.error->task = site.task;
    p.error->counter = counter;
    p.error->value = value;
    p.error->target = target;
    __threadfence();
  }
  atomicExch(&p.error->abort, 1u);
}

// Acquire-waits until counters[wait.counter] >= epoch * wait.target. False when the kernel is aborting.
__device__ __forceinline__ bool wait_counter(const MegakernelParams& p, const Wait& wait, Site site) {
  if (p.skip_dependency_waits) return true;
  const uint32_t target = p.epoch * wait.target;
  const uint32_t* counter = p.counters + wait.counter;
  uint32_t value = ptx::load_acquire(counter);
  if (value >= target) return true;
  const uint64_t start = ptx::global_timer_ns();
  // NOTE: a decode step is a chain of short dependent phases, each wait ending a phase's critical path, so decode
  // polls more often. The forward's waits are the counter poller's (a warp that has nothing else to do) and the
  // consumers' before row-wise ops (idle while they wait), so they poll every 128 ns at most: at 512 ns the seed's
  // hops from publication to a wait's end were 0.7-1.1 us (seventh session, run 6). Measured against 512: neutral on
  // the seed and S=4096 (eighth session, run 1).
  const uint32_t max_sleep_ns = p.dims.decode ? 64 : 128;
  uint32_t sleep_ns = 32;
  while (true) {
    value = ptx::load_acquire(counter);
    if (value >= target) return true;
    if (aborting(p)) return false;
    if (ptx::global_timer_ns() - start > p.stall_timeout_ns) {
      report_error(p, kErrorCounterStall, site, wait.counter, value, target);
      return false;
    }
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < max_sleep_ns ? 2 * sleep_ns : sleep_ns;
  }
}

// One thread: waits until every counter the instruction waits on has reached its target. For the consumers'
// row-wise ops of forward and prefill passes, which wait on one or two counters.
// NOTE: an acquire load is a load and an L1 invalidation, and the next load waits behind both: ~0.5 us a counter
// (the instruction's wait list is read again from L2 each time). Many counters are the counter poller's work.
__device__ __forceinline__ bool wait_all_counters(const MegakernelParams& p, const Instruction& in, Site site) {
  for (uint32_t k = 0; k < in.num_waits; ++k)
    if (!wait_counter(p, p.waits[in.wait_begin + k], site)) return false;
  return true;
}

// A whole warp (all 32 lanes): the same, lane j waiting on waits j, j + 32, ..., so that one round of loads checks up
// to 32 counters. Every lane returns the same answer.
__device__ __forceinline__ bool warp_wait_all_counters(const MegakernelParams& p, const Instruction& in, Site site,
                                                       uint32_t lane) {
  bool ok = true;
  for (uint32_t k = lane; k < in.num_waits && ok; k += 32) ok = wait_counter(p, p.waits[in.wait_begin + k], site);
  return __all_sync(0xffffffffu, ok);
}

// Spins until done() holds on shared memory: false when the kernel is aborting, or past the timeout (reported as a
// pipeline stall).
template <typename Done>
__device__ __forceinline__ bool wait_in_shared(const MegakernelParams& p, Site site, Done done) {
  if (done()) return true;
  const uint64_t start = ptx::global_timer_ns();
  while (!done()) {
    if (aborting(p)) return false;
    if (ptx::global_timer_ns() - start > p.pipeline_stall_timeout_ns) {
      report_error(p, kErrorPipelineStall, site, ~0u, 0, 0);
      return false;
    }
  }
  return true;
}

// Waits for an mbarrier phase; false when the kernel is aborting or this wait ran past the timeout.
__device__ __forceinline__ bool wait_barrier(const MegakernelParams& p, uint64_t* barrier, uint32_t parity, Site site) {
  return wait_in_shared(p, site, [&] { return ptx::mbarrier_try_wait(barrier, parity); });
}

// The producer: whether the counter poller (run_counter_poller) reported the counters of the producer's next
// instruction met; if so, takes the report and frees its slot. Each poller lane's arrive releases what its acquire
// loads saw, and this wait acquires it. `ready` walks a ring of kNumStages slots, as the poller's own cursor does.
// NOTE: the poller runs ahead, so when the producer turns to an instruction its counters are usually checked already;
// when not, the check took one L2 round trip, not one per counter.
__device__ __forceinline__ bool take_ready(const SharedState& s, PipelineState& ready) {
  if (!ptx::mbarrier_test_wait(&s.ready[ready.stage], ready.phase)) return false;
  ptx::mbarrier_arrive(&s.ready_free[ready.stage]);
  ready.advance();
  return true;
}

// Waits for the counter poller's report in the ready ring's slot `ready` (not taking it). False when the kernel is
// aborting. NOTE: no timeout of its own: the poller stops only at the end of its list or on an abort, and its counter
// wait times out first, naming the counter.
__device__ __forceinline__ bool wait_ready_slot(const MegakernelParams& p, const SharedState& s,
                                                const PipelineState& ready) {
  while (!ptx::mbarrier_try_wait(&s.ready[ready.stage], ready.phase))
    if (aborting(p)) return false;
  return true;
}

// The producer: waits for that report, then takes it. False when the kernel is aborting.
__device__ __forceinline__ bool wait_ready(const MegakernelParams& p, const SharedState& s, PipelineState& ready) {
  return wait_ready_slot(p, s, ready) && take_ready(s, ready);
}

// All consumer threads: thread 0 waits on the instruction's counters (bounded) and tells the others, so that all
// consumers go on, or leave on an abort, together. `healthy`: this thread's warpgroup has seen no failed wait since
// the last row-wise instruction; the barrier ANDs it over both warpgroups at no extra cost. In decode passes thread 0
// waits instead for the counter poller's report on the instruction, the next slot of the ready ring (`reported`): the
// poller's acquire loads, released by its arrive, are acquired by this wait and passed on by the barrier.
// kDecode: the kernel runs decode passes (megakernel_decode and megakernel_decode_narrow).
template <bool kDecode>
__device__ __forceinline__ bool consumers_wait(const MegakernelParams& p, const SharedState& s, const Instruction& in,
                                               Site site, int consumer_thread, bool healthy, PipelineState& reported) {
  if (consumer_thread == 0) {
    // NOTE: the report's wait has no timeout of its own, as the producer's (wait_ready): the poller's counter waits
    // time out first and name the counter, and a timeout here could fire first when a lane waits on two counters.
    const bool met = kDecode ? wait_ready_slot(p, s, reported) : wait_all_counters(p, in, site);
    *s.flag = met ? 1u : 0u;
  }
  const bool all_healthy = ptx::named_barrier_and(1, KernelConfig::kConsumerThreads, healthy);
  const bool ok = all_healthy && *s.flag != 0;
  if constexpr (kDecode) {
    // every consumer thread has passed the wait: the poller may refill the slot
    if (consumer_thread == 0 && ok) ptx::mbarrier_arrive(&s.ready_free[reported.stage]);
    reported.advance();
  }
  // The flag is rewritten at the next instruction only after publish's barrier, which every thread passes after
  // reading it here.
  return ok;
}

// Called by every consumer warp when it is done reading a stage.
__device__ __forceinline__ void release_stage(const SharedState& s, uint32_t stage) {
  __syncwarp();
  if (threadIdx.x % 32 == 0) ptx::mbarrier_arrive(&s.empty[stage]);
}

// Makes the tile the consumers just stored visible to every SM, then counts it.
// NOTE: the bar.sync orders all consumer threads' stores before thread 0's release, which is cumulative: an SM that
// acquires the counter sees them all (the grid-barrier pattern; no extra __threadfence). The proxy fence lets other
// SMs read the data with TMA (async proxy) after they acquire the counter. `count` false: only the barrier, for a
// tile whose counter nobody waits on (a linked decode attention task: its combine ticket releases the tile instead).
__device__ __forceinline__ void publish(const MegakernelParams& p, uint32_t counter, uint32_t consumer_thread,
                                       bool count = true) {
  ptx::named_barrier_sync(1, KernelConfig::kConsumerThreads);
  if (consumer_thread == 0 && count) {
    ptx::fence_proxy_async_global();
    ptx::add_release(p.counters + counter, 1);
  }
}

}  // namespace mk::gpu
