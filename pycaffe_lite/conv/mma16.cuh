// The fp16 / bf16 tensor-core primitives the tensor-core engines share (tensorcore16.cu,
// tensorcore16_nhwc.cu): the m16n8k16 mma.sync, ldmatrix and cp.async wrappers. Included after
// the backend prelude (Dtype); everything but T16Kind/t16_bits is for sm_80+ only.
#pragma once

extern "C++" {
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// ---- the multiply: m16n8k16 fragments (PTX ISA, "mma.m16n8k16" for .f16/.bf16) ----------------
// Lane l = 4g + t holds, two 16-bit values per register (lower k first):
//   A (16 x 16, row-major): a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b0 = B[2t..][g], b1 = B[2t+8..][g]
//   C (16 x 8, fp32):       c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
// ldmatrix.x4 hands each lane exactly these A elements from a row-major tile and these B elements
// from a k-fast ([col][k]) tile; ldmatrix.x4.trans the B elements from a [k][col] tile.
template <class T> struct T16Kind { static const int value = 0; };  // 0: not a 16-bit type (never launched)
template <> struct T16Kind<__half> { static const int value = 1; };
template <> struct T16Kind<__nv_bfloat16> { static const int value = 2; };

__device__ __forceinline__ unsigned short t16_bits(const __half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned short t16_bits(const __nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned short t16_bits(const float) { return 0; }
__device__ __forceinline__ unsigned short t16_bits(const double) { return 0; }

#if __CUDA_ARCH__ >= 800
template <int KIND>
__device__ __forceinline__ void t16_mma(float (&c)[4], const unsigned (&a)[4], const unsigned b0, const unsigned b1) {
  if (KIND == 1)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else if (KIND == 2)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void t16_ldmatrix4(unsigned (&r)[4], const unsigned short* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void t16_ldmatrix4_trans(unsigned (&r)[4], const unsigned short* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
#endif

__device__ __forceinline__ void t16_copy16(unsigned short* smem, const void* src, const bool valid) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void t16_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void t16_wait() {  // all but the newest N groups have landed
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
}  // extern "C++"
