// The warp-level PTX the tensor-core prefill kernels share (attention_mma.cu, moe_mma.cu):
// shared-memory addresses, ldmatrix, cp.async and the mma.sync shapes they use. The MMAs need
// compute capability 8.0; the host takes these kernels only there, and a build for an older
// architecture traps.
//
// Fragments (PTX ISA): lane = 4 g + c holds rows g and g + 8 of a 16-row A operand (f16: the
// k-pairs 2c, 2c + 1 and 8 + 2c..; int8: the k-quads 4c.. and 16 + 4c..), column g of B (the
// same k's), and columns 2c, 2c + 1 of rows g and g + 8 of C.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace substrate::cuda {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements (or 8x16 bytes) from shared memory; lanes 8i..8i+7 give
// matrix i's row addresses (16-byte aligned).
__device__ __forceinline__ void LoadMatrices(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, each matrix transposed.
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes from global to shared memory without passing through registers; zeros when !in.
__device__ __forceinline__ void CopyAsync16(uint32_t dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(in ? 16 : 0));
}
__device__ __forceinline__ void CopyAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most one committed group is still in flight (the one issued last).
__device__ __forceinline__ void CopyAsyncWaitAllButOne() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}

// c (16x8, f32) += a (16x16, f16, row-major) * b (16x8, f16, column-major).
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// c = a (16x32 s8) * b (32x8 s8), int32.
__device__ __forceinline__ void MmaS8K32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  c[0] = c[1] = c[2] = c[3] = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// c = a (16x16 s8) * b (16x8 s8), int32.
__device__ __forceinline__ void MmaS8K16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  c[0] = c[1] = c[2] = c[3] = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0));
#else
  __trap();
#endif
}

}  // namespace substrate::cuda
