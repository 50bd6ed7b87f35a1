// Tile sizes: defined once here, read by the graph (how ops tile their outputs) and by the megakernel (shared-memory
// layout, static_asserts in src/cuda/device/config.cuh). Plain constexpr, no includes, so nvcc and g++ read the same.
#pragma once

#include <cstdint>

namespace mk::tiles {

constexpr int32_t kBlockM = 128;  // token rows per GEMM tile
constexpr int32_t kBlockN = 128;  // output columns per GEMM tile (gate_up: 128 gate and 128 up weight rows)
constexpr int32_t kBlockK = 64;   // K step: one 128-byte swizzled row of bf16; K dimensions must be multiples of it
constexpr int32_t kBlockQ = 128;  // queries per attention tile
constexpr int32_t kBlockKv = 128;  // keys per attention K or V stage
// NOTE: row-wise tasks (embedding, norms) move bytes, not FLOPs: 32 rows spread a norm over 4x more SMs than a GEMM
// row block and shorten the norm -> GEMM hop on the critical path.
constexpr int32_t kBlockRows = 32;  // token rows per embedding and norm task
// NOTE: a GEMM whose weights do not fit in L2 emits its tiles in groups of kGroupM row blocks, column by column
// within a group, so that the ~132 tiles in flight share weight tiles through L2 instead of each streaming its own
// from HBM (measured: 1 layer of d_model 4096, 2.17 -> 1.64 ms). Smaller GEMMs go row block by row block, which
// finishes rows earliest for the next op (measured: the seed preset, 1.288 -> 1.276 ms).
constexpr int32_t kGroupM = 8;
constexpr int64_t kL2ResidentWeightBytes = int64_t(24) << 20;  // half the H200's 50 MB L2 (60 MB reported)

}  // namespace mk::tiles
