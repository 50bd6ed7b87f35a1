// Host entry points of the megakernel (compiled by nvcc, called from the C++ runtime).
#pragma once

#include <cuda_runtime.h>

#include "megakernel_params.h"

namespace mk::gpu {

// Raises the kernel's dynamic shared-memory limit to what KernelConfig needs.
cudaError_t prepare_megakernel();
// Launches one persistent CTA per SM of the schedule (grid_size), KernelConfig::kThreads threads each.
cudaError_t launch_megakernel(const MegakernelParams& params, int grid_size, cudaStream_t stream);

}  // namespace mk::gpu
