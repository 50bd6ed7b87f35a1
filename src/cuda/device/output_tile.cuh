// The output tile: one shared-memory tile of 128 rows x 128 bf16 columns through which GEMM and attention results
// leave the SM. Consumers write it in the TMA box layout; the storer thread stores it with TMA and publishes it while
// the consumers go on with the next instruction. The producer may first load into it (a GEMM's residual, attention's
// queries). Each GEMM or attention instruction is one use (a wide GEMM tile two, one per 128 columns):
// free -> (loaded) -> staged -> stored -> free.
#pragma once

#include <cuda_bf16.h>

#include "config.cuh"
#include "ptx.cuh"
#include "sync.cuh"

namespace mk::gpu {

// Uses of the output tile so far, counted alike by producer, consumers and storer: the parities of its barriers.
struct OutputState {
  uint32_t uses = 0;   // GEMM and attention instructions so far, a wide GEMM tile counting two (gemm_sm90.cuh)
  uint32_t loads = 0;  // of which loaded the tile first
  // Parity that completes once the previous use's store has read the tile (passes at once for the first use): for
  // the consumers, who are never two uses behind, and whose 256 threads the mbarrier's try_wait suspends in hardware
  // rather than spinning. The producer counts (wait_output_freed).
  __device__ __forceinline__ uint32_t free_parity() const { return (uses & 1) ^ 1; }
  __device__ __forceinline__ uint32_t staged_parity() const { return uses & 1; }
  __device__ __forceinline__ uint32_t loaded_parity() const { return loads & 1; }
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

// TMA-loads `boxes` boxes of 64 columns x 128 rows into the tile, which is free; `loaded` completes when they land.
__device__ __forceinline__ void issue_output_tile_load(const SharedState& s, const CUtensorMap* map, int boxes,
                                                       int32_t col, int32_t row, int32_t plane) {
  ptx::mbarrier_arrive_expect_tx(s.loaded, uint32_t(boxes * KernelConfig::kOutputBoxBytes));
  for (int box = 0; box < boxes; ++box)
    ptx::tma_load_3d(s.output + box * KernelConfig::kOutputBoxBytes, map, s.loaded, col + box * KernelConfig::kBoxCols,
                     row, plane);
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
// already holds when `accumulate` (a residual). Layout: box b of 64 columns at b * kOutputBoxBytes, row r at
// r * 128 bytes, 16-byte chunk c at c ^ (r % 8) (the 128-byte swizzle of the TMA boxes): a warp's 32 four-byte
// accesses hit 32 distinct banks.
// NOTE: values are computed as they are written (value_of), so that e.g. SwiGLU's registers die as it goes.
template <int kGroups, typename ValueOf>
__device__ __forceinline__ void write_output_tile(const SharedState& s, bool accumulate, ValueOf value_of, int warpgroup,
                                                  int thread_in_wg) {
  // Row within the tile of half 0; half 1 is 8 rows (1024 bytes) further, with the same row % 8.
  const uint32_t row0 = warpgroup * 64 + (thread_in_wg / 32) * 16 + (thread_in_wg % 32) / 4;
  const uint32_t row_bytes = row0 * 128 + 4 * (thread_in_wg % 4);
  const uint32_t chunk_xor = row0 % 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const uint32_t offset =
          (j / 8) * KernelConfig::kOutputBoxBytes + half * 1024 + row_bytes + (((j % 8) ^ chunk_xor) << 4);
      __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(s.output + offset);
      float2 value = make_float2(value_of(4 * j + 2 * half), value_of(4 * j + 2 * half + 1));
      if (accumulate) {
        const float2 add = __bfloat1622float2(*pair);
        value.x += add.x;
        value.y += add.y;
      }
      *pair = __floats2bfloat162_rn(value.x, value.y);
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

// Storer: stores the staged tile's first `boxes` boxes with TMA and frees the tile as soon as the store has read it.
__device__ __forceinline__ bool store_output_tile(const MegakernelParams& p, const SharedState& s,
                                                  OutputState& output, const CUtensorMap* map, int boxes, int32_t col,
                                                  int32_t col_end, int32_t row, int32_t plane, Site site) {
  if (!wait_barrier(p, s.staged, output.staged_parity(), site)) return false;
  for (int box = 0; box < boxes; ++box) {
    const int32_t box_col = col + box * KernelConfig::kBoxCols;
    if (box_col < col_end) ptx::tma_store_3d(map, s.output + box * KernelConfig::kOutputBoxBytes, box_col, row, plane);
  }
  ptx::bulk_commit_group();
  ptx::bulk_wait_group_read_all();
  ptx::mbarrier_arrive(s.output_free);
  ptx::atomic_add_release_shared(s.freed, 1);
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
