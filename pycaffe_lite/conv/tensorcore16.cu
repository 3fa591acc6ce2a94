// Implicit-GEMM 2-D convolution on fp16 / bf16 tensor cores: the GEMM views and operand gathers of
// implicit.cu (its Ops, implicit_ops.cuh: *which* matrix each pass multiplies) with the inner
// product on tensor cores (PTX mma.sync m16n8k16: f16 or bf16 operands, fp32 accumulation: *how*
// to multiply). For the half storage types only (Dtype == __half or __nv_bfloat16); it compiles for
// float and double so that every kernel file builds for every type, but tensorcore16.py never
// launches it for them (the core traps).
//
// Block: 256 threads (8 warps) own a BM x BN tile of C = A . B, the warps laid out as
// (BM/WM) x (BN/WN), each holding WM x WN of it as (WM/16) x (WN/8) m16n8 fp32 accumulators in
// registers. Per T16_BK (32) slice of the contraction every thread gathers its share of A (rows x
// BK) and B (BK x cols) from global memory into registers through the Op (stored values, zeros
// outside the matrix) and stores their 16-bit patterns into shared memory:
//   As[row][k]   (row-major A, leading dimension BK + 8)
//   Bs[k][col]   (row-major B, leading dimension BN + 8)   when consecutive threads load columns
//   Bs[col][k]   (column-major B, leading dimension BK + 8) when they load k (B_KFAST)
// then each warp multiplies its fragments for k = 0, 16 (t16_warp_step) while the next slice is
// already on its way into registers. The epilogue hands each fp32 accumulator to Op::store (bounds,
// bias and ReLU in Mtype, rounded to Dtype once). The weight gradient stores fp32 partial sums of
// its split contraction (T16WeightOp) and t16_reduce_weight adds them in a fixed order in fp32,
// rounding the parameter gradient to Dtype once.
// The padding (+8 halves) keeps every ldmatrix row 16-byte aligned and puts the 8 rows one
// instruction reads on distinct shared-memory banks (row strides of 80 and 272/144 bytes).

#define IG_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output, \
      const int group, const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, \
      const int stride_h, const int stride_w, const int height_out, const int width_out
#include "implicit_ops.cuh"

#define T16_THREADS 256
#define T16_WARPS 8
#define T16_BK 32

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

// One 16-deep contraction step of a warp's WM x WN tile. As: the warp's first A row at this k
// (row-major, leading dimension LDA); Bs: the warp's first column at this k, laid [k][col] (LDB) or,
// B_KFAST, [col][k].
template <int KIND, int WM, int WN, int LDA, int LDB, bool B_KFAST>
__device__ __forceinline__ void t16_warp_step(float (&acc)[WM / 16][WN / 8][4], const unsigned short* As,
                                              const unsigned short* Bs) {
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile");
  const int lane = threadIdx.x % 32;
  unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
  for (int i = 0; i < WM / 16; ++i) t16_ldmatrix4(a[i], As + (i * 16 + lane % 16) * LDA + 8 * (lane / 16));
#pragma unroll
  for (int j = 0; j < WN / 8; j += 2) {
    // matrices: (cols j.., k 0-7), (cols j.., k 8-15), (cols j+8.., k 0-7), (cols j+8.., k 8-15)
    unsigned r[4];
    if (B_KFAST)
      t16_ldmatrix4(r, Bs + (j * 8 + lane % 8 + 8 * (lane / 16)) * LDB + 8 * (lane / 8 % 2));
    else
      t16_ldmatrix4_trans(r, Bs + (lane % 8 + 8 * (lane / 8 % 2)) * LDB + j * 8 + 8 * (lane / 16));
    b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
  }
#pragma unroll
  for (int i = 0; i < WM / 16; ++i)
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) t16_mma<KIND>(acc[i][j], a[i], b[j][0], b[j][1]);
}

// The epilogue: every accumulator element of a warp's WM x WN tile (rows m0.., cols n0..) goes from
// its register to Op::store.
template <int WM, int WN, class Op>
__device__ __forceinline__ void t16_store(const Op& op, const float (&acc)[WM / 16][WN / 8][4], const int m0,
                                          const int n0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < WM / 16; ++i)
#pragma unroll
    for (int j = 0; j < WN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) op.store(m0 + i * 16 + g + 8 * (e / 2), n0 + j * 8 + 2 * t + e % 2, acc[i][j][e]);
}
#endif

template <int BM, int BN, int WM, int WN, bool B_KFAST, class Op>
__device__ __forceinline__ void t16_core(const Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  const int KIND = T16Kind<Dtype>::value;
  const int BK = T16_BK;
  static_assert((BM / WM) * (BN / WN) == T16_WARPS, "8 warps per block");
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tile shape");
  static_assert(T16_THREADS % BK == 0 && (BM * BK) % T16_THREADS == 0 && (BN * BK) % T16_THREADS == 0,
                "each thread loads whole rows of the thread layout");
  static_assert(B_KFAST || T16_THREADS % BN == 0, "column-fast B loads need BN | 256");
  if (KIND == 0) __trap();  // float and double: never launched (tensorcore16.supports)
  const int A_PER = BM * BK / T16_THREADS;
  const int B_PER = BN * BK / T16_THREADS;
  const int B_STATES = B_KFAST ? B_PER : 1;
  const int LDA = BK + 8;
  const int LDB = B_KFAST ? BK + 8 : BN + 8;
  __shared__ __align__(16) unsigned short As[BM * LDA];
  __shared__ __align__(16) unsigned short Bs[B_KFAST ? BN * LDB : BK * LDB];

  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);  // this warp's tile: rows wm*WM.., cols wn*WN..
  int a_row[A_PER], a_k[A_PER], b_col[B_PER], b_k[B_PER];
#pragma unroll
  for (int e = 0; e < A_PER; ++e) {
    a_row[e] = tid / BK + e * (T16_THREADS / BK);
    a_k[e] = tid % BK;
  }
#pragma unroll
  for (int e = 0; e < B_PER; ++e) {
    b_col[e] = B_KFAST ? tid / BK + e * (T16_THREADS / BK) : tid % BN;
    b_k[e] = B_KFAST ? tid % BK : tid / BN + e * (T16_THREADS / BN);
  }
  typename Op::AState as[A_PER];
  typename Op::BState bs[B_STATES];
#pragma unroll
  for (int e = 0; e < A_PER; ++e) as[e] = op.a_state(m0 + a_row[e]);
#pragma unroll
  for (int e = 0; e < B_STATES; ++e) bs[e] = op.b_state(n0 + b_col[e]);

  float acc[WM / 16][WN / 8][4] = {};
  const int k_begin = op.k_begin, k_end = op.k_end;
  unsigned short ra[A_PER], rb[B_PER];
  if (k_begin < k_end) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) ra[e] = t16_bits(op.a(as[e], k_begin + a_k[e], k_end));
#pragma unroll
    for (int e = 0; e < B_PER; ++e) rb[e] = t16_bits(op.b(bs[B_KFAST ? e : 0], k_begin + b_k[e], k_end));
  }
  const unsigned short* wa = As + wm * WM * LDA;
  const unsigned short* wb = Bs + (B_KFAST ? wn * WN * LDB : wn * WN);
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) As[a_row[e] * LDA + a_k[e]] = ra[e];
#pragma unroll
    for (int e = 0; e < B_PER; ++e) Bs[B_KFAST ? b_col[e] * LDB + b_k[e] : b_k[e] * LDB + b_col[e]] = rb[e];
    __syncthreads();
    const int k1 = k0 + BK;
    if (k1 < k_end) {
#pragma unroll
      for (int e = 0; e < A_PER; ++e) ra[e] = t16_bits(op.a(as[e], k1 + a_k[e], k_end));
#pragma unroll
      for (int e = 0; e < B_PER; ++e) rb[e] = t16_bits(op.b(bs[B_KFAST ? e : 0], k1 + b_k[e], k_end));
    }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16)
      t16_warp_step<KIND, WM, WN, LDA, LDB, B_KFAST>(acc, wa + kk, B_KFAST ? wb + kk : wb + kk * LDB);
    __syncthreads();
  }
  t16_store<WM, WN>(op, acc, m0 + wm * WM, n0 + wn * WN);
#else
  __trap();  // fp16/bf16 mma.sync m16n8k16 needs sm_80 or newer (tensorcore16.supports checks)
#endif
}

// The weight gradient's Op: implicit_ops' BwdWeightOp (its A and B views) storing fp32 partial sums
// part: (M/G, C/G*kh*kw + has_bias) of this group and split.
struct T16WeightOp : BwdWeightOp {
  float* part;
  __device__ void store(int m, int k, Mtype v) const {
    if (m < Mg && k < ncols) part[m * ncols + k] = (float)v;
  }
};

}  // extern "C++"

// ---- entry points: the arguments and grids of implicit.cu's / tensorcore.cu's ----------------

#define T16_FORWARD(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                   \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                     \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, const int4* tab, Dtype* y, \
      IG_GEOMETRY_PARAMS) {                                                                             \
    const FwdOp op = ig_forward_op(blockIdx.z, x, w, bias, epilogue, tab, y, IG_GEOMETRY_ARGS);         \
    t16_core<BM, BN, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                              \
  }

#define T16_BACKWARD_DATA(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                             \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                     \
      const Dtype* w, const Dtype* dy, const int4* tab, Dtype* dx, IG_GEOMETRY_PARAMS) {                \
    const BwdDataOp op = ig_backward_data_op(blockIdx.z, w, dy, tab, dx, IG_GEOMETRY_ARGS);             \
    t16_core<BM, BN, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                              \
  }

// ws: fp32 (group, splits, M/G, C/G*kh*kw + has_bias) partial sums, reduced by t16_reduce_weight.
#define T16_BACKWARD_WEIGHT(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                           \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                     \
      const Dtype* x, const Dtype* dy, const int4* tab, float* ws, const int splits, const int chunk,   \
      const int has_bias, IG_GEOMETRY_PARAMS) {                                                         \
    const int g = blockIdx.z / splits, s = blockIdx.z % splits;                                         \
    T16WeightOp op;                                                                                     \
    static_cast<BwdWeightOp&>(op) = ig_backward_weight_op(g, s, x, dy, tab, (Dtype*)0, splits, chunk,  \
                                                          has_bias, IG_GEOMETRY_ARGS);                  \
    op.part = ws + ((long long)g * splits + s) * op.Mg * op.ncols;                                      \
    t16_core<BM, BN, WM, WN, true>(op, blockIdx.y * BM, blockIdx.x * BN);                               \
  }

T16_FORWARD(t16_forward_128x128, 128, 128, 32, 64, 1)
T16_FORWARD(t16_forward_64x128, 64, 128, 32, 32, 2)
T16_FORWARD(t16_forward_64x64, 64, 64, 32, 16, 2)
T16_BACKWARD_DATA(t16_backward_data_128x128, 128, 128, 32, 64, 1)
T16_BACKWARD_DATA(t16_backward_data_64x128, 64, 128, 32, 32, 2)
T16_BACKWARD_DATA(t16_backward_data_64x64, 64, 64, 32, 16, 2)
T16_BACKWARD_WEIGHT(t16_backward_weight_128x128, 128, 128, 32, 64, 1)
T16_BACKWARD_WEIGHT(t16_backward_weight_64x128, 64, 128, 32, 32, 1)
T16_BACKWARD_WEIGHT(t16_backward_weight_64x64, 64, 64, 32, 16, 2)

// dw (and db when has_bias: each row's last column) += the fp32 sum of `splits` partial weight
// gradients, in split order (deterministic); one rounding to Dtype per element.
__global__ void t16_reduce_weight(const int count, const float* ws, const int splits, const int mg, const int kg,
                                  const int has_bias, Dtype* dw, Dtype* db) {
  const int cols = kg + (has_bias ? 1 : 0);
  CUDA_KERNEL_LOOP(index, count) {  // index over (g, m, k) with k < cols
    const int k = index % cols;
    const int gm = index / cols;  // g * mg + m
    const int g = gm / mg, m = gm - g * mg;
    const float* p = ws + ((long long)g * splits * mg + m) * cols + k;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += p[(long long)s * mg * cols];
    if (k < kg) dw[gm * kg + k] = from_m(to_m(dw[gm * kg + k]) + Mtype(sum));
    else db[gm] = from_m(to_m(db[gm]) + Mtype(sum));
  }
}
