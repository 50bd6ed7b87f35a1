// Regions of graph tasks as text, for readable expectations in the op and graph tests.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mk/graph.h"

namespace mk::testing_util {

// "name rows [a,b) cols [c,d)" of a region.
inline std::string text(const Graph& graph, const Region& r) {
  return fmt::format("{} rows [{},{}) cols [{},{})", graph.buffers()[r.buffer].name(), r.row_begin, r.row_end,
                     r.col_begin, r.col_end);
}

// The write and reads of the first task of `opcode` in `layer` whose rectangle starts at (row, col).
inline std::vector<std::string> regions_of(const Graph& graph, Opcode opcode, uint16_t layer, int32_t row,
                                           int32_t col) {
  for (const Task& t : graph.tasks()) {
    if (t.opcode != opcode || t.layer != layer || t.row_begin != row || t.col_begin != col) continue;
    const TaskRegions regions = graph.regions(t);
    std::vector<std::string> out{"write " + text(graph, regions.write)};
    for (int r = 0; r < regions.num_reads; ++r) out.push_back("read " + text(graph, regions.reads[r]));
    return out;
  }
  ADD_FAILURE() << "no task " << opcode_name(opcode) << " L" << layer << " at row " << row << " col " << col;
  return {};
}

}  // namespace mk::testing_util
