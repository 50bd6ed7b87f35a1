// The megakernel's compile-time configuration: tile sizes, pipeline depth, warp roles and the shared-memory budget.
#pragma once

#include <cstdint>

namespace mk::gpu {

struct KernelConfig {
  static constexpr int kBlockM = 128;   // token rows per GEMM tile
  static constexpr int kBlockN = 128;   // output columns per GEMM tile
  static constexpr int kBlockNWide = 256;  // output columns per qkv and lm_head tile
  static constexpr int kBlockK = 64;    // bf16 elements per 128-byte swizzled row: one TMA box, four wgmma k-steps
  static constexpr int kBlockQ = 128;   // queries per attention tile
  static constexpr int kBlockKv = 64;   // keys per attention pipeline stage

  static constexpr int kNumStages = 4;
  static constexpr int kATileBytes = kBlockM * kBlockK * 2;
  static constexpr int kBTileBytes = 2 * kBlockN * kBlockK * 2;  // gate_up loads gate and up rows together
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;

  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;  // warpgroup 0 produces, the others consume
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;

  static constexpr int kBarrierBytes = 2 * kNumStages * 8 + 16;
  static constexpr int kSmemBytes = 1024 + kNumStages * kStageBytes + kBarrierBytes;  // + alignment slack
};

static_assert(KernelConfig::kATileBytes % 1024 == 0 && KernelConfig::kStageBytes % 1024 == 0,
              "128-byte-swizzled tiles must stay 1024-byte aligned");
static_assert(KernelConfig::kSmemBytes <= 227 * 1024, "shared memory budget of one H100/H200 SM");
static_assert(2 * KernelConfig::kBlockQ * 128 <= KernelConfig::kStageBytes, "a query tile of head_dim 128 fits a stage");
static_assert(2 * 2 * KernelConfig::kBlockKv * 128 <= KernelConfig::kStageBytes, "K and V blocks fit a stage");
static_assert(128 * KernelConfig::kProducerRegisters + KernelConfig::kConsumerThreads * KernelConfig::kConsumerRegisters <=
                  65536,
              "register file of one SM");
static_assert(KernelConfig::kConsumerWarps * 16 == KernelConfig::kBlockQ, "one consumer warp per 16 queries");

}  // namespace mk::gpu
