// Runs a schedule's per-SM lists in order on counter values alone: the model of execution that the verifier's
// liveness proof and the cost-model estimate share.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "mk/schedule.h"

namespace mk {

// Calls execute(sm, instruction index) for each instruction in an order that in-order execution allows. Returns,
// per SM, how many of its instructions ran: fewer than its list means the SM is stuck forever.
inline std::vector<uint32_t> run_in_order(const Schedule& schedule,
                                          const std::function<void(uint32_t sm, uint32_t index)>& execute) {
  const size_t num_sms = size_t(schedule.num_sms);
  std::vector<uint32_t> next(num_sms);
  for (size_t s = 0; s < num_sms; ++s) next[s] = schedule.sm_begin[s];
  std::vector<uint32_t> value(schedule.num_counters, 0);
  // Per counter, the SMs blocked on it, by the value they need: woken as soon as it is reached.
  using Blocked = std::pair<uint32_t, uint32_t>;  // (target, sm)
  std::vector<std::priority_queue<Blocked, std::vector<Blocked>, std::greater<>>> blocked(schedule.num_counters);
  std::vector<uint32_t> runnable(num_sms);
  for (size_t s = 0; s < num_sms; ++s) runnable[s] = uint32_t(num_sms - 1 - s);
  while (!runnable.empty()) {
    const uint32_t sm = runnable.back();
    runnable.pop_back();
    while (next[sm] < schedule.sm_begin[sm + 1]) {
      const Instruction& in = schedule.instructions[next[sm]];
      bool waiting = false;
      for (uint32_t k = 0; k < in.num_waits && !waiting; ++k) {
        const Wait& w = schedule.waits[in.wait_begin + k];
        if (value[w.counter] < w.target) {
          blocked[w.counter].push({w.target, sm});
          waiting = true;
        }
      }
      if (waiting) break;
      execute(sm, next[sm] - schedule.sm_begin[sm]);
      auto& queue = blocked[in.signal_counter];
      ++value[in.signal_counter];
      while (!queue.empty() && queue.top().first <= value[in.signal_counter]) {
        runnable.push_back(queue.top().second);
        queue.pop();
      }
      ++next[sm];
    }
  }
  std::vector<uint32_t> done(num_sms);
  for (size_t s = 0; s < num_sms; ++s) done[s] = next[s] - schedule.sm_begin[s];
  return done;
}

}  // namespace mk
