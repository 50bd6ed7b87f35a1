// The model on the device: weights packed the way the tiles read them, one activation allocation per buffer kind,
// and the tensor maps of every TMA operand, all written into the megakernel's parameters.
#pragma once

#include <vector>

#include "device_memory.h"
#include "megakernel_params.h"
#include "mk/graph.h"
#include "mk/weights.h"

namespace mk::gpu {

// Fills params' dimensions, weight and activation pointers and tensor maps; returns the device address of every
// graph buffer, (graph.buffers().size()). kv_cache: the caller's cache (prefill and decode passes share one), or
// null to allocate the pass's own. shared_weights: the parameters of an engine whose weights (and RoPE table, long
// enough for this graph) are already on the device, or null to upload them.
std::vector<void*> upload_model(DeviceArena& arena, const Graph& graph, const ModelWeights& weights, void* kv_cache,
                                const MegakernelParams* shared_weights, MegakernelParams& params);

}  // namespace mk::gpu
