// What the megakernels serve: which kernel runs which ops, and the shapes the decode handlers
// (src/cuda/device/ops/decode_*.cuh) take.
#pragma once

#include "mk/graph.h"

namespace mk::gpu {

// Throws mk::Error naming what the graph asks that the kernels cannot serve: a decode op outside a decode pass or a
// forward op inside one (each kernel serves its own passes' opcodes, src/cuda/megakernel.cu), or a decode shape past
// the decode handlers' limits.
void check_kernel_limits(const Graph& graph);

}  // namespace mk::gpu
