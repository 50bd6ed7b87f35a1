// Writer grids: built from the write regions of a graph's tasks, reporting any cell two tasks write.
#include "mk/writer_grid.h"

namespace mk {

std::vector<WriterGrid> build_writer_grids(const Graph& graph,
                                           const std::function<void(uint32_t, uint32_t, const Region&)>& on_overlap) {
  const std::vector<Task>& tasks = graph.tasks();
  std::vector<WriterGrid> grids(graph.buffers().size());
  std::vector<Region> writes(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    writes[t] = graph.regions(tasks[t]).write;
    WriterGrid& grid = grids[writes[t].buffer];
    grid.row_bounds.insert(grid.row_bounds.end(), {writes[t].row_begin, writes[t].row_end});
    grid.col_bounds.insert(grid.col_bounds.end(), {writes[t].col_begin, writes[t].col_end});
  }
  for (WriterGrid& grid : grids) {
    for (auto* bounds : {&grid.row_bounds, &grid.col_bounds}) {
      std::sort(bounds->begin(), bounds->end());
      bounds->erase(std::unique(bounds->begin(), bounds->end()), bounds->end());
    }
    if (!grid.row_bounds.empty())
      grid.writer.assign((grid.row_bounds.size() - 1) * grid.num_col_cells(), WriterGrid::kNoWriter);
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    const Region& w = writes[t];
    WriterGrid& grid = grids[w.buffer];
    for (size_t i = grid.row_cell(w.row_begin); i + 1 < grid.row_bounds.size() && grid.row_bounds[i] < w.row_end; ++i) {
      for (size_t j = grid.col_cell(w.col_begin); j + 1 < grid.col_bounds.size() && grid.col_bounds[j] < w.col_end; ++j) {
        uint32_t& cell = grid.writer[i * grid.num_col_cells() + j];
        if (cell != WriterGrid::kNoWriter) {
          on_overlap(cell, uint32_t(t),
                     Region{w.buffer, grid.row_bounds[i], grid.row_bounds[i + 1], grid.col_bounds[j], grid.col_bounds[j + 1]});
        }
        cell = uint32_t(t);
      }
    }
  }
  return grids;
}

}  // namespace mk
