// Thin wrappers over the PTX the megakernel uses: mbarriers, TMA, wgmma, mma.sync and ldmatrix, fences, atomics.
// Nothing here decides anything; each function is one instruction (or a short fixed sequence) with its operands.
#pragma once

#include <cuda.h>
#include <cstdint>

namespace mk::ptx {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---- mbarrier ----

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)), "r"(arrivals) : "memory");
}

__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier)) : "memory");
}

// `count` arrivals at once: the storer releases a ring stage on behalf of every consumer warp.
__device__ __forceinline__ void mbarrier_arrive_count(uint64_t* barrier, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)), "r"(bytes)
               : "memory");
}

// Whether the phase of the given parity has completed: try_wait may suspend the thread for a while when it has not;
// test_wait only looks.
#define MK_MBARRIER_PARITY_CHECK(kind, barrier, parity)                                                               \
  [&] {                                                                                                               \
    uint32_t done;                                                                                                    \
    asm volatile("{\n.reg .pred ready;\nmbarrier." kind ".parity.shared::cta.b64 ready, [%1], %2;\n"                  \
                 "selp.u32 %0, 1, 0, ready;\n}\n"                                                                     \
                 : "=r"(done)                                                                                         \
                 : "r"(smem_address(barrier)), "r"(parity)                                                            \
                 : "memory");                                                                                         \
    return done != 0;                                                                                                 \
  }()

__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* barrier, uint32_t parity) {
  return MK_MBARRIER_PARITY_CHECK("try_wait", barrier, parity);
}
__device__ __forceinline__ bool mbarrier_test_wait(uint64_t* barrier, uint32_t parity) {
  return MK_MBARRIER_PARITY_CHECK("test_wait", barrier, parity);
}
#undef MK_MBARRIER_PARITY_CHECK

// ---- TMA (bulk tensor copies) ----

// Global -> shared, completing `bytes` on the barrier. Coordinates innermost first.
__device__ __forceinline__ void tma_load_3d(void* destination, const CUtensorMap* map, uint64_t* barrier, int32_t c0,
                                            int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_address(destination)), "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(barrier)), "r"(c0),
      "r"(c1), "r"(c2)
      : "memory");
}

// Shared -> global, in the calling thread's bulk group. Coordinates innermost first; out-of-range parts of the
// box are not written.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* source, int32_t c0, int32_t c1,
                                             int32_t c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(source)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until the calling thread's bulk stores, all but the newest kPending groups, have read their shared-memory
// sources (those buffers may be reused).
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void bulk_wait_group_read_all() { bulk_wait_group_read<0>(); }

// Waits until the calling thread's bulk stores are complete in global memory.
__device__ __forceinline__ void bulk_wait_group_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// ---- fences and cross-SM publication ----

// Orders this thread's generic-proxy global accesses with its later async-proxy (TMA) accesses.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// 2^x on the SFU alone: denormal results flush to zero (exp2f adds a range fix-up of three instructions per call).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the SFU (MUFU.TANH). PTX promises only an approximation; one public measurement (N. Juffa, NVIDIA's
// forums, 2021) finds relative error up to ~1.1e-5, and figures of 2^-11 (~5e-4) are also quoted: not measured here.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// x sigmoid(x) = h + h tanh(h), h = x / 2: one SFU operation. Its error is absolute, tanh's error times |x| / 2 (up
// to ~|x| 2.5e-4 at the looser figure): for x below about -4, where 1 + tanh(h) cancels, a large share of the tiny
// result (the exp and reciprocal form was relative, ~1e-7). End to end the GPU's error against fp32 did not move
// (compare_hf, twenty-third session, run 3: 5.34e-3 / 5.60e-3 against 5.35e-3 / 5.58e-3 before). The gate_up epilogue's
// SwiGLU was bound by the SFU with two (exp and reciprocal: ncu at S=4096, the epilogue's largest line waiting on the
// SFU's queue), and the SFU runs at an eighth of the FMA pipes' rate. Used by the decode gate_up too. NOTE:
// __fdividef and __expf keep denormal range fix-ups, which doubled the epilogue's code (thirteenth session: 30% of
// its stalls were instruction fetches).
__device__ __forceinline__ float silu_fast(float x) {
  const float half_x = 0.5f * x;
  return fmaf(half_x, tanh_approx(half_x), half_x);
}

// Makes this thread's generic-proxy shared-memory writes (stores, landed cp.async copies) visible to later
// async-proxy reads of them (TMA stores, wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A named barrier over `threads` threads that also ANDs `value` across them: every thread gets the same answer.
__device__ __forceinline__ bool named_barrier_and(uint32_t id, uint32_t threads, bool value) {
  uint32_t result;
  asm volatile(
      "{\n"
      "  .reg .pred in, out;\n"
      "  setp.ne.u32 in, %1, 0;\n"
      "  barrier.cta.red.and.pred out, %2, %3, in;\n"
      "  selp.u32 %0, 1, 0, out;\n"
      "}\n"
      : "=r"(result)
      : "r"(uint32_t(value)), "r"(id), "r"(threads)
      : "memory");
  return result != 0;
}

// 16 bytes global -> shared without registers (L1 bypassed); src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_address(shared)), "l"(global),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// The same for a pending count known only at run time, up to 3.
__device__ __forceinline__ void cp_async_wait_at_most(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// A shared-memory count one thread of the CTA adds to and another polls.
// NOTE: atomics rather than st.release / ld.acquire: racecheck does not take release and acquire on shared memory
// for synchronization and reported the pair as hazards (docs/perf.md, eighth session, run 4).
__device__ __forceinline__ uint32_t atomic_load_acquire_shared(const volatile uint32_t* address) {
  uint32_t value;
  asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;"
               : "=r"(value)
               : "r"(smem_address(const_cast<const uint32_t*>(address)))
               : "memory");
  return value;
}

__device__ __forceinline__ void atomic_add_release_shared(volatile uint32_t* address, uint32_t value) {
  asm volatile("red.release.cta.shared::cta.add.u32 [%0], %1;" ::"r"(smem_address(const_cast<const uint32_t*>(address))),
               "r"(value)
               : "memory");
}

__device__ __forceinline__ void add_release(uint32_t* address, uint32_t value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Returns the value before the add. Releases what the CTA's barrier ordered before it, and acquires what the adds
// before it released.
__device__ __forceinline__ uint32_t add_acq_rel(uint32_t* address, uint32_t value) {
  uint32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(before) : "l"(address), "r"(value) : "memory");
  return before;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t time;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(time));
  return time;
}

// ---- programmatic dependent launch (sm_90) ----

// Lets the grid's programmatic dependent launch once every CTA has issued this (any one thread) or exited.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the prerequisite grids have completed and their memory is visible; a no-op in a grid without one.
__device__ __forceinline__ void griddepcontrol_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---- barriers among some warps of the CTA ----

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Counts toward the barrier's `threads` without waiting for it.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation between warpgroups (sm_90a) ----

template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <uint32_t kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// ---- warp-level tensor-core MMA (sm_80+) ----

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i+7 give the addresses of matrix i's 8 rows
// (16 bytes each); register i of lane l gets elements 2 (l % 4) and 2 (l % 4) + 1 of row l / 4 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// The inverse of ldmatrix_x4: stores four 8x8 matrices of 16-bit elements, register i of lane l holding elements
// 2 (l % 4) and 2 (l % 4) + 1 of row l / 4 of matrix i, at the row addresses that lanes 8i..8i+7 give.
__device__ __forceinline__ void stmatrix_x4(uint32_t address, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :
               : "r"(address), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Two 8x8 matrices, as ldmatrix_x4 with lanes 0-15 giving the addresses (those of lanes 16-31 are not read).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address)
               : "memory");
}

// Four 8x8 matrices, each transposed: lanes 8i..8i+7 give the addresses of matrix i's 8 rows; register i of lane l
// gets elements l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 (the B fragment of an mma from a row-major K x N tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// D (16 x 8, fp32) += A (16 x 16, bf16, row-major fragment a) * B (16 x 8, bf16, column-major fragment b0 b1).
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- wgmma (sm_90a) ----

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Shared-memory matrix descriptor for a K-major bf16 tile stored as rows of 128 bytes with the 128-byte swizzle
// (what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and a 64-element inner box): 8-row groups 1024 bytes apart.
// The tile must start 1024-byte aligned; stepping 16 elements along K adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t wgmma_descriptor_k_major_sw128(const void* tile) {
  const uint64_t address = smem_address(tile);
  uint64_t descriptor = 0;
  descriptor |= (address & 0x3FFFF) >> 4;      // start address, bits 0-13
  descriptor |= uint64_t(1) << 16;             // leading byte offset: unused with this swizzle
  descriptor |= uint64_t(1024 >> 4) << 32;     // stride byte offset: 8 rows x 128 bytes
  descriptor |= uint64_t(1) << 62;             // layout: 128-byte swizzle
  return descriptor;
}

// D (64 x 128, fp32 registers) (+)= A (64 x 16, smem) * B (128 x 16, smem)^T, both K-major bf16.
// accumulate = 0 overwrites D instead of adding to it.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D (64 x 256, fp32 registers) (+)= A (64 x 16, smem) * B (256 x 16, smem)^T, both K-major bf16.
// accumulate = 0 overwrites D instead of adding to it.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Shared-memory matrix descriptor for an MN-major bf16 tile with the 128-byte swizzle: rows of 128 bytes (64
// elements along M or N) for consecutive K, 8-row groups 1024 bytes apart, and 64-element blocks along M or N
// `block_bytes` apart (separate TMA boxes). Stepping 16 along K adds 2048 bytes to the start address.
__device__ __forceinline__ uint64_t wgmma_descriptor_mn_major_sw128(const void* tile, uint32_t block_bytes) {
  const uint64_t address = smem_address(tile);
  uint64_t descriptor = 0;
  descriptor |= (address & 0x3FFFF) >> 4;                  // start address, bits 0-13
  descriptor |= uint64_t((block_bytes >> 4) & 0x3FFF) << 16;  // leading byte offset: next 64 elements along M/N
  descriptor |= uint64_t(1024 >> 4) << 32;                 // stride byte offset: next 8 rows along K
  descriptor |= uint64_t(1) << 62;                         // layout: 128-byte swizzle
  return descriptor;
}

// D (64 x 128, fp32) += A (64 x 16, bf16 registers, the m64k16 fragment) * B (16 x 128, smem, N-major).
__device__ __forceinline__ void wgmma_m64n128k16_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1u));
}

// D (64 x 64, fp32) += A (64 x 16, bf16 registers, the m64k16 fragment) * B (16 x 64, smem, N-major).
__device__ __forceinline__ void wgmma_m64n64k16_rs_nmajor(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred accumulate;\n"
      "setp.ne.b32 accumulate, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1u));
}

// The same value, which the compiler can no longer trace to where it was computed: what is derived from it is
// computed here rather than hoisted out of the enclosing loop into registers.
__device__ __forceinline__ uint64_t opaque(uint64_t value) {
  asm volatile("" : "+l"(value));
  return value;
}

__device__ __forceinline__ int32_t opaque(int32_t value) {
  asm volatile("" : "+r"(value));
  return value;
}

// Keeps the compiler from moving reads/writes of MMA register operands (accumulators, A fragments) across the
// asynchronous MMAs.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(values[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void fence_registers(uint32_t (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(values[i])::"memory");
}

}  // namespace mk::ptx
