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
// into registers while the current one is multiplied. Dtype comes from the backend prelude.
#include "conv_epilogue.cuh"

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
  Dtype acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = Dtype(0);

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
      Dtype fa[TM], fb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) fa[i] = As[kk][tm + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) fb[j] = Bs[kk][tn + j * (BN / TN)];
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

// ---- forward ------------------------------------------------------------------------------
// tab[k] = (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0) for k = (c, i, j) within a group.
struct FwdOp {
  const Dtype* x; const Dtype* w; const Dtype* bias; Dtype* y; const int4* tab; int epilogue;
  int H, W, Wo, P, chw, mp, Mg, Kg, ncols, sh, sw, ph, pw;
  struct AState { int row; };
  struct BState { const Dtype* base; int iy0, ix0, ok; };
  __device__ AState a_state(int m) const { AState s; s.row = m < Mg ? m * Kg : -1; return s; }
  __device__ BState b_state(int col) const {
    BState s;
    s.ok = col < ncols;
    const int n = s.ok ? col / P : 0, p = col - n * P, oy = p / Wo, ox = p - oy * Wo;
    s.base = x + (long long)n * chw;
    s.iy0 = oy * sh - ph;
    s.ix0 = ox * sw - pw;
    return s;
  }
  __device__ Dtype a(const AState& s, int k, int kend) const {
    return (s.row >= 0 && k < kend) ? w[s.row + k] : Dtype(0);
  }
  __device__ Dtype b(const BState& s, int k, int kend) const {
    if (!s.ok || k >= kend) return Dtype(0);
    const int4 t = tab[k];
    const int iy = s.iy0 + t.y, ix = s.ix0 + t.z;
    return ((unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W) ? s.base[t.x + s.iy0 * W + s.ix0] : Dtype(0);
  }
  __device__ void store(int m, int col, Dtype v) const {
    if (m >= Mg || col >= ncols) return;
    const int n = col / P, p = col - n * P;
    y[(long long)n * mp + m * P + p] = conv_epilogue(v, bias, m, epilogue);
  }
};

// ---- backward data ------------------------------------------------------------------------
// tab[kk] = (m*Kg + i*kw + j, m*P, i*dh, j*dw) for kk = (m, i, j) within a group.
struct BwdDataOp {
  const Dtype* w; const Dtype* dy; Dtype* dx; const int4* tab;
  int HW, W, Ho, Wo, P, chw, mp, Cg, khkw, ncols, sh, sw, ph, pw;
  struct AState { int row; };
  struct BState { const Dtype* base; int ty, tx, ok; };
  __device__ AState a_state(int c) const { AState s; s.row = c < Cg ? c * khkw : -1; return s; }
  __device__ BState b_state(int col) const {
    BState s;
    s.ok = col < ncols;
    const int n = s.ok ? col / HW : 0, q = col - n * HW, y = q / W, xx = q - y * W;
    s.base = dy + (long long)n * mp;
    s.ty = y + ph;
    s.tx = xx + pw;
    return s;
  }
  __device__ Dtype a(const AState& s, int kk, int kend) const {
    return (s.row >= 0 && kk < kend) ? w[tab[kk].x + s.row] : Dtype(0);
  }
  __device__ Dtype b(const BState& s, int kk, int kend) const {
    if (!s.ok || kk >= kend) return Dtype(0);
    const int4 t = tab[kk];
    int oy = s.ty - t.z, ox = s.tx - t.w;
    if (oy < 0 || ox < 0) return Dtype(0);
    if (sh != 1) { if (oy % sh) return Dtype(0); oy /= sh; }
    if (sw != 1) { if (ox % sw) return Dtype(0); ox /= sw; }
    return (oy < Ho && ox < Wo) ? s.base[t.y + oy * Wo + ox] : Dtype(0);
  }
  __device__ void store(int c, int col, Dtype v) const {
    if (c >= Cg || col >= ncols) return;
    const int n = col / HW, q = col - n * HW;
    dx[(long long)n * chw + c * HW + q] = v;
  }
};

// ---- backward weights (split over t) ------------------------------------------------------
// Columns k < Kg are weight taps (tab as in the forward); column Kg, when has_bias, is all ones
// so that the same GEMM sums the bias gradient.
struct BwdWeightOp {
  const Dtype* x; const Dtype* dy; Dtype* ws; const int4* tab;
  int H, W, Wo, P, chw, mp, Mg, Kg, ncols, sh, sw, ph, pw;
  struct AState { const Dtype* base; int ok; };
  struct BState { int4 t; int kind; };  // kind: 0 tap, 1 bias column, -1 outside
  __device__ AState a_state(int m) const { AState s; s.ok = m < Mg; s.base = dy + (s.ok ? m * P : 0); return s; }
  __device__ BState b_state(int k) const {
    BState s;
    s.kind = k < Kg ? 0 : (k < ncols ? 1 : -1);
    s.t = k < Kg ? tab[k] : make_int4(0, 0, 0, 0);
    return s;
  }
  __device__ Dtype a(const AState& s, int t, int tend) const {
    if (!s.ok || t >= tend) return Dtype(0);
    const int n = t / P, p = t - n * P;
    return s.base[(long long)n * mp + p];
  }
  __device__ Dtype b(const BState& s, int t, int tend) const {
    if (s.kind < 0 || t >= tend) return Dtype(0);
    if (s.kind == 1) return Dtype(1);
    const int n = t / P, p = t - n * P, oy = p / Wo, ox = p - oy * Wo;
    const int iy0 = oy * sh - ph, ix0 = ox * sw - pw;
    const int iy = iy0 + s.t.y, ix = ix0 + s.t.z;
    return ((unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W)
               ? x[(long long)n * chw + s.t.x + iy0 * W + ix0] : Dtype(0);
  }
  __device__ void store(int m, int k, Dtype v) const {
    if (m < Mg && k < ncols) ws[m * ncols + k] = v;
  }
};

}  // extern "C++"

// ---- entry points ---------------------------------------------------------------------------
// Geometry arguments, in order: num, channels, height, width, num_output, group, kernel_h,
// kernel_w, pad_h, pad_w, stride_h, stride_w, height_out, width_out. Grid: (col tiles, row tiles,
// group) for the forward and backward data; (col tiles, row tiles, group * splits) for weights.

#define IG_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output, \
      const int group, const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, \
      const int stride_h, const int stride_w, const int height_out, const int width_out

#define IG_FORWARD(NAME, BM, BN, BK, TM, TN)                                                    \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, const int4* tab,  \
      Dtype* y, IG_GEOMETRY_PARAMS) {                                                          \
    const int g = blockIdx.z, cg = channels / group, mg = num_output / group;                \
    FwdOp op;                                                                                  \
    op.H = height; op.W = width; op.Wo = width_out; op.P = height_out * width_out;            \
    op.chw = channels * height * width; op.mp = num_output * op.P;                            \
    op.Mg = mg; op.Kg = cg * kernel_h * kernel_w; op.ncols = num * op.P;                       \
    op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;                          \
    op.x = x + g * cg * height * width; op.w = w + g * mg * op.Kg;                            \
    op.bias = bias + g * mg; op.epilogue = epilogue; op.y = y + g * mg * op.P; op.tab = tab;       \
    igemm_core<BM, BN, BK, TM, TN, true, false>(op, blockIdx.y * BM, blockIdx.x * BN, 0, op.Kg); \
  }

#define IG_BACKWARD_DATA(NAME, BM, BN, BK, TM, TN)                                              \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* w, const Dtype* dy, const int4* tab, Dtype* dx, IG_GEOMETRY_PARAMS) {       \
    const int g = blockIdx.z, cg = channels / group, mg = num_output / group;                \
    BwdDataOp op;                                                                              \
    op.HW = height * width; op.W = width; op.Ho = height_out; op.Wo = width_out;               \
    op.P = height_out * width_out; op.chw = channels * op.HW; op.mp = num_output * op.P;      \
    op.Cg = cg; op.khkw = kernel_h * kernel_w; op.ncols = num * op.HW;                        \
    op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;                          \
    op.w = w + g * mg * cg * op.khkw; op.dy = dy + g * mg * op.P; op.dx = dx + g * cg * op.HW; \
    op.tab = tab;                                                                              \
    igemm_core<BM, BN, BK, TM, TN, true, false>(op, blockIdx.y * BM, blockIdx.x * BN, 0,       \
                                                mg * op.khkw);                                 \
  }

// ws: (group, splits, M/G, C/G*kh*kw + has_bias) partial sums; split s covers t in
// [s*chunk, min((s+1)*chunk, num*P)).
#define IG_BACKWARD_WEIGHT(NAME, BM, BN, BK, TM, TN)                                            \
  __global__ void __launch_bounds__(IG_THREADS) NAME(                                         \
      const Dtype* x, const Dtype* dy, const int4* tab, Dtype* ws, const int splits,           \
      const int chunk, const int has_bias, IG_GEOMETRY_PARAMS) {                               \
    const int g = blockIdx.z / splits, s = blockIdx.z % splits;                                \
    const int cg = channels / group, mg = num_output / group;                                  \
    BwdWeightOp op;                                                                            \
    op.H = height; op.W = width; op.Wo = width_out; op.P = height_out * width_out;            \
    op.chw = channels * height * width; op.mp = num_output * op.P;                            \
    op.Mg = mg; op.Kg = cg * kernel_h * kernel_w; op.ncols = op.Kg + (has_bias ? 1 : 0);       \
    op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;                          \
    op.x = x + g * cg * height * width; op.dy = dy + g * mg * op.P;                           \
    op.ws = ws + (g * splits + s) * mg * op.ncols; op.tab = tab;                               \
    const int total = num * op.P, t0 = s * chunk;                                              \
    const int t1 = t0 + chunk < total ? t0 + chunk : total;                                    \
    igemm_core<BM, BN, BK, TM, TN, true, true>(op, blockIdx.y * BM, blockIdx.x * BN, t0, t1);  \
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
    Dtype sum = 0;
    for (int s = 0; s < splits; ++s) sum += p[(long long)s * mg * cols];
    if (k < kg) dw[gm * kg + k] += sum;
    else db[gm] += sum;
  }
}
