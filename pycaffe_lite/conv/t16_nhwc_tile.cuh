// What the NHWC implicit-GEMM convolution kernels share (t16n_conv in tensorcore16_nhwc.cu, t16w_conv in
// wgmma.cu): the copy of one slice of the contraction (BK channels at one tap) into a stage, and the
// epilogue's store of a BM x BN tile of out as NCHW rows. Included after the backend prelude (Dtype),
// mma16.cuh (t16_copy16) and vec.cuh (Vec, vstore).
#pragma once

extern "C++" {

// The 16-byte chunks one thread copies per slice: chunk q of A rows (weights) m0 + rt + RPP*e and of
// B columns (output pixels) n0 + rt + RPP*e, e < A_CH / B_CH, each at Swizzle::at(row, q) of its tile.
// x NHWC (num, height, width, channels), w (num_output, kh, kw, channels); C % 8 == 0. The contraction
// K = (tap, c), tap-major, is sliced densely: slice s holds k = s*BK .. s*BK + BK - 1 (past K: zeros),
// so a slice may span taps (C < BK or C % BK != 0). This thread's chunk of the next slice to load is
// k = ld_k, at tap (ld_r, ld_s), channels ld_c..ld_c + 7 (8 | C: a chunk never crosses a tap).
template <int BK, int RPP, int A_CH, int B_CH, class Swizzle>
struct T16NhwcSlices {
  const Dtype* a_src[A_CH];
  bool a_ok[A_CH];
  int b_img[B_CH], b_iy[B_CH], b_ix[B_CH];  // image offset, first input row and column
  int ld_k, ld_r, ld_s, ld_c;

  __device__ __forceinline__ T16NhwcSlices(const Dtype* __restrict__ w, const int m0, const int n0, const int rt,
                                           const int q, const int num_output, const int K, const int ncols,
                                           const int P, const int HW, const int channels, const int width_out,
                                           const int kernel_w, const int stride_h, const int stride_w,
                                           const int pad_h, const int pad_w)
      : ld_k(8 * q) {
    const int tap = ld_k / channels;
    ld_c = ld_k - tap * channels;
    ld_r = tap / kernel_w;
    ld_s = tap - ld_r * kernel_w;
#pragma unroll
    for (int e = 0; e < A_CH; ++e) {
      const int m = m0 + rt + RPP * e;
      a_ok[e] = m < num_output;
      a_src[e] = w + (long long)(a_ok[e] ? m : 0) * K;
    }
#pragma unroll
    for (int e = 0; e < B_CH; ++e) {
      const int col = n0 + rt + RPP * e;
      if (col < ncols) {
        const int n = col / P, p = col - n * P, oy = p / width_out, ox = p - oy * width_out;
        b_img[e] = n * HW * channels;
        b_iy[e] = oy * stride_h - pad_h;
        b_ix[e] = ox * stride_w - pad_w;
      } else {
        b_img[e] = 0;
        b_iy[e] = -(1 << 30);  // every tap out of bounds: zeros
        b_ix[e] = 0;
      }
    }
  }

  // cp.async the next slice into the stage at As (A rows) and Bs (B columns); step to the one after.
  __device__ __forceinline__ void load(unsigned short* As, unsigned short* Bs, const Dtype* __restrict__ x,
                                       const Dtype* __restrict__ w, const int rt, const int q, const int K,
                                       const int channels, const int height, const int width, const int kernel_w) {
    const bool k_ok = ld_k < K;
#pragma unroll
    for (int e = 0; e < A_CH; ++e) {
      const bool ok = k_ok && a_ok[e];
      t16_copy16(As + Swizzle::at(rt + RPP * e, q), ok ? a_src[e] + ld_k : w, ok);
    }
#pragma unroll
    for (int e = 0; e < B_CH; ++e) {
      const int iy = b_iy[e] + ld_r, ix = b_ix[e] + ld_s;
      const bool ok = k_ok && (unsigned)iy < (unsigned)height && (unsigned)ix < (unsigned)width;
      t16_copy16(Bs + Swizzle::at(rt + RPP * e, q), ok ? x + b_img[e] + (iy * width + ix) * channels + ld_c : x, ok);
    }
    ld_k += BK;
    ld_c += BK;
    while (ld_c >= channels) {  // once per tap crossed: at most once when C >= BK
      ld_c -= channels;
      if (++ld_s == kernel_w) ld_s = 0, ++ld_r;
    }
  }
};

// The rows m0.. (at most BM, below num_output) of the tile Es (rows of LDE elements, BN columns n0..)
// to out: vec_out (dense output, P % 8 == 0, y 16-byte aligned) 8 columns of a row a 16-byte store;
// else one element at a time at the out_* rows and columns (t16n_conv's contract). BN <= THREADS.
template <int BM, int BN, int THREADS>
__device__ __forceinline__ void t16_store_nchw(const Dtype* Es, const int LDE, Dtype* __restrict__ y, const int tid,
                                               const int m0, const int n0, const int num_output, const int ncols,
                                               const int P, const int width_out, const int out_h, const int out_w,
                                               const int out_sy, const int out_sx, const int out_y0,
                                               const int out_x0, const int vec_out) {
  static_assert(BN <= THREADS && THREADS % BN == 0, "a thread per column, THREADS / BN rows at a time");
  const int rows = num_output - m0 < BM ? num_output - m0 : BM;
  if (vec_out) {
    const int c8 = 8 * (tid % (BN / 8)), col = n0 + c8;
    if (col < ncols) {  // the 8 columns share an image (P % 8 == 0) and all lie below ncols (ncols % 8 == 0)
      const int n = col / P, p = col - n * P;
      Dtype* out = y + (long long)n * num_output * P + p;
#pragma unroll 2
      for (int row = tid / (BN / 8); row < rows; row += THREADS / (BN / 8))
        vstore<8>(out + (long long)(m0 + row) * P, 0, *reinterpret_cast<const Vec<8>*>(Es + row * LDE + c8));
    }
  } else {
    const int cl = tid % BN, col = n0 + cl;
    if (col < ncols) {
      const int n = col / P, p = col - n * P, oy = p / width_out, ox = p - oy * width_out;
      const long long plane = (long long)out_h * out_w;
      Dtype* out = y + n * num_output * plane + (out_y0 + out_sy * oy) * out_w + out_x0 + out_sx * ox;
#pragma unroll 4
      for (int row = tid / BN; row < rows; row += THREADS / BN) out[(m0 + row) * plane] = Es[row * LDE + cl];
    }
  }
}

}  // extern "C++"
