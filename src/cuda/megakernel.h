// Host entry points of the megakernel (compiled by nvcc, called from the C++ runtime).
#pragma once

#include <cuda_runtime.h>

#include "megakernel_params.h"

namespace mk::gpu {

// Raises the four kernels' (forward and prefill; decode; narrow decode; wide decode) dynamic shared-memory limit to
// what KernelConfig needs.
cudaError_t prepare_megakernel();
// How many CTAs of any of the kernels fit on one SM at once (after prepare_megakernel), the fewest of them: a
// persistent launch needs >= 1.
cudaError_t megakernel_ctas_per_sm(int* ctas);
// Launches one persistent CTA per SM of the schedule (grid_size), KernelConfig::kThreads threads each: the decode
// kernel for decode passes (params.dims.decode; its narrow compilation when every decode GEMM pass is of 1-2 rows, its
// wgmma one above 8 batch rows), else the forward one. `programmatic`: as a programmatic dependent launch (a decode
// group's launches after its first), which may start before the stream's previous kernel ends; each thread waits for
// that kernel before it reads what the group writes.
cudaError_t launch_megakernel(const MegakernelParams& params, int grid_size, cudaStream_t stream, bool programmatic);
// After a decode step's launch, as its programmatic dependent: keeps each of the `batch` sequences' sampled ids in
// `kept` (batch), and if `advance`, makes them the next step's input on the device (tokens <- sampled, positions += 1),
// so that steps follow one another without the host.
cudaError_t launch_decode_advance(const MegakernelParams& params, int batch, int32_t* kept, bool advance,
                                  cudaStream_t stream);

}  // namespace mk::gpu
