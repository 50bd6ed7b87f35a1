// The megakernel's raw trace stamps turned into a Trace on the global timer's time line.
#include "trace_stamps.h"

#include <algorithm>

#include "megakernel_params.h"
#include "mk/check.h"

namespace mk::gpu {

namespace {

// Each SM's clock64 runs at its own offset: its stamps map onto the global timer through the SM's first and last
// (globaltimer, clock64) pairs. -1 for a slot never stamped.
struct SmClocks {
  const std::vector<uint64_t>& sms;  // (num_sms, 4)
  uint64_t base;                     // the earliest SM start on the global timer
  double to_ns(uint64_t sm, uint64_t clock) const {
    const uint64_t* stamps = &sms[size_t(4 * sm)];
    const double ns_per_clock =
        stamps[3] > stamps[1] ? double(stamps[2] - stamps[0]) / double(stamps[3] - stamps[1]) : 0.0;
    return clock == 0 ? -1.0 : double(stamps[0] - base) + double(int64_t(clock - stamps[1])) * ns_per_clock;
  }
};

// The record of the instruction whose stamps are `slot`, listed on SM `sm`. A linked decode combine's stamps are in
// the clock of the SM that ran it, which its kTraceRanOnSm slot names.
TraceRecord record_of(const uint64_t* slot, const SmClocks& clocks, int32_t num_sms, uint32_t sm) {
  const uint64_t ran_on_plus_1 = slot[kTraceRanOnSm];
  MK_CHECK(ran_on_plus_1 <= uint64_t(num_sms), "internal error: a trace record ran on SM {} of {}",
           ran_on_plus_1 - 1, num_sms);
  const uint64_t clock_sm = ran_on_plus_1 > 0 ? ran_on_plus_1 - 1 : sm;
  const auto to_ns = [&](TraceSlot s) { return clocks.to_ns(clock_sm, slot[s]); };
  TraceRecord r;
  r.sm = sm;
  if (ran_on_plus_1 > 0) r.ran_on_sm = int32_t(clock_sm);
  r.start = to_ns(kTraceStart);
  r.waits_done = to_ns(kTraceWaitsDone);
  r.data_ready = to_ns(kTraceDataReady);
  r.math_done = to_ns(kTraceMathDone);
  r.end = to_ns(kTraceEnd);
  r.producer_start = to_ns(kTraceProducerStart);
  r.producer_waits_done = to_ns(kTraceProducerWaitsDone);
  r.producer_loads_issued = to_ns(kTraceProducerLoadsIssued);
  r.published = to_ns(kTracePublished);
  r.tile_free = to_ns(kTraceTileFree);
  return r;
}

}  // namespace

Trace trace_of_stamps(const std::vector<uint64_t>& records, const std::vector<uint64_t>& sms,
                      const std::vector<uint32_t>& sm_begin, const std::vector<uint32_t>& tasks, int32_t num_sms,
                      double launch_ns) {
  uint64_t base = UINT64_MAX;
  for (int32_t s = 0; s < num_sms; ++s) base = std::min(base, sms[size_t(4 * s)]);
  const SmClocks clocks{sms, base};
  Trace trace;
  trace.engine = "gpu";
  trace.num_sms = num_sms;
  trace.launch_ns = launch_ns;
  for (int32_t s = 0; s < num_sms; ++s) {
    for (uint32_t i = sm_begin[size_t(s)]; i < sm_begin[size_t(s) + 1]; ++i) {
      TraceRecord r = record_of(&records[size_t(i) * kTraceSlots], clocks, num_sms, uint32_t(s));
      r.index = i - sm_begin[size_t(s)];
      r.task = tasks[i];
      trace.records.push_back(r);
    }
  }
  return trace;
}

}  // namespace mk::gpu
