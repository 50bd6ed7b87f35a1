// The megakernel's raw trace stamps (clock64 per instruction and slot, per-SM clock and timer pairs) as a Trace.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/trace.h"

namespace mk::gpu {

// records: (num_instructions, kTraceSlots) clock64 stamps, 0 where a slot was not stamped; sms: (num_sms, 4) each
// SM's globaltimer and clock64 at its start and end; sm_begin: (num_sms + 1) the schedule's list offsets; tasks:
// (num_instructions) the task of each instruction. launch_ns: the launch's time measured outside the trace.
Trace trace_of_stamps(const std::vector<uint64_t>& records, const std::vector<uint64_t>& sms,
                      const std::vector<uint32_t>& sm_begin, const std::vector<uint32_t>& tasks, int32_t num_sms,
                      double launch_ns);

}  // namespace mk::gpu
