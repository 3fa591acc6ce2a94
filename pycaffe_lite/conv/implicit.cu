// Implicit-GEMM 2-D convolution: the im2col gather is fused into the operand loads of a tiled
// GEMM, so no column buffer is written. Three passes, one GEMM view each (per group g):
//   forward      y[n, m, p]  = sum_k  W[m, k] * col[k, (n, p)]        rows m, cols (n, p)
//   backward x   dx[n, c, q] = sum_kk W'[c, kk] * dyg[kk, (n, q)]      rows c, cols (n, q) input pixels
//   backward w   ws[s, m, k] = sum_t  dy[m, t] * col[k, t]             rows m, cols k (+1 bias column),
//                                                                      the t = (n, p) range split in S
// where k = (c, i, j) runs over C/G * kh * kw, kk = (m, i, j) over M/G * kh * kw, and dyg gathers
// the top gradient that kernel tap (i, j) sends to input pixel q. Tables built once per geometry
// give each k or kk its offsets (int4, see conv_implicit.py), so the inner loops never divide.
// The GEMM core keeps a BM x BN tile per 256-thread block, TM x TN outputs per thread spread with
// stride (BM/TM, BN/TN) to avoid shared-memory bank conflicts, and prefetches the next BK slice
// into registers while the current one is multiplied. Dtype, Mtype, to_m, from_m come from the backend
// prelude: the tiles hold Dtype, the accumulators are Mtype.

// The geometry parameters of every entry point (conv_implicit_ops.cuh passes them on as
// IG_GEOMETRY_ARGS).
#define IG_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output, \
      const int group, const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, \
      const int stride_h, const int stride_w, const int height_out, const int width_out
#include "implicit_ops.cuh"

#define IG_THREADS 256

extern "C++" {

// ---- GEMM core -----------------------------------------------------------------------------
// Op supplies:  a(outer_state, k) / b(outer_state, k) element loads (0 outside the matrix),
//               a_state(row) / b_state(col) per-row / per-column precomputations,
//               store(row, col, value).
// A_KFAST / B_KFAST: whether consecutive threads load consecutive k (true when the operand is
// contiguous along the contraction axis) or consecutive rows / columns.
template <int BM, int BN, int BK, int TM, int TN, bool A_KFAST, bool B_KFAST, class Op>
__device__ __forceinline__ void igemm_core(const Op& op, const int m0, const int n0, const int k_begin,
                                           const int k_end) {
  const int A_PER = BM * BK / IG_THREADS;
  const int B_PER = BN * BK / IG_THREADS;
  const int A_STATES = A_KFAST ? A_PER : 1;
  const int B_STATES = B_KFAST ? B_PER : 1;
  __shared__ Dtype As[BK][BM + (A_KFAST ? 1 : 0)];
  __shared__ Dtype Bs[BK][BN + (B_KFAST ? 1 : 0)];
  const int tid = threadIdx.x;
  // the (row, k) / (k, col) of every element this thread loads, in tile coordinates
  int a_row[A_PER], a_k[A_PER], b_col[B_PER], b_k[B_PER];
#pragma unroll
  for (int e = 0; e < A_PER; ++e) {
    a_row[e] = A_KFAST ? tid / BK + e * (IG_THREADS / BK) : tid % BM;
    a_k[e] = A_KFAST ? tid % BK : tid / BM + e * (IG_THREADS / BM);
  }
#pragma unroll
  for (int e = 0; e < B_PER; ++e) {
    b_col[e] = B_KFAST ? tid / BK + e * (IG_THREADS / BK) : tid % BN;
    b_k[e] = B_KFAST ? tid % BK : tid / BN + e * (IG_THREADS / BN);
  }
  typename Op::AState as[A_STATES];
  typename Op::BState bs[B_STATES];
#pragma unroll
  for (int e = 0; e < A_STATES; ++e) as[e] = op.a_state(m0 + a_row[e]);
#pragma unroll
  for (int e = 0; e < B_STATES; ++e) bs[e] = op.b_state(n0 + b_col[e]);

  Dtype ra[A_PER], rb[B_PER];
  Mtype acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = Mtype(0);

  const int tm = tid / (BN / TN), tn = tid % (BN / TN);
  if (k_begin < k_end) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) ra[e] = op.a(as[A_KFAST ? e : 0], k_begin + a_k[e], k_end);
#pragma unroll
    for (int e = 0; e < B_PER; ++e) rb[e] = op.b(bs[B_KFAST ? e : 0], k_begin + b_k[e], k_end);
  }
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
#pragma unroll
    for (int e = 0; e < A_PER; ++e) As[a_k[e]][a_row[e]] = ra[e];
#pragma unroll
    for (int e = 0; e < B_PER; ++e) Bs[b_k[e]][b_col[e]] = rb[e];
    __syncthreads();
    const int k1 = k0 + BK;
    if (k1 < k_end) {
#pragma unroll
      for (int e = 0; e < A_PER; ++e) ra[e] = op.a(as[A_KFAST ? e : 0], k1 + a_k[e], k_end);
#pragma unroll
      for (int e = 0; e < B_PER; ++e) rb[e] = op.b(bs[B_KFAST ? e : 0], k1 + b_k[e], k_end);
    }
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      Mtype fa[TM], fb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) fa[i] = to_m(As[kk][tm + i * (BM / TM)]);
#pragma unroll
      for (int j = 0; j < TN; ++j) fb[j] = to_m(Bs[kk][tn + j * (BN / TN)]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += fa[i] * fb[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) op.store(m0 + tm + i * (BM / TM), n0 + tn + j * (BN / TN), acc[i][j]);
}

}  // extern "C++"

// ---- entry points ---------------------------------------------------------------------------
// Geometry arguments: IG_GEOMETRY_PARAMS (conv_implicit_ops.cuh). Grid: (col tiles, row tiles,
// group) for the forward and backward data; (col tiles, row tiles, group * splits) for weights.

#define IG_FORWARD(NAME, BM, BN, BK, TM, TN)                                                    \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, const int4* tab,  \
      Dtype* y, IG_GEOMETRY_PARAMS) {                                                          \
    const FwdOp op = ig_forward_op(blockIdx.z, x, w, bias, epilogue, tab, y, IG_GEOMETRY_ARGS); \
    igemm_core<BM, BN, BK, TM, TN, true, false>(op, blockIdx.y * BM, blockIdx.x * BN, op.k_begin, \
                                                op.k_end);                                     \
  }

#define IG_BACKWARD_DATA(NAME, BM, BN, BK, TM, TN)                                              \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* w, const Dtype* dy, const int4* tab, Dtype* dx, IG_GEOMETRY_PARAMS) {       \
    const BwdDataOp op = ig_backward_data_op(blockIdx.z, w, dy, tab, dx, IG_GEOMETRY_ARGS);    \
    igemm_core<BM, BN, BK, TM, TN, true, false>(op, blockIdx.y * BM, blockIdx.x * BN, op.k_begin, \
                                                op.k_end);                                     \
  }

// ws: (group, splits, M/G, C/G*kh*kw + has_bias) partial sums (see ig_backward_weight_op).
#define IG_BACKWARD_WEIGHT(NAME, BM, BN, BK, TM, TN)                                            \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* x, const Dtype* dy, const int4* tab, Dtype* ws, const int splits,           \
      const int chunk, const int has_bias, IG_GEOMETRY_PARAMS) {                               \
    const BwdWeightOp op = ig_backward_weight_op(blockIdx.z / splits, blockIdx.z % splits, x, dy, tab, ws, \
                                                 splits, chunk, has_bias, IG_GEOMETRY_ARGS);   \
    igemm_core<BM, BN, BK, TM, TN, true, true>(op, blockIdx.y * BM, blockIdx.x * BN, op.k_begin, \
                                               op.k_end);                                      \
  }

IG_FORWARD(ig_forward_128x128, 128, 128, 8, 8, 8)
IG_FORWARD(ig_forward_64x128, 64, 128, 16, 4, 8)
IG_FORWARD(ig_forward_32x64, 32, 64, 16, 2, 4)
IG_FORWARD(ig_forward_16x128, 16, 128, 16, 1, 8)
IG_FORWARD(ig_forward_32x32, 32, 32, 16, 2, 2)
IG_BACKWARD_DATA(ig_backward_data_128x128, 128, 128, 8, 8, 8)
IG_BACKWARD_DATA(ig_backward_data_64x128, 64, 128, 16, 4, 8)
IG_BACKWARD_DATA(ig_backward_data_32x64, 32, 64, 16, 2, 4)
IG_BACKWARD_DATA(ig_backward_data_16x128, 16, 128, 16, 1, 8)
IG_BACKWARD_DATA(ig_backward_data_32x32, 32, 32, 16, 2, 2)
IG_BACKWARD_WEIGHT(ig_backward_weight_64x64, 64, 64, 16, 4, 4)
IG_BACKWARD_WEIGHT(ig_backward_weight_32x32, 32, 32, 16, 2, 2)

// Sum the split partials in a fixed order (deterministic) into the weight and bias gradients:
// dw[g, m, k] += sum_s ws[g, s, m, k]; db[g*Mg + m] += sum_s ws[g, s, m, Kg] when has_bias (db
// is not touched otherwise).
__global__ void ig_reduce_weight(const int count, const Dtype* ws, const int splits, const int mg,
                                 const int kg, const int has_bias, Dtype* dw, Dtype* db) {
  const int cols = kg + (has_bias ? 1 : 0);
  CUDA_KERNEL_LOOP(index, count) {  // index over (g, m, k) with k < cols
    const int k = index % cols;
    const int gm = index / cols;  // g * mg + m
    const int g = gm / mg, m = gm - g * mg;
    const Dtype* p = ws + ((long long)g * splits * mg + m) * cols + k;
    Mtype sum = 0;
    for (int s = 0; s < splits; ++s) sum += to_m(p[(long long)s * mg * cols]);
    if (k < kg) dw[gm * kg + k] = from_m(to_m(dw[gm * kg + k]) + sum);
    else db[gm] = from_m(to_m(db[gm]) + sum);
  }
}
