// Implicit-GEMM 2-D convolution on tensor cores: the GEMM views and operand gathers of
// conv_implicit.cu (its Ops, conv_implicit_ops.cuh) with the inner product on TF32 tensor cores
// (PTX mma.sync m16n8k8: TF32 inputs, fp32 accumulation). For float only (Dtype == float); it
// compiles for double so that every kernel file builds for both, but is never launched for it.
//
// Block: 256 threads (8 warps) own a BM x BN tile of C = A . B, the warps laid out as
// (BM/WM) x (BN/WN), each holding WM x WN of it as (WM/16) x (WN/8) m16n8 accumulators in registers.
// Per BK slice of the contraction every thread gathers its share of A (rows x BK) and B (BK x
// cols) into registers through the Op (zeros outside the matrix), rounds them to TF32 and stores
// them to shared memory:
//   As[row][k]   (row-major A, leading dimension BK + 4)
//   Bs[k][col]   (row-major B, leading dimension BN + 8)   when consecutive threads load columns
//   Bs[col][k]   (column-major B, leading dimension BK + 4) when they load k (B_KFAST)
// then each warp multiplies its fragments for k = 0, 8, .. (tc_warp_slice); meanwhile the next slice
// is already being loaded into registers. The epilogue hands each accumulator element straight from
// its register to Op::store (bounds, bias, layout).
// The padding (+4 / +8 floats) keeps every ldmatrix row 16-byte aligned and puts the 8 rows (or the
// 4 k-rows of a B fragment) that one instruction reads on distinct shared-memory banks.
// Registers: the 128x128 kernels take 1 block per SM (up to 255 registers a thread), the 64x128
// and 64x64 ones 2 (at most 128, no spills); 64x64 fills the device on small late layers.

// The geometry parameters of every entry point (conv_implicit_ops.cuh passes them on as
// IG_GEOMETRY_ARGS).
#define IG_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output, \
      const int group, const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, \
      const int stride_h, const int stride_w, const int height_out, const int width_out
#include "implicit_ops.cuh"

#define TC_THREADS 256
#define TC_WARPS 8

extern "C++" {

// ---- m16n8k8 TF32 fragments (PTX ISA, "mma.m16n8k8" for .tf32): lane l = 4g + t holds
//   A (16 x 8, row-major): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B (8 x 8, k x n):      b0 = B[t][g], b1 = B[t+4][g]
//   C (16 x 8):            c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
// ldmatrix.x4 (b16 8x8 matrices, i.e. 8 rows of 4 floats) hands each lane exactly these A elements
// from a row-major tile, and the B elements from a k-fast ([col][k]) tile.
__device__ __forceinline__ unsigned tc_tf32(const float v) {  // rounded to TF32, nearest (ties away)
#if __CUDA_ARCH__ >= 800
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
#else
  return __float_as_uint(v);
#endif
}
__device__ __forceinline__ float tc_round(const float v) { return __uint_as_float(tc_tf32(v)); }
// The same rounding for a value on its way into mma.sync, in two instructions instead of cvt's
// sequence: the tensor cores read a TF32 operand's top 19 bits and ignore the other 13, so adding
// half a TF32 ulp to a finite value and letting them truncate gives cvt.rna's result. Infinities
// and NaNs pass unchanged.
__device__ __forceinline__ unsigned tc_tf32_for_mma(const unsigned bits) {
  return isfinite(__uint_as_float(bits)) ? bits + 0x1000u : bits;
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void tc_ldmatrix4(unsigned (&r)[4], const float* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void tc_mma(float (&c)[4], const unsigned (&a)[4], const unsigned b0, const unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 8-deep contraction step of a warp's WM x WN tile. As: the warp's first A row at this k
// (row-major, leading dimension LDA); Bs: the warp's first column at this k, laid [k][col] (LDB) or,
// B_KFAST, [col][k]. ROUND_A / ROUND_B: round that operand to TF32 on its way to the tensor cores.
template <int WM, int WN, int LDA, int LDB, bool B_KFAST, bool ROUND_A, bool ROUND_B>
__device__ __forceinline__ void tc_warp_step(float (&acc)[WM / 16][WN / 8][4], const float* As, const float* Bs) {
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile");
  const int lane = threadIdx.x % 32;
  unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
  for (int i = 0; i < WM / 16; ++i) {
    tc_ldmatrix4(a[i], As + (i * 16 + lane % 16) * LDA + 4 * (lane / 16));
    if (ROUND_A)
#pragma unroll
      for (int e = 0; e < 4; ++e) a[i][e] = tc_tf32_for_mma(a[i][e]);
  }
#pragma unroll
  for (int j = 0; j < WN / 8; j += 2) {
    if (B_KFAST) {  // matrices: (cols j.., k 0-3), (cols j.., k 4-7), (cols j+8.., k 0-3), (.., k 4-7)
      unsigned r[4];
      tc_ldmatrix4(r, Bs + (j * 8 + lane % 8 + 8 * (lane / 16)) * LDB + 4 * (lane / 8 % 2));
      b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* p = Bs + (lane % 4) * LDB + (j + h) * 8 + lane / 4;
        b[j + h][0] = __float_as_uint(p[0]), b[j + h][1] = __float_as_uint(p[4 * LDB]);
      }
    }
  }
  if (ROUND_B)
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) b[j][0] = tc_tf32_for_mma(b[j][0]), b[j][1] = tc_tf32_for_mma(b[j][1]);
#pragma unroll
  for (int i = 0; i < WM / 16; ++i)
#pragma unroll
    for (int j = 0; j < WN / 8; ++j) tc_mma(acc[i][j], a[i], b[j][0], b[j][1]);
}

// A BK-deep slice of the warp at (wm, wn) of the block's tile: As and Bs the block's A and B tiles
// in shared memory (layouts as in tc_warp_step, B's first column / k at the pointer).
template <int BK, int WM, int WN, int LDA, int LDB, bool B_KFAST, bool ROUND_A, bool ROUND_B>
__device__ __forceinline__ void tc_warp_slice(float (&acc)[WM / 16][WN / 8][4], const float* As, const float* Bs,
                                              const int wm, const int wn) {
  As += wm * WM * LDA;
  Bs += B_KFAST ? wn * WN * LDB : wn * WN;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 8)
    tc_warp_step<WM, WN, LDA, LDB, B_KFAST, ROUND_A, ROUND_B>(acc, As + kk, B_KFAST ? Bs + kk : Bs + kk * LDB);
}

// The epilogue: every accumulator element of a warp's WM x WN tile (rows m0.., cols n0..) goes from
// its register to Op::store (bounds, bias, layout).
template <int WM, int WN, class Op>
__device__ __forceinline__ void tc_store(const Op& op, const float (&acc)[WM / 16][WN / 8][4], const int m0,
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

template <int BM, int BN, int BK, int WM, int WN, bool B_KFAST, class Op>
__device__ __forceinline__ void tc_core(const Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  static_assert((BM / WM) * (BN / WN) == TC_WARPS, "8 warps per block");
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 8 == 0, "tile shape");
  static_assert(TC_THREADS % BK == 0 && (BM * BK) % TC_THREADS == 0 && (BN * BK) % TC_THREADS == 0,
                "each thread loads whole rows of the thread layout");
  static_assert(B_KFAST || TC_THREADS % BN == 0, "column-fast B loads need BN | 256");
  const int A_PER = BM * BK / TC_THREADS;
  const int B_PER = BN * BK / TC_THREADS;
  const int B_STATES = B_KFAST ? B_PER : 1;
  const int LDA = BK + 4;
  const int LDB = B_KFAST ? BK + 4 : BN + 8;
  __shared__ __align__(16) float As[BM * LDA];
  __shared__ __align__(16) float Bs[B_KFAST ? BN * LDB : BK * LDB];

  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);  // this warp's tile: rows wm*WM.., cols wn*WN..
  // the (row, k) / (k, col) of every element this thread loads, in tile coordinates
  int a_row[A_PER], a_k[A_PER], b_col[B_PER], b_k[B_PER];
#pragma unroll
  for (int e = 0; e < A_PER; ++e) {
    a_row[e] = tid / BK + e * (TC_THREADS / BK);
    a_k[e] = tid % BK;
  }
#pragma unroll
  for (int e = 0; e < B_PER; ++e) {
    b_col[e] = B_KFAST ? tid / BK + e * (TC_THREADS / BK) : tid % BN;
    b_k[e] = B_KFAST ? tid % BK : tid / BN + e * (TC_THREADS / BN);
  }
  typename Op::AState as[A_PER];
  typename Op::BState bs[B_STATES];
#pragma unroll
  for (int e = 0; e < A_PER; ++e) as[e] = op.a_state(m0 + a_row[e]);
#pragma unroll
  for (int e = 0; e < B_STATES; ++e) bs[e] = op.b_state(n0 + b_col[e]);

  float acc[WM / 16][WN / 8][4] = {};
  const int k_begin = op.k_begin, k_end = op.k_end;
  float ra[A_PER], rb[B_PER];
  if (k_begin < k_end) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) ra[e] = op.a(as[e], k_begin + a_k[e], k_end);
#pragma unroll
    for (int e = 0; e < B_PER; ++e) rb[e] = op.b(bs[B_KFAST ? e : 0], k_begin + b_k[e], k_end);
  }
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) As[a_row[e] * LDA + a_k[e]] = tc_round(ra[e]);
#pragma unroll
    for (int e = 0; e < B_PER; ++e)
      Bs[B_KFAST ? b_col[e] * LDB + b_k[e] : b_k[e] * LDB + b_col[e]] = tc_round(rb[e]);
    __syncthreads();
    const int k1 = k0 + BK;
    if (k1 < k_end) {
#pragma unroll
      for (int e = 0; e < A_PER; ++e) ra[e] = op.a(as[e], k1 + a_k[e], k_end);
#pragma unroll
      for (int e = 0; e < B_PER; ++e) rb[e] = op.b(bs[B_KFAST ? e : 0], k1 + b_k[e], k_end);
    }
    tc_warp_slice<BK, WM, WN, LDA, LDB, B_KFAST, false, false>(acc, As, Bs, wm, wn);
    __syncthreads();
  }
  tc_store<WM, WN>(op, acc, m0 + wm * WM, n0 + wn * WN);
#else
  __trap();  // TF32 tensor cores need sm_80 or newer (conv_tensorcore.supports checks)
#endif
}

}  // extern "C++"

// ---- entry points ---------------------------------------------------------------------------
// The arguments and grids of conv_implicit.cu's entry points (same Python call side shape).

#define TC_FORWARD(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                        \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, const int4* tab,  \
      Dtype* y, IG_GEOMETRY_PARAMS) {                                                          \
    const FwdOp op = ig_forward_op(blockIdx.z, x, w, bias, epilogue, tab, y, IG_GEOMETRY_ARGS); \
    tc_core<BM, BN, 16, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                 \
  }

#define TC_BACKWARD_DATA(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                  \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* w, const Dtype* dy, const int4* tab, Dtype* dx, IG_GEOMETRY_PARAMS) {       \
    const BwdDataOp op = ig_backward_data_op(blockIdx.z, w, dy, tab, dx, IG_GEOMETRY_ARGS);    \
    tc_core<BM, BN, 16, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                 \
  }

// ws: (group, splits, M/G, C/G*kh*kw + has_bias) partial sums, reduced by conv_implicit.cu's
// ig_reduce_weight.
#define TC_BACKWARD_WEIGHT(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* dy, const int4* tab, Dtype* ws, const int splits,           \
      const int chunk, const int has_bias, IG_GEOMETRY_PARAMS) {                               \
    const BwdWeightOp op = ig_backward_weight_op(blockIdx.z / splits, blockIdx.z % splits, x, dy, tab, ws, \
                                                 splits, chunk, has_bias, IG_GEOMETRY_ARGS);   \
    tc_core<BM, BN, 16, WM, WN, true>(op, blockIdx.y * BM, blockIdx.x * BN);                  \
  }

TC_FORWARD(tc_forward_128x128, 128, 128, 32, 64, 1)
TC_FORWARD(tc_forward_64x128, 64, 128, 32, 32, 2)
TC_BACKWARD_DATA(tc_backward_data_128x128, 128, 128, 32, 64, 1)
TC_BACKWARD_DATA(tc_backward_data_64x128, 64, 128, 32, 32, 2)
TC_BACKWARD_WEIGHT(tc_backward_weight_128x128, 128, 128, 32, 64, 1)
TC_BACKWARD_WEIGHT(tc_backward_weight_64x128, 64, 128, 32, 32, 2)
TC_FORWARD(tc_forward_64x64, 64, 64, 32, 16, 2)
TC_BACKWARD_DATA(tc_backward_data_64x64, 64, 64, 32, 16, 2)
TC_BACKWARD_WEIGHT(tc_backward_weight_64x64, 64, 64, 32, 16, 2)

// ==== channel-sliced kernels: cp.async pipeline ==============================================
// For geometries whose contraction splits into slices of TCS_BK channels at one filter tap
// (forward: C/G % 32 == 0; data gradient: M/G % 32 == 0; weight gradient: C/G % (BN/8) == 0; no
// dilation), the contraction is reordered tap-major, k = (tap, channel): within a slice every
// element a thread loads shares one bounds check and one base address, and consecutive elements
// lie a plane apart, so a load costs an add and a cp.async (zero-filled outside the image). Each
// block keeps TCS_STAGES slices in flight in dynamic shared memory (sized by conv_tensorcore.py's
// _sliced_kernel), so global latency hides behind the tensor-core work of the slices before. The
// weights arrive permuted and already rounded to TF32 (tc_permute_*, 16-byte copies); the other
// operand is rounded as its fragments leave shared memory. Tiles, warp layouts and the epilogue are those above.

#define TCS_BK 32
#define TCS_STAGES 3
#define TCS_LDA (TCS_BK + 4)

extern "C++" {

__device__ __forceinline__ void tcs_copy(float* smem, const void* src, const bool valid) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
#endif
}
__device__ __forceinline__ void tcs_copy16(float* smem, const void* src, const bool valid) {
#if __CUDA_ARCH__ >= 800
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}
// An A tile (BM x TCS_BK) whose rows are contiguous in global memory (the permuted weights):
// thread t copies 16 bytes of tile row t/8 + 32e at k = 4*(t%8); rows at and past `rows` are zeros.
template <int BM>
__device__ __forceinline__ void tcs_load_rows(float* As, const Dtype* row0, const long long stride, const int rows) {
  const int t = threadIdx.x, k = 4 * (t % 8);
#pragma unroll
  for (int e = 0; e < BM / 32; ++e) {
    const int r = t / 8 + 32 * e;
    tcs_copy16(As + r * TCS_LDA + k, r < rows ? row0 + r * stride + k : row0, r < rows);
  }
}
__device__ __forceinline__ void tcs_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ __forceinline__ void tcs_wait_all_but_newest() {  // all groups but the newest STAGES-2
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(TCS_STAGES - 2));
#endif
}
__device__ __forceinline__ void tcs_wait_all() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}

template <int BN, bool B_KFAST> struct TcsLayout {
  static const int LDB = B_KFAST ? TCS_BK + 4 : BN + 8;
};

// A row-major B tile (TCS_BK x BN) with one column per thread: thread t copies column t%BN at
// k = t/BN + (256/BN)e, from b + k*stride (b: the column's element at k = 0); zeros when !ok (a
// zero-byte cp.async reads nothing, so then the addresses need not be valid).
template <int BN>
__device__ __forceinline__ void tcs_load_cols(float* Bs, const Dtype* b, const long long stride, const bool ok) {
  const int t = threadIdx.x, kb = t / BN, step = 256 / BN, LDB = TcsLayout<BN, false>::LDB;
  b += kb * stride;
#pragma unroll
  for (int e = 0; e < TCS_BK * BN / 256; ++e)
    tcs_copy(Bs + (kb + step * e) * LDB + t % BN, b + e * step * stride, ok);
}

// Where the next slice of a tap-major contraction (k = (tap, channel), TCS_BK channels a slice)
// starts: its first channel and its filter tap (r, s). Slices are loaded in order, so this steps
// instead of dividing.
struct TcsSlicePos {
  int c0, r, s;
  __device__ void next(const int channels, const int kw) {
    c0 += TCS_BK;
    if (c0 == channels) {
      c0 = 0;
      if (++s == kw) s = 0, ++r;
    }
  }
};

// ---- forward: A = W (M/G x (tap, c)), B = input columns ((tap, c) x N*Ho*Wo), B row-major -------
// w: the weights permuted to (M, kh*kw, C/G) (tc_permute_forward), so a row's slice is contiguous.
// Thread t loads B column n0 + t%BN at k = t/BN + (256/BN)e; A goes by tcs_load_rows (already TF32).
template <int BM, int BN> struct FwdSliced {
  static const bool A_ROUNDED = true;
  const Dtype* x; const Dtype* w; const Dtype* bias; Dtype* y; int epilogue;
  int H, W, HW, Wo, P, chw, mp, Mg, Kg, kw, ncols, cslices, slices;
  const Dtype* a_ptr; int a_rows;          // the tile's first weight row, and its rows inside M/G
  const Dtype* b_img; int iy0, ix0, b_ok;  // this thread's column: its image, top-left input position
  int sh, sw, ph, pw;
  TcsSlicePos at;
  __device__ void init(int m0, int n0) {
    const int t = threadIdx.x;
    at = TcsSlicePos{0, 0, 0};
    a_rows = Mg - m0;
    a_ptr = w + (long long)m0 * Kg;
    const int col = n0 + t % BN;
    b_ok = col < ncols;
    const int n = b_ok ? col / P : 0, p = b_ok ? col - n * P : 0, oy = p / Wo, ox = p - oy * Wo;
    b_img = x + (long long)n * chw;
    iy0 = oy * sh - ph;
    ix0 = ox * sw - pw;
  }
  __device__ void load(float* As, float* Bs, int slice) {  // slices in order: 0, 1, ..
    tcs_load_rows<BM>(As, a_ptr + slice * TCS_BK, Kg, a_rows);  // a weight row is (tap, c), tap-major
    const int iy = iy0 + at.r, ix = ix0 + at.s;
    const bool ok = b_ok && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    tcs_load_cols<BN>(Bs, ok ? b_img + (long long)at.c0 * HW + iy * W + ix : x, HW, ok);
    at.next(cslices * TCS_BK, kw);
  }
  __device__ void store(int m, int col, Mtype v) const {
    if (m >= Mg || col >= ncols) return;
    const int n = col / P, p = col - n * P;
    y[(long long)n * mp + m * P + p] = conv_epilogue(v, bias, m, epilogue);
  }
};

// ---- data gradient: A = W^T (C/G x (tap, m)), B = output-gradient columns ((tap, m) x N*H*W) ----
// w: the weights permuted to (G, C/G, kh*kw, M/G) (tc_permute_backward_data).
template <int BM, int BN> struct BwdDataSliced {
  static const bool A_ROUNDED = true;
  const Dtype* w; const Dtype* dy; Dtype* dx;
  int HW, W, Ho, Wo, P, chw, mp, Cg, Mg, khkw, kw, ncols, sh, sw, slices;
  const Dtype* a_ptr; int a_rows;
  const Dtype* b_img; int ty, tx, b_ok;
  TcsSlicePos at;
  __device__ void init(int m0, int n0, int ph, int pw) {
    const int t = threadIdx.x;
    at = TcsSlicePos{0, 0, 0};
    a_rows = Cg - m0;
    a_ptr = w + (long long)m0 * khkw * Mg;
    const int col = n0 + t % BN;
    b_ok = col < ncols;
    const int n = b_ok ? col / HW : 0, q = b_ok ? col - n * HW : 0, yy = q / W;
    b_img = dy + (long long)n * mp;
    ty = yy + ph;
    tx = q - yy * W + pw;
  }
  __device__ void load(float* As, float* Bs, int slice) {  // slices in order: 0, 1, ..
    tcs_load_rows<BM>(As, a_ptr + slice * TCS_BK, (long long)khkw * Mg, a_rows);  // rows are (tap, m)
    const int mb = at.c0;
    int oy = ty - at.r, ox = tx - at.s;
    at.next(Mg, kw);
    bool ok = b_ok && oy >= 0 && ox >= 0;
    if (sh != 1) { ok = ok && oy % sh == 0; oy /= sh; }
    if (sw != 1) { ok = ok && ox % sw == 0; ox /= sw; }
    ok = ok && oy < Ho && ox < Wo;
    tcs_load_cols<BN>(Bs, ok ? b_img + (long long)mb * P + oy * Wo + ox : dy, P, ok);
  }
  __device__ void store(int c, int col, Mtype v) const {
    if (c >= Cg || col >= ncols) return;
    const int n = col / HW, q = col - n * HW;
    dx[(long long)n * chw + c * HW + q] = from_m(v);
  }
};

// ---- weight gradient: A = dy (M/G x pixels), B = input ((pixels) x (tap, c)), B column-major ----
// Thread t loads pixel k = t%32 of each slice: of A rows m0 + t/32 + 8e, and of the BN/8 consecutive
// B columns n0 + (BN/8)(t/32) + e, which share one tap (C/G % (BN/8) == 0). Slices are loaded in
// order, so the thread steps its pixel's (image, row, column) on by TCS_BK instead of dividing.
template <int BM, int BN> struct BwdWeightSliced {
  static const bool A_ROUNDED = false;
  static const int B_COLS = BN / 8;  // B columns per thread
  const Dtype* x; const Dtype* dy; Dtype* ws;
  int H, W, HW, Ho, Wo, P, chw, mp, Mg, Cg, Kg, khkw, kw, sh, sw, ph, pw, k_begin, k_end, slices;
  const Dtype* a_ptr; int a_rows;
  const Dtype* b_ptr; int b_cols, r, s;
  int i, n, oy, ox;  // this thread's pixel in the next slice to load: index, image, output row and column
  __device__ void init(int m0, int n0) {
    const int t = threadIdx.x, m = m0 + t / 32, col = n0 + B_COLS * (t / 32);
    a_rows = m < Mg ? (Mg - m + 7) / 8 : 0;
    a_ptr = dy + (long long)(m < Mg ? m : 0) * P;
    b_cols = col < Kg ? Kg - col : 0;
    const int tap = col < Kg ? col / Cg : 0;
    r = tap / kw;
    s = tap - r * kw;
    b_ptr = x + (long long)(col < Kg ? col - tap * Cg : 0) * HW;
    i = k_begin + t % 32;
    n = i / P;
    const int p = i - n * P;
    oy = p / Wo;
    ox = p - oy * Wo;
  }
  __device__ void load(float* As, float* Bs, int) {
    const int t = threadIdx.x, k = t % 32;
    const bool in = i < k_end;
    const Dtype* a = a_ptr + (long long)n * mp + oy * Wo + ox;
#pragma unroll
    for (int e = 0; e < BM / 8; ++e)  // (zero-byte copies read nothing: no address to guard)
      tcs_copy(As + (t / 32 + 8 * e) * TCS_LDA + k, a + (long long)e * 8 * P, in && e < a_rows);
    const int iy = oy * sh - ph + r, ix = ox * sw - pw + s;
    const bool ok = in && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    const Dtype* b = ok ? b_ptr + (long long)n * chw + iy * W + ix : x;
    const int LDB = TcsLayout<BN, true>::LDB;
    float* bs = Bs + B_COLS * (t / 32) * LDB + k;
#pragma unroll
    for (int e = 0; e < B_COLS; ++e)
      tcs_copy(bs + e * LDB, b + (long long)e * HW, ok && e < b_cols);
    i += TCS_BK;  // the next slice's pixel
    ox += TCS_BK;
    while (ox >= Wo) {
      ox -= Wo;
      if (++oy == Ho) oy = 0, ++n;
    }
  }
  __device__ void store(int m, int col, Mtype v) const {
    if (m >= Mg || col >= Kg) return;
    const int tap = col / Cg, c = col - tap * Cg;
    ws[m * Kg + c * khkw + tap] = from_m(v);
  }
};

template <int BM, int BN, int WM, int WN, bool B_KFAST, class Op>
__device__ __forceinline__ void tcs_core(Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  static_assert((BM / WM) * (BN / WN) == TC_WARPS, "8 warps per block");
  const int LDB = TcsLayout<BN, B_KFAST>::LDB;
  const int A_SIZE = BM * TCS_LDA, STAGE = A_SIZE + (B_KFAST ? BN : TCS_BK) * LDB;
  extern __shared__ __align__(128) float tcs_smem[];
  const int warp = threadIdx.x / 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  float acc[WM / 16][WN / 8][4] = {};
  const int slices = op.slices;
#pragma unroll
  for (int s = 0; s < TCS_STAGES - 1; ++s) {
    if (s < slices) op.load(tcs_smem + s * STAGE, tcs_smem + s * STAGE + A_SIZE, s);
    tcs_commit();
  }
  for (int s = 0; s < slices; ++s) {
    tcs_wait_all_but_newest();  // slice s has landed (this thread's copies) ...
    __syncthreads();            // ... everyone's; and slice s-1's stage is free again
    const int next = s + TCS_STAGES - 1;
    if (next < slices) {
      float* st = tcs_smem + (next % TCS_STAGES) * STAGE;
      op.load(st, st + A_SIZE, next);
    }
    tcs_commit();
    const float* st = tcs_smem + (s % TCS_STAGES) * STAGE;
    tc_warp_slice<TCS_BK, WM, WN, TCS_LDA, LDB, B_KFAST, !Op::A_ROUNDED, true>(acc, st, st + A_SIZE, wm, wn);
  }
  tcs_wait_all();
  tc_store<WM, WN>(op, acc, m0 + wm * WM, n0 + wn * WN);
#else
  __trap();  // TF32 tensor cores need sm_80 or newer (conv_tensorcore.supports checks)
#endif
}

}  // extern "C++"

// ---- channel-sliced entry points (arguments as above, less the offset tables) -----------------
extern "C++" {
template <class Op>
__device__ __forceinline__ void tcs_forward_setup(Op& op, const int g, const Dtype* x, const Dtype* w,
                                                  const Dtype* bias, const int epilogue, Dtype* y, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.H = height; op.W = width; op.HW = height * width; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * op.HW; op.mp = num_output * op.P; op.Mg = mg;
  op.kw = kernel_w; op.Kg = cg * kernel_h * kernel_w; op.ncols = num * op.P; op.cslices = cg / TCS_BK;
  op.slices = kernel_h * kernel_w * op.cslices; op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + (long long)g * cg * op.HW; op.w = w + (long long)g * mg * op.Kg; op.bias = bias + g * mg;
  op.epilogue = epilogue; op.y = y + (long long)g * mg * op.P;
}

template <class Op>
__device__ __forceinline__ void tcs_backward_data_setup(Op& op, const int g, const Dtype* w, const Dtype* dy,
                                                        Dtype* dx, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.HW = height * width; op.W = width; op.Ho = height_out; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * op.HW; op.mp = num_output * op.P; op.Cg = cg; op.khkw = kernel_h * kernel_w;
  op.kw = kernel_w; op.ncols = num * op.HW; op.sh = stride_h; op.sw = stride_w;
  op.slices = op.khkw * mg / TCS_BK; op.Mg = mg;
  op.w = w + (long long)g * cg * op.khkw * mg; op.dy = dy + (long long)g * mg * op.P;
  op.dx = dx + (long long)g * cg * op.HW;
}

template <class Op>
__device__ __forceinline__ void tcs_backward_weight_setup(Op& op, const int g, const int s, const Dtype* x,
                                                          const Dtype* dy, Dtype* ws, const int splits,
                                                          const int chunk, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.H = height; op.W = width; op.HW = height * width; op.Ho = height_out; op.Wo = width_out;
  op.P = height_out * width_out; op.chw = channels * op.HW; op.mp = num_output * op.P; op.Mg = mg; op.Cg = cg;
  op.khkw = kernel_h * kernel_w; op.kw = kernel_w; op.Kg = cg * op.khkw;
  op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + (long long)g * cg * op.HW; op.dy = dy + (long long)g * mg * op.P;
  op.ws = ws + ((long long)g * splits + s) * mg * op.Kg;
  const int total = num * op.P;
  op.k_begin = s * chunk;
  op.k_end = op.k_begin + chunk < total ? op.k_begin + chunk : total;
  op.slices = (op.k_end - op.k_begin + TCS_BK - 1) / TCS_BK;
}
}  // extern "C++"

#define TCS_FORWARD(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                      \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, Dtype* y, IG_GEOMETRY_PARAMS) { \
    FwdSliced<BM, BN> op;                                                                                  \
    tcs_forward_setup(op, blockIdx.z, x, w, bias, epilogue, y, IG_GEOMETRY_ARGS);                          \
    op.init(blockIdx.y * BM, blockIdx.x * BN);                                                             \
    tcs_core<BM, BN, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                                 \
  }

#define TCS_BACKWARD_DATA(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* w, const Dtype* dy, Dtype* dx, IG_GEOMETRY_PARAMS) {                                    \
    BwdDataSliced<BM, BN> op;                                                                              \
    tcs_backward_data_setup(op, blockIdx.z, w, dy, dx, IG_GEOMETRY_ARGS);                                  \
    op.init(blockIdx.y * BM, blockIdx.x * BN, pad_h, pad_w);                                               \
    tcs_core<BM, BN, WM, WN, false>(op, blockIdx.y * BM, blockIdx.x * BN);                                 \
  }

// ws: (group, splits, M/G, C/G*kh*kw) partial sums, reduced by ig_reduce_weight (has_bias 0).
#define TCS_BACKWARD_WEIGHT(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                              \
  __global__ void __launch_bounds__(TC_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* dy, Dtype* ws, const int splits, const int chunk, IG_GEOMETRY_PARAMS) { \
    BwdWeightSliced<BM, BN> op;                                                                            \
    tcs_backward_weight_setup(op, blockIdx.z / splits, blockIdx.z % splits, x, dy, ws, splits, chunk,     \
                              IG_GEOMETRY_ARGS);                                                           \
    op.init(blockIdx.y * BM, blockIdx.x * BN);                                                             \
    tcs_core<BM, BN, WM, WN, true>(op, blockIdx.y * BM, blockIdx.x * BN);                                  \
  }

TCS_FORWARD(tcs_forward_128x128, 128, 128, 64, 32, 2)
TCS_FORWARD(tcs_forward_64x128, 64, 128, 32, 32, 2)
TCS_FORWARD(tcs_forward_64x64, 64, 64, 32, 16, 2)
TCS_BACKWARD_DATA(tcs_backward_data_128x128, 128, 128, 64, 32, 2)
TCS_BACKWARD_DATA(tcs_backward_data_64x128, 64, 128, 32, 32, 2)
TCS_BACKWARD_DATA(tcs_backward_data_64x64, 64, 64, 32, 16, 2)
TCS_BACKWARD_WEIGHT(tcs_backward_weight_128x128, 128, 128, 32, 64, 1)
TCS_BACKWARD_WEIGHT(tcs_backward_weight_64x128, 64, 128, 32, 32, 2)
TCS_BACKWARD_WEIGHT(tcs_backward_weight_64x64, 64, 64, 32, 16, 2)

// The weights (M, C/G, kh*kw) re-laid for the sliced kernels' A loads and rounded to TF32;
// n = M*C/G*kh*kw.
// forward: (M, kh*kw, C/G); data gradient: (G, C/G, kh*kw, M/G).
__global__ void tc_permute_forward(const int n, const Dtype* w, const int cg, const int taps, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int m = i / (taps * cg), r = i - m * taps * cg, tap = r / cg, c = r - tap * cg;
    out[i] = tc_round(w[((long long)m * cg + c) * taps + tap]);
  }
}
__global__ void tc_permute_backward_data(const int n, const Dtype* w, const int cg, const int taps, const int mg,
                                         Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int per = cg * taps * mg, g = i / per, r = i - g * per, c = r / (taps * mg), r2 = r - c * taps * mg;
    const int tap = r2 / mg, m = r2 - tap * mg;
    out[i] = tc_round(w[(((long long)g * mg + m) * cg + c) * taps + tap]);
  }
}
