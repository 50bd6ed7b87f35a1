// The megakernel's compile-time configuration: warp roles, pipeline depth and the shared-memory layout, derived from
// the tile sizes of include/mk/tiles.h.
#pragma once

#include <cstdint>

#include "mk/tiles.h"

namespace mk::gpu {

struct KernelConfig {
  static constexpr int kBlockM = tiles::kBlockM;
  static constexpr int kBlockN = tiles::kBlockN;
  static constexpr int kBlockK = tiles::kBlockK;
  static constexpr int kBlockQ = tiles::kBlockQ;
  static constexpr int kBlockKv = tiles::kBlockKv;

  // ---- the stage ring: A and B slices of GEMM k-steps, or Q and K/V blocks of attention ----
  static constexpr int kNumStages = 4;
  static constexpr int kATileBytes = kBlockM * kBlockK * 2;
  static constexpr int kBTileBytes = 2 * kBlockN * kBlockK * 2;  // gate_up loads gate and up rows together
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;

  // ---- the epilogue staging tile: a GEMM's output (and residual) in the TMA box layout ----
  static constexpr int kBoxCols = 64;  // bf16 columns per 128-byte swizzled TMA box
  static constexpr int kOutputBoxes = kBlockN / kBoxCols;
  static constexpr int kOutputBoxBytes = kBlockM * kBoxCols * 2;
  static constexpr int kOutputBytes = kOutputBoxes * kOutputBoxBytes;

  // ---- warp roles ----
  // Warpgroup 0: warp 0 produces (TMA loads), warp 1 stores (TMA stores of staged GEMM tiles, then publication);
  // one elected thread each. Warpgroups 1 and 2 consume.
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kProducerThread = 0;
  static constexpr int kStorerThread = 32;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;

  // full/empty per stage, then staged (consumers -> storer), staging_free (storer -> all), residual (TMA -> consumers)
  static constexpr int kNumBarriers = 2 * kNumStages + 3;
  static constexpr int kBarrierBytes = kNumBarriers * 8 + 16;  // + the consumers' broadcast flag
  static constexpr int kSmemBytes = 1024 + kNumStages * kStageBytes + kOutputBytes + kBarrierBytes;  // + alignment
};

static_assert(KernelConfig::kBlockK * 2 == 128, "a K step is one 128-byte swizzled row of bf16");
static_assert(KernelConfig::kATileBytes % 1024 == 0 && KernelConfig::kStageBytes % 1024 == 0 &&
                  KernelConfig::kOutputBoxBytes % 1024 == 0,
              "128-byte-swizzled tiles must stay 1024-byte aligned");
static_assert(KernelConfig::kBlockN % KernelConfig::kBoxCols == 0, "output tiles are whole TMA boxes");
static_assert(KernelConfig::kSmemBytes <= 227 * 1024, "shared memory budget of one H100/H200 SM");
static_assert(2 * KernelConfig::kBlockQ * 128 <= KernelConfig::kStageBytes, "a query tile of head_dim 128 fits a stage");
static_assert(2 * 2 * KernelConfig::kBlockKv * 128 <= KernelConfig::kStageBytes, "K and V blocks fit a stage");
static_assert(128 * KernelConfig::kProducerRegisters + KernelConfig::kConsumerThreads * KernelConfig::kConsumerRegisters <=
                  65536,
              "register file of one SM");
static_assert(KernelConfig::kConsumerWarps * 16 == KernelConfig::kBlockQ, "one consumer warp per 16 queries");
static_assert(KernelConfig::kBlockM == 2 * 64, "each consumer warpgroup owns 64 rows of a GEMM tile");

}  // namespace mk::gpu
