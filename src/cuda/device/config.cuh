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
  // Warpgroup 0: warp 0 produces (TMA loads), warp 1 stores (TMA stores of staged GEMM tiles, then publication),
  // one elected thread each; warp 2 polls the producer's counters ahead of it. Warpgroups 1 and 2 consume.
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kProducerThread = 0;
  static constexpr int kStorerThread = 32;
  static constexpr int kCounterPollerWarp = 2;  // all 32 lanes: checks the producer's counters ahead of it
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;

  // ---- decode GEMMs (ops/decode_gemm.cuh): the idle stage ring holds the tile's input rows, then each consumer
  // warp's ring of weight steps ----
  static constexpr int kDecodeWeightRingBytes = 128 * 1024;
  static constexpr int kDecodeStagedRowBytes = kNumStages * kStageBytes - kDecodeWeightRingBytes;
  // The output tile, idle in decode, holds each staged row's 1 / rms in its first kDecodeInvRmsBytes, then the fused
  // norm's weight (stage_decode_rows). The wgmma decode GEMMs (batch > 8) use the whole stage ring as their own
  // ring and the output tile as their scratch (ops/decode_gemm_wgmma.cuh).
  static constexpr int kDecodeInvRmsBytes = 256;

  // full/empty per stage, then staged (consumers -> storer), output_free (storer -> consumers), loaded (TMA ->
  // consumers), then ready/ready_free per slot of the counter poller's ring (poller -> producer, of kNumStages slots),
  // then held_loaded (a wide tile's second residual half, TMA -> consumers)
  static constexpr int kNumBarriers = 2 * kNumStages + 3 + 2 * kNumStages + 1;
  // + the consumers' broadcast flag, the freed count, the held stage, the last-of-group flag (a word each)
  static constexpr int kBarrierBytes = kNumBarriers * 8 + 16;
  static constexpr int kSmemBytes = 1024 + kNumStages * kStageBytes + kOutputBytes + kBarrierBytes;  // + alignment
};

static_assert(KernelConfig::kBlockK * 2 == 128, "a K step is one 128-byte swizzled row of bf16");
static_assert(KernelConfig::kATileBytes % 1024 == 0 && KernelConfig::kStageBytes % 1024 == 0 &&
                  KernelConfig::kOutputBoxBytes % 1024 == 0,
              "128-byte-swizzled tiles must stay 1024-byte aligned");
static_assert(KernelConfig::kBlockN % KernelConfig::kBoxCols == 0, "output tiles are whole TMA boxes");
static_assert(KernelConfig::kSmemBytes <= 227 * 1024, "shared memory budget of one H100/H200 SM");
static_assert(KernelConfig::kBlockQ * 128 * 2 <= KernelConfig::kOutputBytes &&
                  KernelConfig::kBlockQ == KernelConfig::kBlockM,
              "a query tile of head_dim 128 is an output tile");
static_assert(KernelConfig::kBlockKv * 128 * 2 <= KernelConfig::kStageBytes, "a K or V block of head_dim 128 fits a stage");
static_assert(KernelConfig::kBlockKv == 128 && KernelConfig::kBlockKv % KernelConfig::kBlockQ == 0,
              "attention's S tile is m64n128 per warpgroup, and only the last key block meets the diagonal");
// NOTE: setmaxnreg moves registers within what the CTA got at launch (one CTA of kThreads per SM: 65536 / kThreads,
// rounded down to a multiple of 8 = 168 each): 56 for the producer warpgroup leaves 224 for each consumer thread,
// enough for the 128 accumulators of a gate_up or wide tile without spills (ptxas -v: none). NOTE: 64 / 216 ran 1B
// decode at batch 1 3% slower (docs/perf.md, eighth session, run 7); the producer's walk spilled at 56 until a wide
// tile's second B box was requested outside a loop (load_b_slice).
static_assert(128 * KernelConfig::kProducerRegisters + KernelConfig::kConsumerThreads * KernelConfig::kConsumerRegisters <=
                  (65536 / KernelConfig::kThreads) / 8 * 8 * KernelConfig::kThreads,
              "register split within the CTA's launch allocation");
static_assert(KernelConfig::kBlockM == 2 * 64, "each consumer warpgroup owns 64 rows of a GEMM tile");

}  // namespace mk::gpu
