// The operand views of the implicit-GEMM convolution passes (see conv_implicit.cu for the GEMM
// each one computes), shared by every GEMM core that runs them (conv_implicit.cu on CUDA cores,
// conv_tensorcore.cu on tensor cores). Each Op supplies:
//   a_state(row) / b_state(col): per-row / per-column precomputations (AState / BState),
//   a(state, k, kend) / b(state, k, kend): one element of A[row, k] / B[k, col], 0 outside,
//   store(row, col, value): the bounds-checked epilogue write.
// k_begin / k_end: the contraction range the block runs. The ig_*_op functions below set an Op
// up for group g (and split s) from the entry points' arguments.
// Included after the backend prelude (Dtype; store takes the Mtype accumulator, from_m stores it).
#pragma once
#include "epilogue.cuh"

extern "C++" {

// ---- forward ------------------------------------------------------------------------------
// tab[k] = (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0) for k = (c, i, j) within a group.
struct FwdOp {
  const Dtype* x; const Dtype* w; const Dtype* bias; Dtype* y; const int4* tab; int epilogue;
  int H, W, Wo, P, chw, mp, Mg, Kg, ncols, sh, sw, ph, pw, k_begin, k_end;
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
  __device__ void store(int m, int col, Mtype v) const {
    if (m >= Mg || col >= ncols) return;
    const int n = col / P, p = col - n * P;
    y[(long long)n * mp + m * P + p] = conv_epilogue(v, bias, m, epilogue);
  }
};

// ---- backward data ------------------------------------------------------------------------
// tab[kk] = (m*Kg + i*kw + j, m*P, i*dh, j*dw) for kk = (m, i, j) within a group.
struct BwdDataOp {
  const Dtype* w; const Dtype* dy; Dtype* dx; const int4* tab;
  int HW, W, Ho, Wo, P, chw, mp, Cg, khkw, ncols, sh, sw, ph, pw, k_begin, k_end;
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
  __device__ void store(int c, int col, Mtype v) const {
    if (c >= Cg || col >= ncols) return;
    const int n = col / HW, q = col - n * HW;
    dx[(long long)n * chw + c * HW + q] = from_m(v);
  }
};

// ---- backward weights (split over t) ------------------------------------------------------
// Columns k < Kg are weight taps (tab as in the forward); column Kg, when has_bias, is all ones
// so that the same GEMM sums the bias gradient.
struct BwdWeightOp {
  const Dtype* x; const Dtype* dy; Dtype* ws; const int4* tab;
  int H, W, Wo, P, chw, mp, Mg, Kg, ncols, sh, sw, ph, pw, k_begin, k_end;
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
  __device__ void store(int m, int k, Mtype v) const {
    if (m < Mg && k < ncols) ws[m * ncols + k] = from_m(v);
  }
};


// ---- setup from the entry points' arguments ---------------------------------------------------
// Geometry arguments: the includer defines IG_GEOMETRY_PARAMS (the parameter list of its entry
// points, in the .cu file where the kernel signature parser reads it), in this order:
#ifndef IG_GEOMETRY_PARAMS
#error "define IG_GEOMETRY_PARAMS before including conv_implicit_ops.cuh"
#endif
#define IG_GEOMETRY_ARGS                                                                        \
  num, channels, height, width, num_output, group, kernel_h, kernel_w, pad_h, pad_w, stride_h, \
      stride_w, height_out, width_out

__device__ __forceinline__ FwdOp ig_forward_op(const int g, const Dtype* x, const Dtype* w, const Dtype* bias,
                                               const int epilogue, const int4* tab, Dtype* y,
                                               IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  FwdOp op;
  op.H = height; op.W = width; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * height * width; op.mp = num_output * op.P;
  op.Mg = mg; op.Kg = cg * kernel_h * kernel_w; op.ncols = num * op.P;
  op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + g * cg * height * width; op.w = w + g * mg * op.Kg;
  op.bias = bias + g * mg; op.epilogue = epilogue; op.y = y + g * mg * op.P; op.tab = tab;
  op.k_begin = 0; op.k_end = op.Kg;
  return op;
}

__device__ __forceinline__ BwdDataOp ig_backward_data_op(const int g, const Dtype* w, const Dtype* dy,
                                                         const int4* tab, Dtype* dx, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  BwdDataOp op;
  op.HW = height * width; op.W = width; op.Ho = height_out; op.Wo = width_out;
  op.P = height_out * width_out; op.chw = channels * op.HW; op.mp = num_output * op.P;
  op.Cg = cg; op.khkw = kernel_h * kernel_w; op.ncols = num * op.HW;
  op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.w = w + g * mg * cg * op.khkw; op.dy = dy + g * mg * op.P; op.dx = dx + g * cg * op.HW;
  op.tab = tab;
  op.k_begin = 0; op.k_end = mg * op.khkw;
  return op;
}

// ws: (group, splits, M/G, C/G*kh*kw + has_bias) partial sums; split s covers t in
// [s*chunk, min((s+1)*chunk, num*P)).
__device__ __forceinline__ BwdWeightOp ig_backward_weight_op(const int g, const int s, const Dtype* x,
                                                             const Dtype* dy, const int4* tab, Dtype* ws,
                                                             const int splits, const int chunk,
                                                             const int has_bias, IG_GEOMETRY_PARAMS) {
  const int cg = channels / group, mg = num_output / group;
  BwdWeightOp op;
  op.H = height; op.W = width; op.Wo = width_out; op.P = height_out * width_out;
  op.chw = channels * height * width; op.mp = num_output * op.P;
  op.Mg = mg; op.Kg = cg * kernel_h * kernel_w; op.ncols = op.Kg + (has_bias ? 1 : 0);
  op.sh = stride_h; op.sw = stride_w; op.ph = pad_h; op.pw = pad_w;
  op.x = x + g * cg * height * width; op.dy = dy + g * mg * op.P;
  op.ws = ws + (g * splits + s) * mg * op.ncols; op.tab = tab;
  const int total = num * op.P;
  op.k_begin = s * chunk;
  op.k_end = op.k_begin + chunk < total ? op.k_begin + chunk : total;
  return op;
}

}  // extern "C++"
