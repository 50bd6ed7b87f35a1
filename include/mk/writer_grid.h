// Which task writes each cell of each buffer: the grid spanned by all write boundaries of a buffer. Shared by the
// verifier (overlap and coverage checks) and the cpu-vm's race detector.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "mk/graph.h"

namespace mk {

struct WriterGrid {
  static constexpr uint32_t kNoWriter = std::numeric_limits<uint32_t>::max();
  std::vector<int32_t> row_bounds;  // (row cells + 1): sorted distinct row boundaries of the buffer's writes
  std::vector<int32_t> col_bounds;  // (col cells + 1)
  std::vector<uint32_t> writer;  // (row cells, col cells): the task writing each cell, kNoWriter if none

  size_t num_col_cells() const { return col_bounds.size() - 1; }
  size_t row_cell(int32_t row) const {
    return size_t(std::upper_bound(row_bounds.begin(), row_bounds.end(), row) - row_bounds.begin()) - 1;
  }
  size_t col_cell(int32_t col) const {
    return size_t(std::upper_bound(col_bounds.begin(), col_bounds.end(), col) - col_bounds.begin()) - 1;
  }
  uint32_t writer_at(int32_t row, int32_t col) const {
    if (row_bounds.empty() || row < row_bounds.front() || row >= row_bounds.back() || col < col_bounds.front() ||
        col >= col_bounds.back())
      return kNoWriter;
    return writer[row_cell(row) * num_col_cells() + col_cell(col)];
  }
  // Calls visit(task) for the writer of every cell the region touches (kNoWriter for unwritten cells inside the grid).
  template <typename Visit>
  void for_each_writer(const Region& region, Visit&& visit) const {
    if (row_bounds.empty()) return;
    const size_t first_row = row_cell(std::max(region.row_begin, row_bounds.front()));
    const size_t first_col = col_cell(std::max(region.col_begin, col_bounds.front()));
    for (size_t i = first_row; i + 1 < row_bounds.size() && row_bounds[i] < region.row_end; ++i)
      for (size_t j = first_col; j + 1 < col_bounds.size() && col_bounds[j] < region.col_end; ++j)
        visit(writer[i * num_col_cells() + j]);
  }
};

// One grid per buffer. on_overlap(first task, second task, cell) is called when two tasks write the same cell.
std::vector<WriterGrid> build_writer_grids(const Graph& graph,
                                           const std::function<void(uint32_t, uint32_t, const Region&)>& on_overlap);

}  // namespace mk
