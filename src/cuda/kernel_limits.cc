// What the megakernels serve, checked on the host before anything is allocated (kernel_limits.h).
#include "kernel_limits.h"

#include <algorithm>

#include "device/config.cuh"
#include "mk/check.h"
#include "mk/ops.h"

namespace mk::gpu {

void check_kernel_limits(const Graph& graph) {
  const ModelConfig& c = graph.config();
  // Each kernel serves its own passes' opcodes (src/cuda/megakernel.cu): decode ops come after kKvAppend.
  if (graph.shape().pass != PassKind::kDecode) {
    for (const Task& task : graph.tasks())
      MK_CHECK(task.opcode <= Opcode::kKvAppend, "internal error: the decode op {} outside a decode pass",
               opcode_name(task.opcode));
    return;
  }
  MK_CHECK(c.group_size() <= 8, "gpu engine: decode attention serves at most 8 query heads per kv head, not {}",
           c.group_size());
  MK_CHECK(c.head_dim <= 256 && c.head_dim % 8 == 0,
           "gpu engine: decode attention needs a head_dim <= 256 and a multiple of 8, not {}", c.head_dim);
  // NOTE: decode ops stage their input rows in the stage ring, which is free only because no TMA op shares the
  // schedule.
  for (const Task& task : graph.tasks())
    MK_CHECK(task.opcode > Opcode::kKvAppend || task.opcode == Opcode::kEmbed,
             "internal error: a decode pass with the forward op {}", opcode_name(task.opcode));
  const int64_t widest = std::max({c.d_model, c.q_dim(), c.d_ff});
  MK_CHECK(2 * widest <= KernelConfig::kDecodeStagedRowBytes,
           "gpu engine: a decode input row of {} values does not fit the megakernel's shared memory", widest);
  // stage_decode_rows keeps the fused norm's weight in the output tile, after the rows' 1 / rms
  MK_CHECK(2 * c.d_model + KernelConfig::kDecodeInvRmsBytes <= KernelConfig::kOutputBytes,
           "gpu engine: a decode norm weight of {} values does not fit the megakernel's shared memory", c.d_model);
}

}  // namespace mk::gpu
