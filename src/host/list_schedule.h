// List scheduling of a pass's counter dependencies onto SMs, from the pass's start forward or from its end backward.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/graph.h"
#include "mk/schedule.h"

namespace mk {

// Each SM's task indices in execution order. cost: (num_tasks) estimated ns per task. Every list is ordered by
// planned start, and each task's planned start follows its dependencies' planned finish, so running the lists in
// order cannot deadlock.
std::vector<std::vector<uint32_t>> list_schedule(const std::vector<double>& cost, const Dependencies& deps,
                                                 int32_t num_sms, ListDirection direction);

}  // namespace mk
