// The output tile: one shared-memory tile of 128 rows x 128 bf16 columns through which GEMM and attention results
// leave the SM. Consumers write it in the TMA box layout; the storer thread stores it with TMA and publishes it while
// the consumers go on with the next instruction. The producer may first load into it (a GEMM's residual, attention's
// queries). Each GEMM or attention instruction is one use: free -> (loaded) -> staged -> stored -> free. A wide GEMM
// tile's second 128 columns go through the last stage of its main loop instead, held by the consumers until the
// storer has stored it (store_output_tile).
#pragma once

#include <cuda_bf16.h>

#include "config.cuh"
#include "ptx.cuh"
#include "sync.cuh"

namespace mk::gpu {

// Uses of the output tile so far, counted alike by producer, consumers and storer: the parities of its barriers.
struct OutputState {
  uint32_t uses = 0;        // GEMM and attention instructions so far
  uint32_t loads = 0;       // of which loaded the tile first
  uint32_t held_loads = 0;  // residual halves loaded into a wide tile's held stage (consumers only)
  // Parity that completes once the previous use's store has read the tile (passes at once for the first use): for
  // the consumers, who are never two uses behind, and whose 256 threads the mbarrier's try_wait suspends in hardware
  // rather than spinning. The producer counts (wait_output_freed).
  __device__ __forceinline__ uint32_t free_parity() const { return (uses & 1) ^ 1; }
  __device__ __forceinline__ uint32_t staged_parity() const { return uses & 1; }
  __device__ __forceinline__ uint32_t loaded_parity() const { return loads & 1; }
  __device__ __forceinline__ uint32_t held_loaded_parity() const { return held_loads & 1; }
};

// Producer: until the storer has freed the tile `uses` times, every earlier use's store having read it.
// NOTE: a count, not output_free's parity. The producer waits only before the uses it loads into the tile, and
// between them it can issue whole GEMMs whose stages fit the ring, running two or more uses ahead of the storer;
// a parity wait then passes on an older phase. Q then landed on a tile still being stored, and the consumers'
// `loaded` wait hung (mk run --preset tiny --batch 18 --seq 384; docs/perf.md, fifth session). The consumers'
// parity waits are exact: each waits once per GEMM for the use before it, and reaches a use only after its loads.
__device__ __forceinline__ bool wait_output_freed(const MegakernelParams& p, const SharedState& s, uint32_t uses,
                                                  Site site) {
  return wait_in_shared(p, site, [&] { return ptx::atomic_load_acquire_shared(s.freed) >= uses; });
}

// TMA-loads `boxes` boxes of 64 columns x 128 rows into `tile` (the output tile, or a wide GEMM tile's held ring
// stage), which is free; `landed` completes when they land.
__device__ __forceinline__ void issue_tile_load(uint8_t* tile, uint64_t* landed, const CUtensorMap* map, int boxes,
                                                int32_t col, int32_t row, int32_t plane) {
  ptx::mbarrier_arrive_expect_tx(landed, uint32_t(boxes * KernelConfig::kOutputBoxBytes));
  for (int box = 0; box < boxes; ++box)
    ptx::tma_load_3d(tile + box * KernelConfig::kOutputBoxBytes, map, landed, col + box * KernelConfig::kBoxCols, row,
                     plane);
}

// TMA-loads `boxes` boxes into the output tile, which is free; `loaded` completes when they land.
__device__ __forceinline__ void issue_output_tile_load(const SharedState& s, const CUtensorMap* map, int boxes,
                                                       int32_t col, int32_t row, int32_t plane) {
  issue_tile_load(s.output, s.loaded, map, boxes, col, row, plane);
}

// Producer: waits until the tile is free, then loads into it.
__device__ __forceinline__ bool load_output_tile(const MegakernelParams& p, const SharedState& s,
                                                 const OutputState& output, const CUtensorMap* map, int boxes,
                                                 int32_t col, int32_t row, int32_t plane, Site site) {
  if (!wait_output_freed(p, s, output.uses, site)) return false;
  issue_output_tile_load(s, map, boxes, col, row, plane);
  return true;
}

// Consumers: writes this thread's values value_of(i), i < 4 kGroups (in the m64nN wgmma accumulator order: rows
// 16 (t / 32) + (t % 32) / 4 + {0, 8} of its warpgroup's 64, columns 8 j + 2 (t % 4) + {0, 1}), adding what the tile
// already holds when `accumulate` (a residual), into `tile` (1024-byte aligned: the output tile, or a wide GEMM
// tile's held ring stage). Layout: box b of 64 columns at b * kOutputBoxBytes, row r at r * 128 bytes, 16-byte chunk
// c at c ^ (r % 8) (the 128-byte swizzle of the TMA boxes).
// Each 8 x 8 block of a warp's values (8 rows, column group j) is one stmatrix matrix in exactly that register order,
// so a warp moves four blocks an instruction: (j, rows 0-7), (j, rows 8-15), (j + 1, ...). Each block's 8 rows hit 8
// distinct 16-byte chunks, so the stores are free of bank conflicts.
// NOTE: kGroups / 2 stmatrix (and ldmatrix) instead of 2 kGroups 4-byte accesses: the residual's loads go out in
// batches before their stores (32 load-to-store round trips in sequence had been a third of o_proj's and down's
// epilogue, ncu, thirteenth session), and the unrolled code is a quarter as long.
// NOTE: values are computed as they are written (value_of), so that e.g. SwiGLU's registers die as it goes.
template <int kGroups, typename ValueOf>
__device__ __forceinline__ void write_output_tile(uint8_t* tile, bool accumulate, ValueOf value_of, int warpgroup,
                                                  int thread_in_wg) {
  static_assert(kGroups % 8 == 0 || kGroups < 8, "column groups fill whole 64-column boxes or stay in the first");
  static_assert(kGroups % 2 == 0, "a stmatrix takes two column groups");
  constexpr int kSteps = kGroups / 2;
  // NOTE: opaque: the lane's addresses are derived here, after the main loop; hoisted out of the consumers' loop
  // they stayed live across the accumulators and spilled.
  const uint32_t lane = uint32_t(ptx::opaque(int32_t(thread_in_wg))) % 32;
  const uint32_t block = lane / 8;  // which of an instruction's four 8 x 8 blocks this lane gives the row address of
  const uint32_t row = warpgroup * 64 + (thread_in_wg / 32) * 16 + (block % 2) * 8 + lane % 8;
  // Bits 4-6 of a chunk's address are its swizzled index (2 step) % 8 + block / 2, XOR row % 8; the output tile is
  // 1024-byte aligned, so step 0's address XOR ((2 step) % 8) << 4 is step's within the box.
  const uint32_t first_address = ptx::smem_address(tile) + row * 128 + (((block / 2) ^ (lane % 8)) << 4);
  auto address = [&](int step) {  // of this lane's row of block `block` in step `step` (column groups 2 step, + 1)
    return (first_address ^ (((2 * step) % 8) << 4)) + (2 * step / 8) * KernelConfig::kOutputBoxBytes;
  };
  // The residual is read a batch of steps ahead of its stores: one load round trip a batch, in registers the wide
  // tiles' 128 accumulators leave free (batches of four steps spilled).
  constexpr int kBatch = kSteps < 2 ? kSteps : 2;
  static_assert(kSteps % kBatch == 0, "whole batches of steps");
#pragma unroll
  for (int first = 0; first < kSteps; first += kBatch) {
    uint32_t residual[kBatch][4];
    if (accumulate) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) ptx::ldmatrix_x4(residual[b], address(first + b));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int step = first + b;
      uint32_t packed[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int i = 4 * (2 * step + m / 2) + 2 * (m % 2);  // value index of block m's first element
        float2 value = make_float2(value_of(i), value_of(i + 1));
        if (accumulate) {
          const float2 add = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&residual[b][m]));
          value.x += add.x;
          value.y += add.y;
        }
        const __nv_bfloat162 pair = __floats2bfloat162_rn(value.x, value.y);
        packed[m] = *reinterpret_cast<const uint32_t*>(&pair);
      }
      ptx::stmatrix_x4(address(step), packed);
    }
  }
}

// Consumers, after write_output_tile: hands the tile to the storer.
__device__ __forceinline__ void stage_output_tile(const SharedState& s, OutputState& output, bool loaded,
                                                  int thread_in_wg) {
  ptx::fence_proxy_async_shared();  // the storer's TMA reads what these generic stores wrote
  __syncwarp();
  if (thread_in_wg % 32 == 0) ptx::mbarrier_arrive(s.staged);
  ++output.uses;
  if (loaded) ++output.loads;
}

// Storer: TMA-stores the first `boxes` boxes of `tile` (those that start before col_end) at column col.
__device__ __forceinline__ void store_tile_boxes(const CUtensorMap* map, const uint8_t* tile, int boxes, int32_t col,
                                                 int32_t col_end, int32_t row, int32_t plane) {
  for (int box = 0; box < boxes; ++box) {
    const int32_t box_col = col + box * KernelConfig::kBoxCols;
    if (box_col < col_end) ptx::tma_store_3d(map, tile + box * KernelConfig::kOutputBoxBytes, box_col, row, plane);
  }
}

// Storer: stores the staged tile's first `boxes` boxes with TMA and frees the tile as soon as the store has read it.
// `held`: a wide GEMM tile, whose second 128 columns the consumers staged in a ring stage they kept (held_stage):
// stored from there in a second bulk group, and the stage released to the producer once read, for every consumer
// warp. NOTE: a wide tile is one use of the output tile; its second half in the output tile waited ~2 us for the
// first half's store to read it (docs/perf.md, thirteenth session, run 4).
__device__ __forceinline__ bool store_output_tile(const MegakernelParams& p, const SharedState& s,
                                                  OutputState& output, const CUtensorMap* map, int boxes, int32_t col,
                                                  int32_t col_end, int32_t row, int32_t plane, Site site,
                                                  bool held = false) {
  if (!wait_barrier(p, s.staged, output.staged_parity(), site)) return false;
  store_tile_boxes(map, s.output, boxes, col, col_end, row, plane);
  ptx::bulk_commit_group();
  // NOTE: the output tile is freed as soon as its own boxes are read, before the held half's: the producer may be
  // waiting to load the next tile's residual into it.
  const uint32_t held_stage = held ? *s.held_stage : 0;
  if (held) {
    store_tile_boxes(map, s.stage(held_stage), boxes, col + KernelConfig::kBlockN, col_end, row, plane);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<1>();
  } else {
    ptx::bulk_wait_group_read_all();
  }
  ptx::mbarrier_arrive(s.output_free);
  ptx::atomic_add_release_shared(s.freed, 1);
  if (held) {
    ptx::bulk_wait_group_read_all();
    ptx::mbarrier_arrive_count(&s.empty[held_stage], KernelConfig::kConsumerWarps);
  }
  ++output.uses;
  return true;
}

// Storer: publishes the instruction's stores once they are all in global memory.
__device__ __forceinline__ void publish_stored(const MegakernelParams& p, uint32_t counter) {
  ptx::bulk_wait_group_all();
  // NOTE: the tile was written by the async proxy; readers acquire the counter and then read with TMA (after their
  // own proxy fence) or with plain loads.
  ptx::fence_proxy_async_global();
  ptx::add_release(p.counters + counter, 1);
}

}  // namespace mk::gpu
