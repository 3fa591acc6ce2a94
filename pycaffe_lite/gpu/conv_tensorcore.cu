// Implicit-GEMM 2-D convolution on tensor cores: the GEMM views and operand gathers of
// conv_implicit.cu (its Ops, conv_implicit_ops.cuh) with the inner product on TF32 tensor cores
// (nvcuda::wmma m16n16k8: TF32 inputs, fp32 accumulation). For float only (Dtype == float); it
// compiles for double so that every kernel file builds for both, but is never launched for it.
//
// Block: 256 threads (8 warps) own a BM x BN tile of C = A . B, the warps laid out as
// (BM/WM) x (BN/WN), each holding WM x WN of it as (WM/16) x (WN/16) 16x16 accumulator fragments.
// Per BK slice of the contraction every thread gathers its share of A (rows x BK) and B (BK x
// cols) into registers through the Op (zeros outside the matrix), rounds them to TF32 and stores
// them to shared memory:
//   As[row][k]   (row-major A, leading dimension BK + 4)
//   Bs[k][col]   (row-major B, leading dimension BN + 8)   when consecutive threads load columns
//   Bs[col][k]   (column-major B, leading dimension BK + 4) when they load k (B_KFAST)
// then each warp multiplies its fragments for k = 0, 8, ..; meanwhile the next slice is already
// being loaded into registers. The epilogue stores each accumulator fragment to a per-warp 16x16
// shared scratch and the warp's lanes hand its elements to Op::store (bounds, bias, layout).
// The padding (+4 / +8 floats) keeps every fragment pointer 32-byte aligned and ldm a multiple of 4,
// and spreads a fragment's rows over distinct shared-memory banks.
// Registers: the 128x128 kernels take 1 block per SM (up to 255 registers a thread), the 64x128
// and 64x64 ones 2 (at most 128, no spills); 64x64 fills the device on small late layers.

// The geometry parameters of every entry point (conv_implicit_ops.cuh passes them on as
// IG_GEOMETRY_ARGS).
#define IG_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output, \
      const int group, const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, \
      const int stride_h, const int stride_w, const int height_out, const int width_out
#include "conv_implicit_ops.cuh"

extern "C++" {
#include <mma.h>
}

#define TC_THREADS 256
#define TC_WARPS 8

extern "C++" {

template <bool B_KFAST> struct TcBLayout { typedef nvcuda::wmma::row_major type; };
template <> struct TcBLayout<true> { typedef nvcuda::wmma::col_major type; };

template <int BM, int BN, int BK, int WM, int WN, bool B_KFAST, class Op>
__device__ __forceinline__ void tc_core(const Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  using namespace nvcuda;
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
  const int FM = WM / 16, FN = WN / 16;
  __shared__ __align__(32) float As[BM * LDA];
  __shared__ __align__(32) float Bs[B_KFAST ? BN * LDB : BK * LDB];
  __shared__ __align__(32) float Cs[TC_WARPS][16 * 16];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
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

  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

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
    for (int e = 0; e < A_PER; ++e) As[a_row[e] * LDA + a_k[e]] = wmma::__float_to_tf32(ra[e]);
#pragma unroll
    for (int e = 0; e < B_PER; ++e)
      Bs[B_KFAST ? b_col[e] * LDB + b_k[e] : b_k[e] * LDB + b_col[e]] = wmma::__float_to_tf32(rb[e]);
    __syncthreads();
    const int k1 = k0 + BK;
    if (k1 < k_end) {
#pragma unroll
      for (int e = 0; e < A_PER; ++e) ra[e] = op.a(as[e], k1 + a_k[e], k_end);
#pragma unroll
      for (int e = 0; e < B_PER; ++e) rb[e] = op.b(bs[B_KFAST ? e : 0], k1 + b_k[e], k_end);
    }
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, typename TcBLayout<B_KFAST>::type> fb[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], As + (wm * WM + i * 16) * LDA + kk, LDA);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int col = wn * WN + j * 16;
        wmma::load_matrix_sync(fb[j], B_KFAST ? Bs + col * LDB + kk : Bs + kk * LDB + col, LDB);
      }
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }

  float* cw = Cs[warp];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(cw, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32)
        op.store(m0 + wm * WM + i * 16 + e / 16, n0 + wn * WN + j * 16 + e % 16, cw[e]);
      __syncwarp();
    }
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
