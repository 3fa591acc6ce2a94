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

#include "mma16.cuh"  // T16Kind, t16_bits, t16_mma, t16_ldmatrix4(_trans), t16_copy16/commit/wait

extern "C++" {
#if __CUDA_ARCH__ >= 800
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

// ==== channel-sliced kernels (forward and data gradient) ======================================
// For geometries whose contraction splits into slices of T16_BK channels at one filter tap
// (forward: C/G % 32 == 0; data gradient: M/G % 32 == 0; no dilation) the contraction is
// reordered tap-major, k = (tap, channel), as in tensorcore.cu's tcs_ kernels: within a slice every
// element a thread loads shares one bounds check and one base address, consecutive elements lie a
// plane apart. A comes from the weights permuted so that a row's slice is 64 contiguous bytes
// (t16_permute_*), copied by cp.async (16 bytes a thread) into a two-stage shared-memory buffer one
// slice ahead; B (one image column per thread) goes through registers one slice ahead, as in t16_core.

extern "C++" {

#define T16S_LDA (T16_BK + 8)

// An A slice (BM x T16_BK) whose rows are contiguous in global memory: thread t copies 16 bytes
// (8 values) of tile row t/4 + 64e at k = 8*(t%4); rows at and past `rows` are zeros.
template <int BM>
__device__ __forceinline__ void t16_load_rows(unsigned short* As, const Dtype* row0, const long long stride,
                                              const int rows) {
  const int t = threadIdx.x, k = 8 * (t % 4);
#pragma unroll
  for (int e = 0; e < BM / 64; ++e) {
    const int r = t / 4 + 64 * e;
    t16_copy16(As + r * T16S_LDA + k, r < rows ? row0 + r * stride + k : row0, r < rows);
  }
}

// One B column slice per thread: column t%BN at k = t/BN + (256/BN)e, from b + k*stride (b: the
// column's element at k = 0), zeros when !ok.
template <int BN>
__device__ __forceinline__ void t16_load_cols(unsigned short (&rb)[T16_BK * BN / T16_THREADS], const Dtype* b,
                                              const long long stride, const bool ok) {
  const int kb = threadIdx.x / BN, step = T16_THREADS / BN;
  b += kb * stride;
#pragma unroll
  for (int e = 0; e < T16_BK * BN / T16_THREADS; ++e) rb[e] = ok ? t16_bits(b[e * step * stride]) : (unsigned short)0;
}

// The position of the next slice of a tap-major contraction: its first channel and its tap (r, s).
struct T16SlicePos {
  int c0, r, s;
  __device__ void next(const int channels, const int kw) {
    c0 += T16_BK;
    if (c0 == channels) {
      c0 = 0;
      if (++s == kw) s = 0, ++r;
    }
  }
};

// ---- forward: A = W permuted (M/G x (tap, c)), B = input columns ((tap, c) x N*Ho*Wo) -----------
template <int BN> struct T16FwdSliced {
  const Dtype* x; const Dtype* w; const Dtype* bias; Dtype* y; int epilogue;
  int H, W, HW, Wo, P, chw, mp, Mg, Kg, kw, cg, ncols, slices, sh, sw, ph, pw;
  const Dtype* a_ptr; int a_rows;
  const Dtype* b_img; int iy0, ix0, b_ok;
  T16SlicePos at;
  __device__ void init(int m0, int n0) {
    at = T16SlicePos{0, 0, 0};
    a_rows = Mg - m0;
    a_ptr = w + (long long)m0 * Kg;
    const int col = n0 + threadIdx.x % BN;
    b_ok = col < ncols;
    const int n = b_ok ? col / P : 0, p = b_ok ? col - n * P : 0, oy = p / Wo, ox = p - oy * Wo;
    b_img = x + (long long)n * chw;
    iy0 = oy * sh - ph;
    ix0 = ox * sw - pw;
  }
  template <int BM> __device__ void load_a(unsigned short* As, int slice) const {
    t16_load_rows<BM>(As, a_ptr + slice * T16_BK, Kg, a_rows);
  }
  __device__ void load_b(unsigned short (&rb)[T16_BK * BN / T16_THREADS]) {  // slices in order: 0, 1, ..
    const int iy = iy0 + at.r, ix = ix0 + at.s;
    const bool ok = b_ok && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    t16_load_cols<BN>(rb, ok ? b_img + (long long)at.c0 * HW + iy * W + ix : x, HW, ok);
    at.next(cg, kw);
  }
  __device__ void store(int m, int col, Mtype v) const {
    if (m >= Mg || col >= ncols) return;
    const int n = col / P, p = col - n * P;
    y[(long long)n * mp + m * P + p] = conv_epilogue(v, bias, m, epilogue);
  }
};

// ---- data gradient: A = W^T permuted (C/G x (tap, m)), B = dy columns ((tap, m) x N*H*W) --------
template <int BN> struct T16BwdDataSliced {
  const Dtype* w; const Dtype* dy; Dtype* dx;
  int HW, W, Ho, Wo, P, chw, mp, Cg, Mg, khkw, kw, ncols, sh, sw, slices;
  const Dtype* a_ptr; int a_rows;
  const Dtype* b_img; int ty, tx, b_ok;
  T16SlicePos at;
  __device__ void init(int m0, int n0, int ph, int pw) {
    at = T16SlicePos{0, 0, 0};
    a_rows = Cg - m0;
    a_ptr = w + (long long)m0 * khkw * Mg;
    const int col = n0 + threadIdx.x % BN;
    b_ok = col < ncols;
    const int n = b_ok ? col / HW : 0, q = b_ok ? col - n * HW : 0, yy = q / W;
    b_img = dy + (long long)n * mp;
    ty = yy + ph;
    tx = q - yy * W + pw;
  }
  template <int BM> __device__ void load_a(unsigned short* As, int slice) const {
    t16_load_rows<BM>(As, a_ptr + slice * T16_BK, (long long)khkw * Mg, a_rows);
  }
  __device__ void load_b(unsigned short (&rb)[T16_BK * BN / T16_THREADS]) {  // slices in order: 0, 1, ..
    const int mb = at.c0;
    int oy = ty - at.r, ox = tx - at.s;
    at.next(Mg, kw);
    bool ok = b_ok && oy >= 0 && ox >= 0;
    if (sh != 1) { ok = ok && oy % sh == 0; oy /= sh; }
    if (sw != 1) { ok = ok && ox % sw == 0; ox /= sw; }
    ok = ok && oy < Ho && ox < Wo;
    t16_load_cols<BN>(rb, ok ? b_img + (long long)mb * P + oy * Wo + ox : dy, P, ok);
  }
  __device__ void store(int c, int col, Mtype v) const {
    if (c >= Cg || col >= ncols) return;
    const int n = col / HW, q = col - n * HW;
    dx[(long long)n * chw + c * HW + q] = from_m(v);
  }
};

template <int BM, int BN, int WM, int WN, class Op>
__device__ __forceinline__ void t16s_core(Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  const int KIND = T16Kind<Dtype>::value;
  static_assert((BM / WM) * (BN / WN) == T16_WARPS, "8 warps per block");
  static_assert(BM % 64 == 0 && T16_THREADS % BN == 0, "row copies and column loads");
  if (KIND == 0) __trap();  // float and double: never launched (tensorcore16.supports)
  const int LDB = BN + 8, B_PER = T16_BK * BN / T16_THREADS;
  __shared__ __align__(16) unsigned short As[2][BM * T16S_LDA];
  __shared__ __align__(16) unsigned short Bs[2][T16_BK * LDB];
  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int b_col = tid % BN, b_k = tid / BN, step = T16_THREADS / BN;
  float acc[WM / 16][WN / 8][4] = {};
  const int slices = op.slices;
  unsigned short rb[B_PER];
  if (slices > 0) {
    op.template load_a<BM>(As[0], 0);
    t16_commit();
    op.load_b(rb);
  }
  for (int s = 0; s < slices; ++s) {
    const int cur = s & 1;
#pragma unroll
    for (int e = 0; e < B_PER; ++e) Bs[cur][(b_k + step * e) * LDB + b_col] = rb[e];
    if (s + 1 < slices) {
      op.template load_a<BM>(As[cur ^ 1], s + 1);  // that stage was last read before the previous sync
      t16_commit();
      t16_wait<1>();  // slice s's A has landed (this thread's copies) ...
    } else {
      t16_wait<0>();
    }
    __syncthreads();  // ... everyone's, and every thread's B of slice s is in place
    if (s + 1 < slices) op.load_b(rb);  // the next slice's B, in flight during the products
#pragma unroll
    for (int kk = 0; kk < T16_BK; kk += 16)
      t16_warp_step<KIND, WM, WN, T16S_LDA, LDB, false>(acc, As[cur] + wm * WM * T16S_LDA + kk,
                                                        Bs[cur] + wn * WN + kk * LDB);
    __syncthreads();  // stage cur is free for slice s + 2
  }
  t16_store<WM, WN>(op, acc, m0 + wm * WM, n0 + wn * WN);
#else
  __trap();
#endif
}

template <class Op>
__device__ __forceinline__ void t16s_forward_setup(Op& op, const int g, const Dtype* x, const Dtype* w,
                                                   const Dtype* bias, const int epilogue, Dtype* y, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.H = height; op.W = width; op.HW = height * width; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * op.HW; op.mp = num_output * op.P; op.Mg = mg; op.cg = cg;
  op.kw = kernel_w; op.Kg = cg * kernel_h * kernel_w; op.ncols = num * op.P;
  op.slices = kernel_h * kernel_w * (cg / T16_BK); op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + (long long)g * cg * op.HW; op.w = w + (long long)g * mg * op.Kg; op.bias = bias + g * mg;
  op.epilogue = epilogue; op.y = y + (long long)g * mg * op.P;
}

template <class Op>
__device__ __forceinline__ void t16s_backward_data_setup(Op& op, const int g, const Dtype* w, const Dtype* dy,
                                                         Dtype* dx, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.HW = height * width; op.W = width; op.Ho = height_out; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * op.HW; op.mp = num_output * op.P; op.Cg = cg; op.khkw = kernel_h * kernel_w;
  op.kw = kernel_w; op.ncols = num * op.HW; op.sh = stride_h; op.sw = stride_w;
  op.slices = op.khkw * mg / T16_BK; op.Mg = mg;
  op.w = w + (long long)g * cg * op.khkw * mg; op.dy = dy + (long long)g * mg * op.P;
  op.dx = dx + (long long)g * cg * op.HW;
}

}  // extern "C++"

// w: the weights permuted by t16_permute_forward; the other arguments as t16_forward_*'s, less the table.
#define T16S_FORWARD(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                      \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, Dtype* y, IG_GEOMETRY_PARAMS) { \
    T16FwdSliced<BN> op;                                                                                   \
    t16s_forward_setup(op, blockIdx.z, x, w, bias, epilogue, y, IG_GEOMETRY_ARGS);                         \
    op.init(blockIdx.y * BM, blockIdx.x * BN);                                                             \
    t16s_core<BM, BN, WM, WN>(op, blockIdx.y * BM, blockIdx.x * BN);                                       \
  }

// w: the weights permuted by t16_permute_backward_data.
#define T16S_BACKWARD_DATA(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                                \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* w, const Dtype* dy, Dtype* dx, IG_GEOMETRY_PARAMS) {                                    \
    T16BwdDataSliced<BN> op;                                                                               \
    t16s_backward_data_setup(op, blockIdx.z, w, dy, dx, IG_GEOMETRY_ARGS);                                 \
    op.init(blockIdx.y * BM, blockIdx.x * BN, pad_h, pad_w);                                               \
    t16s_core<BM, BN, WM, WN>(op, blockIdx.y * BM, blockIdx.x * BN);                                       \
  }

T16S_FORWARD(t16s_forward_128x128, 128, 128, 32, 64, 1)
T16S_FORWARD(t16s_forward_64x128, 64, 128, 32, 32, 2)
T16S_FORWARD(t16s_forward_64x64, 64, 64, 32, 16, 2)
T16S_BACKWARD_DATA(t16s_backward_data_128x128, 128, 128, 32, 64, 1)
T16S_BACKWARD_DATA(t16s_backward_data_64x128, 64, 128, 32, 32, 2)
T16S_BACKWARD_DATA(t16s_backward_data_64x64, 64, 64, 32, 16, 2)

// ---- sliced weight gradient: A = dy (M/G x pixels), B = input ((pixels) x (tap, c)), B k-fast --------
// As tensorcore.cu's tcs_backward_weight: columns ordered (tap, c); thread t takes pixel k = t%32 of
// each slice, of A rows m0 + t/32 + 8e and of the BN/8 consecutive B columns n0 + (BN/8)(t/32) + e,
// which share one tap (C/G % (BN/8) == 0); it steps its pixel's (image, row, column) on by T16_BK
// per slice. Values go through registers one slice ahead, as in t16_core. Partial sums are fp32,
// (group, splits, M/G, C/G*kh*kw), reduced by t16_reduce_weight (has_bias 0: the bias gradient
// comes from channel_sum).
extern "C++" {
template <int BM, int BN> struct T16BwdWeightSliced {
  static const int A_ROWS = BM / 8, B_COLS = BN / 8;
  const Dtype* x; const Dtype* dy; float* part;
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
  __device__ void load(unsigned short (&ra)[A_ROWS], unsigned short (&rb)[B_COLS]) {  // slices in order
    const bool in = i < k_end;
    const Dtype* a = a_ptr + (long long)n * mp + oy * Wo + ox;
#pragma unroll
    for (int e = 0; e < A_ROWS; ++e) ra[e] = in && e < a_rows ? t16_bits(a[(long long)e * 8 * P]) : (unsigned short)0;
    const int iy = oy * sh - ph + r, ix = ox * sw - pw + s;
    const bool ok = in && (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    const Dtype* b = ok ? b_ptr + (long long)n * chw + iy * W + ix : x;
#pragma unroll
    for (int e = 0; e < B_COLS; ++e) rb[e] = ok && e < b_cols ? t16_bits(b[(long long)e * HW]) : (unsigned short)0;
    i += T16_BK;  // the next slice's pixel
    ox += T16_BK;
    while (ox >= Wo) {
      ox -= Wo;
      if (++oy == Ho) oy = 0, ++n;
    }
  }
  __device__ void store(int m, int col, Mtype v) const {
    if (m >= Mg || col >= Kg) return;
    const int tap = col / Cg, c = col - tap * Cg;
    part[m * Kg + c * khkw + tap] = (float)v;
  }
};

template <int BM, int BN, int WM, int WN, class Op>
__device__ __forceinline__ void t16w_core(Op& op, const int m0, const int n0) {
#if __CUDA_ARCH__ >= 800
  const int KIND = T16Kind<Dtype>::value;
  static_assert((BM / WM) * (BN / WN) == T16_WARPS, "8 warps per block");
  if (KIND == 0) __trap();  // float and double: never launched (tensorcore16.supports)
  const int LD = T16_BK + 8;
  __shared__ __align__(16) unsigned short As[BM * LD];
  __shared__ __align__(16) unsigned short Bs[BN * LD];
  const int tid = threadIdx.x, warp = tid / 32, k = tid % 32;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  unsigned short* as = As + (tid / 32) * LD + k;             // row t/32 + 8e: as + 8e*LD
  unsigned short* bs = Bs + Op::B_COLS * (tid / 32) * LD + k;  // column (BN/8)(t/32) + e: bs + e*LD
  float acc[WM / 16][WN / 8][4] = {};
  const int slices = op.slices;
  unsigned short ra[Op::A_ROWS], rb[Op::B_COLS];
  if (slices > 0) op.load(ra, rb);
  for (int sl = 0; sl < slices; ++sl) {
#pragma unroll
    for (int e = 0; e < Op::A_ROWS; ++e) as[8 * e * LD] = ra[e];
#pragma unroll
    for (int e = 0; e < Op::B_COLS; ++e) bs[e * LD] = rb[e];
    __syncthreads();
    if (sl + 1 < slices) op.load(ra, rb);  // the next slice, in flight during the products
#pragma unroll
    for (int kk = 0; kk < T16_BK; kk += 16)
      t16_warp_step<KIND, WM, WN, LD, LD, true>(acc, As + wm * WM * LD + kk, Bs + wn * WN * LD + kk);
    __syncthreads();
  }
  t16_store<WM, WN>(op, acc, m0 + wm * WM, n0 + wn * WN);
#else
  __trap();
#endif
}

template <class Op>
__device__ __forceinline__ void t16w_setup(Op& op, const int g, const int s, const Dtype* x, const Dtype* dy,
                                           float* ws, const int splits, const int chunk, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  op.H = height; op.W = width; op.HW = height * width; op.Ho = height_out; op.Wo = width_out;
  op.P = height_out * width_out; op.chw = channels * op.HW; op.mp = num_output * op.P; op.Mg = mg; op.Cg = cg;
  op.khkw = kernel_h * kernel_w; op.kw = kernel_w; op.Kg = cg * op.khkw;
  op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + (long long)g * cg * op.HW; op.dy = dy + (long long)g * mg * op.P;
  op.part = ws + ((long long)g * splits + s) * mg * op.Kg;
  const int total = num * op.P;
  op.k_begin = s * chunk;
  op.k_end = op.k_begin + chunk < total ? op.k_begin + chunk : total;
  op.slices = (op.k_end - op.k_begin + T16_BK - 1) / T16_BK;
}
}  // extern "C++"

// ws: fp32 (group, splits, M/G, C/G*kh*kw) partial sums, reduced by t16_reduce_weight (has_bias 0).
#define T16S_BACKWARD_WEIGHT(NAME, BM, BN, WM, WN, MIN_BLOCKS)                                              \
  __global__ void __launch_bounds__(T16_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* x, const Dtype* dy, float* ws, const int splits, const int chunk, IG_GEOMETRY_PARAMS) { \
    T16BwdWeightSliced<BM, BN> op;                                                                         \
    t16w_setup(op, blockIdx.z / splits, blockIdx.z % splits, x, dy, ws, splits, chunk, IG_GEOMETRY_ARGS);  \
    op.init(blockIdx.y * BM, blockIdx.x * BN);                                                             \
    t16w_core<BM, BN, WM, WN>(op, blockIdx.y * BM, blockIdx.x * BN);                                       \
  }

T16S_BACKWARD_WEIGHT(t16s_backward_weight_128x128, 128, 128, 32, 64, 1)
T16S_BACKWARD_WEIGHT(t16s_backward_weight_64x128, 64, 128, 32, 32, 1)
T16S_BACKWARD_WEIGHT(t16s_backward_weight_64x64, 64, 64, 32, 16, 2)

// The weights (M, C/G, kh*kw) re-laid for the sliced kernels' A copies (values unchanged);
// n = M*C/G*kh*kw. forward: (M, kh*kw, C/G); data gradient: (G, C/G, kh*kw, M/G).
__global__ void t16_permute_forward(const int n, const Dtype* w, const int cg, const int taps, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int m = i / (taps * cg), r = i - m * taps * cg, tap = r / cg, c = r - tap * cg;
    out[i] = w[((long long)m * cg + c) * taps + tap];
  }
}
__global__ void t16_permute_backward_data(const int n, const Dtype* w, const int cg, const int taps, const int mg,
                                          Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int per = cg * taps * mg, g = i / per, r = i - g * per, c = r / (taps * mg), r2 = r - c * taps * mg;
    const int tap = r2 / mg, m = r2 - tap * mg;
    out[i] = w[(((long long)g * mg + m) * cg + c) * taps + tap];
  }
}
