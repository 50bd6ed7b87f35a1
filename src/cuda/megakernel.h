// Host entry points of the megakernel (compiled by nvcc, called from the C++ runtime).
#pragma once

#include <cuda_runtime.h>

#include "megakernel_params.h"

namespace mk::gpu {

// Raises both kernels' (forward and prefill; decode) dynamic shared-memory limit to what KernelConfig needs.
cudaError_t prepare_megakernel();
// How many CTAs of either kernel fit on one SM at once (after prepare_megakernel), the fewer of the two: a
// persistent launch needs >= 1.
cudaError_t megakernel_ctas_per_sm(int* ctas);
// Launches one persistent CTA per SM of the schedule (grid_size), KernelConfig::kThreads threads each: the decode
// kernel for decode passes (params.dims.decode), else the forward one.
cudaError_t launch_megakernel(const MegakernelParams& params, int grid_size, cudaStream_t stream);
// A decode step's next input on the device: each of the `batch` sequences feeds its sampled id at the next position
// (tokens <- sampled, positions += 1), so that steps follow one another without the host.
cudaError_t launch_decode_advance(const MegakernelParams& params, int batch, cudaStream_t stream);

}  // namespace mk::gpu
