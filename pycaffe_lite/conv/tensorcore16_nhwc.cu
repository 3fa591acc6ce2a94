// Implicit-GEMM 2-D convolution on fp16 / bf16 tensor cores with NHWC-staged operands (the
// tensorcore16-nhwc-* engines, tensorcore16_nhwc.py). For the half storage types only; it compiles
// for float and double so that every kernel file builds for every type, but is never launched for
// them (the core traps).
//
// t16n_conv_<BM>x<BN> computes, for oy < Ho, ox < Wo,
//   out[n][m][out_y0 + out_sy*oy][out_x0 + out_sx*ox] = epilogue(sum over (r, s, c) of
//     w[m][r][s][c] * x[n][oy*sh - ph + r][ox*sw - pw + s][c])
// with x in NHWC (staged by the host from the NCHW blob), w permuted to (M, kh, kw, C)
// (t16n_permute_weights) and out NCHW of out_h x out_w planes: the GEMM (M x N*Ho*Wo) = A (M x K) .
// B (K x N*Ho*Wo), K = (tap, c) ordered tap-major. The forward pass runs it on (x, w) (out = y:
// out_h x out_w = Ho x Wo, out_s* 1, out_*0 0). The data gradient runs it once per output phase
// (py, px) of its stride on (dy, the transposed filter's taps of that phase, flipped), a stride-1
// convolution writing dx rows py + sh*oy, columns px + sw*ox (tensorcore16_nhwc.data_phases).
// Requires C % 8 == 0 (16-byte pieces of a pixel's channels; the host stages other C zero-padded to
// the next multiple of 8, and pads the permuted weights alike). kh or kw 0: zeros.
//
// Block: 256 threads (8 warps) own a BM x BN tile of out, the warps laid (BM/WM) x (BN/WN), each
// holding WM x WN as (WM/16) x (WN/8) m16n8 fp32 accumulators. The contraction runs in slices of
// T16N_BK (32) consecutive k (T16NhwcSlices: dense, a slice may span taps; zeros past K). Per slice a stage
// holds A (BM rows) and B (BN columns), both k-fast: 32 halves (64 bytes, four 16-byte chunks) per
// row. Every 16-byte chunk is one cp.async.cg with src-size 0 outside the matrix (rows past M,
// columns past N*Ho*Wo, padding, channels past C: zero-filled), thread t copying chunk t%4 of rows
// t/4 + 64e. STAGES slices are in flight (a ring of commit groups). Chunk q of row r lives at
// chunk q ^ ((r >> 1) & 3) of that row (XOR swizzle): the 8 rows one ldmatrix phase reads (8
// consecutive rows, one logical chunk) then cover all 32 banks. ldmatrix.x4 (no .trans) hands both
// operands' fragments to mma.sync m16n8k16 (row.col). The epilogue adds the bias and applies ReLU
// in fp32 (conv_epilogue), rounds once, stages the tile in shared memory (rows of BN + 8 halves) and
// writes each NCHW row with a warp's 32 consecutive columns.

#include "mma16.cuh"  // T16Kind, t16_mma, t16_ldmatrix4, t16_copy16, t16_commit, t16_wait
#include "epilogue.cuh"
#include "vec.cuh"  // Vec<8>, vstore: 16-byte stores of 8 halves
#include "t16_nhwc_tile.cuh"  // T16NhwcSlices, t16_store_nchw

#define T16N_THREADS 256
#define T16N_BK 32

#define T16N_GEOMETRY_PARAMS                                                                     \
  const int num, const int channels, const int height, const int width, const int num_output,   \
      const int kernel_h, const int kernel_w, const int pad_h, const int pad_w, const int stride_h, \
      const int stride_w, const int height_out, const int width_out
#define T16N_OUT_PARAMS                                                                           \
  const int out_h, const int out_w, const int out_sy, const int out_sx, const int out_y0, const int out_x0, \
      const int vec_out

extern "C++" {

// Offset (16-bit elements) of 16-byte chunk q (0..3) of row r in a stage tile of T16N_BK-element rows.
__device__ __forceinline__ int t16n_at(const int r, const int q) { return r * T16N_BK + ((q ^ ((r >> 1) & 3)) << 3); }
struct T16nSwizzle {
  static __device__ __forceinline__ int at(const int r, const int q) { return t16n_at(r, q); }
};

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void t16n_conv(const Dtype* __restrict__ x, const Dtype* __restrict__ w,
                                          const Dtype* __restrict__ bias, const int epilogue, Dtype* __restrict__ y,
                                          T16N_GEOMETRY_PARAMS, T16N_OUT_PARAMS) {
#if __CUDA_ARCH__ >= 800
  const int KIND = T16Kind<Dtype>::value;
  static_assert((BM / WM) * (BN / WN) == T16N_THREADS / 32, "8 warps per block");
  static_assert(BM % 64 == 0 && BN % 64 == 0 && BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0,
                "tile shape");
  static_assert(STAGES >= 2, "a ring of at least two stages");
  if (KIND == 0) __trap();  // float and double: never launched (tensorcore16_nhwc.supports)
  const int A_CH = BM / 64, B_CH = BN / 64;  // 16-byte chunks a thread copies per stage
  const int STAGE = (BM + BN) * T16N_BK;     // elements of a stage: A rows, then B columns
  extern __shared__ __align__(128) unsigned short t16n_smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int mtiles = (num_output + BM - 1) / BM;
  const int m0 = (blockIdx.x % mtiles) * BM, n0 = (blockIdx.x / mtiles) * BN;  // row tiles fastest: B reuse in L2
  const int HW = height * width, P = height_out * width_out, ncols = num * P;
  const int K = kernel_h * kernel_w * channels;
  const int slices = (K + T16N_BK - 1) / T16N_BK;  // dense: a slice may span taps
  const int q = tid & 3, rt = tid >> 2;  // this thread's chunk and first tile row / column

  T16NhwcSlices<T16N_BK, 64, A_CH, B_CH, T16nSwizzle> slices_of(
      w, m0, n0, rt, q, num_output, K, ncols, P, HW, channels, width_out, kernel_w, stride_h, stride_w, pad_h, pad_w);
  auto load = [&](const int stage) {
    unsigned short* As = t16n_smem + stage * STAGE;
    slices_of.load(As, As + BM * T16N_BK, x, w, rt, q, K, channels, height, width, kernel_w);
  };

  float acc[WM / 16][WN / 8][4] = {};

#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {  // the ring's first STAGES - 1 slices
    if (st < slices) load(st);
    t16_commit();  // one group per slice, empty past the end, so the counting below holds
  }
  for (int s = 0; s < slices; ++s) {
    t16_wait<STAGES - 2>();  // this thread's copies of slice s have landed (groups 0..s) ...
    __syncthreads();         // ... everyone's; and everyone is done with slice s - 1's stage
    if (s + STAGES - 1 < slices) load((s + STAGES - 1) % STAGES);  // into slice s - 1's stage
    t16_commit();
    const unsigned short* As = t16n_smem + (s % STAGES) * STAGE;
    const unsigned short* Bs = As + BM * T16N_BK;
#pragma unroll
    for (int kk = 0; kk < T16N_BK / 16; ++kk) {
      unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
      for (int i = 0; i < WM / 16; ++i)  // matrices: rows 0-7 / 8-15 at chunk 2kk, then at 2kk + 1
        t16_ldmatrix4(a[i], As + t16n_at(wm * WM + i * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < WN / 8; j += 2) {  // matrices: (cols j.., k 0-7), (j.., 8-15), (j+1.., 0-7), (j+1.., 8-15)
        unsigned r[4];
        t16_ldmatrix4(r, Bs + t16n_at(wn * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
        b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) t16_mma<KIND>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  t16_wait<0>();
  __syncthreads();  // the stages are free: the epilogue tile reuses them

  // Epilogue: bias, ReLU, one rounding; the tile through shared memory, then NCHW rows.
  const int LDE = BN + 8;  // 272 / 144-byte rows: the 8 rows g of a fragment store hit distinct banks
  Dtype* Es = reinterpret_cast<Dtype*>(t16n_smem);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < WM / 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm * WM + i * 16 + g + 8 * h, m = m0 + row;
      const bool m_ok = m < num_output;
#pragma unroll
      for (int j = 0; j < WN / 8; ++j) {
        const int col = wn * WN + j * 8 + 2 * t;
        Es[row * LDE + col] = m_ok ? conv_epilogue(acc[i][j][2 * h], bias, m, epilogue) : Dtype(0);
        Es[row * LDE + col + 1] = m_ok ? conv_epilogue(acc[i][j][2 * h + 1], bias, m, epilogue) : Dtype(0);
      }
    }
  __syncthreads();
  t16_store_nchw<BM, BN, T16N_THREADS>(Es, LDE, y, tid, m0, n0, num_output, ncols, P, width_out, out_h, out_w,
                                       out_sy, out_sx, out_y0, out_x0, vec_out);
#else
  __trap();  // fp16/bf16 mma.sync m16n8k16 needs sm_80 or newer (tensorcore16_nhwc.supports checks)
#endif
}

}  // extern "C++"

// x: NHWC (num, height, width, channels); w: (num_output, kernel_h, kernel_w, channels); bias:
// (num_output,) read when epilogue has CONV_EPI_BIAS (else any valid pointer); y: NCHW
// (num, num_output, out_h, out_w), written at the rows and columns the out_* arguments give;
// vec_out (only with out_h x out_w = Ho x Wo, out_s* 1, out_*0 0, Ho*Wo % 8 == 0 and y 16-byte
// aligned) stores 8 columns of a row with one 16-byte store.
// Grid: (ceil(num_output / BM) * ceil(num*Ho*Wo / BN), 1, 1), 256 threads,
// tensorcore16_nhwc.shared_bytes(tile) of dynamic shared memory.
#define T16N_CONV(NAME, BM, BN, WM, WN, STAGES, MIN_BLOCKS)                                                    \
  __global__ void __launch_bounds__(T16N_THREADS, MIN_BLOCKS) NAME(                                           \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, Dtype* y, T16N_GEOMETRY_PARAMS, \
      T16N_OUT_PARAMS) {                                                                                        \
    t16n_conv<BM, BN, WM, WN, STAGES>(x, w, bias, epilogue, y, num, channels, height, width, num_output,      \
                                      kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w, height_out,       \
                                      width_out, out_h, out_w, out_sy, out_sx, out_y0, out_x0, vec_out);      \
  }

T16N_CONV(t16n_conv_128x128, 128, 128, 32, 64, 4, 2)
T16N_CONV(t16n_conv_128x64, 128, 64, 32, 32, 4, 2)
T16N_CONV(t16n_conv_64x128, 64, 128, 32, 32, 4, 2)
T16N_CONV(t16n_conv_64x64, 64, 64, 32, 16, 4, 3)

// The weights w (M, C, kh, kw) re-laid as the kernel's A (values unchanged), n = rows*uh*uw*chans:
// data_grad 0: out (M, kh, kw, chans) = w with the tap moved inside (rows = M, uh x uw = kh x kw), channels
//   c >= wchans (= C; chans is C rounded up to a multiple of 8) zero;
// data_grad 1: out (C, uh, uw, M) = the transposed filter's taps of one output phase, flipped:
//   out[c][u][v][m] = w[m][c][i0 + sh*(uh-1-u)][j0 + sw*(uw-1-v)] (rows = C, chans = M).
__global__ void t16n_permute_weights(const int n, const Dtype* w, const int rows, const int chans, const int kh,
                                     const int kw, const int uh, const int uw, const int i0, const int j0,
                                     const int sh, const int sw, const int data_grad, const int wchans, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = i % chans, rest = i / chans, v = rest % uw, rest2 = rest / uw, u = rest2 % uh, o = rest2 / uh;
    out[i] = data_grad ? w[(((long long)c * rows + o) * kh + i0 + sh * (uh - 1 - u)) * kw + j0 + sw * (uw - 1 - v)]
             : c < wchans ? w[(((long long)o * wchans + c) * kh + u) * kw + v]
                          : Dtype(0);
  }
}

// ==== weight gradient ===========================================================================
// t16n_wgrad_<BM>x<BN>: fp32 partial sums of dW[m][(tap, c)] = sum over pixels t = (n, oy, ox) of
//   dy[n][oy][ox][m] * x[n][oy*sh - ph + r][ox*sw - pw + s][c]
// with dy and x staged NHWC: the GEMM dW (M x Kg) = A (M x T) . B (T x Kg), contracted over
// T = N*Ho*Wo, split across gridDim.y: split z sums t in [z*chunk, min((z+1)*chunk, T)). Both operands
// are k-major in memory (a pixel's M outputs, a pixel's C channels at one tap, contiguous): a stage
// holds T16N_BK pixel rows of A (BM outputs) and of B (BN columns), 16-byte chunk q of row k at
// chunk q ^ (k & 7) (rows of at least 8 chunks: the 8 rows one ldmatrix phase reads hit distinct
// bank groups), copied by cp.async (zeros past T, past M, past Kg and outside the image) and read
// with ldmatrix.x4.trans. Requires C % 8 == 0 and M % 8 == 0 (x staged zero-padded to C channels when
// the weights have dw_channels < C). Partial sums go to ws[z][m][c*kh*kw + tap] for c < dw_channels
// (the weights' own order, rows of dw_channels*kh*kw), reduced by t16_reduce_weight (tensorcore16.cu).
extern "C++" {

// Offset (16-bit elements) of chunk q of row k in a k-major stage tile of `chunks` chunks a row.
__device__ __forceinline__ int t16n_kat(const int k, const int q, const int chunks) {
  return (k * chunks + (q ^ (k & 7))) << 3;
}

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void t16n_wgrad(const Dtype* __restrict__ dy, const Dtype* __restrict__ x,
                                           float* __restrict__ ws, const int chunk, const int dw_channels,
                                           T16N_GEOMETRY_PARAMS) {
#if __CUDA_ARCH__ >= 800
  const int KIND = T16Kind<Dtype>::value;
  static_assert((BM / WM) * (BN / WN) == T16N_THREADS / 32, "8 warps per block");
  static_assert(BM % 64 == 0 && BN % 64 == 0 && BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0,
                "tile shape");
  if (KIND == 0) __trap();  // float and double: never launched
  const int A_Q = BM / 8, B_Q = BN / 8;                                        // chunks a row
  const int A_CH = BM * T16N_BK / 8 / T16N_THREADS, B_CH = BN * T16N_BK / 8 / T16N_THREADS;  // a thread's copies
  const int STAGE = (BM + BN) * T16N_BK;
  extern __shared__ __align__(128) unsigned short t16n_smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / (BN / WN), wn = warp % (BN / WN);
  const int mtiles = (num_output + BM - 1) / BM;
  const int m0 = (blockIdx.x % mtiles) * BM, n0 = (blockIdx.x / mtiles) * BN;
  const int P = height_out * width_out, total = num * P, Kg = kernel_h * kernel_w * channels;
  const int t_begin = blockIdx.y * chunk;
  const int t_end = t_begin + chunk < total ? t_begin + chunk : total;
  const int slices = (t_end - t_begin + T16N_BK - 1) / T16N_BK;

  const int qa = tid % A_Q, ka = tid / A_Q, qb = tid % B_Q, kb = tid / B_Q;
  const int m = m0 + 8 * qa;
  const bool m_ok = m < num_output;
  const int colb = n0 + 8 * qb;  // this thread's 8 columns: one tap, channels c..c+7
  const bool col_ok = colb < Kg;
  const int tap = col_ok ? colb / channels : 0, c = col_ok ? colb - tap * channels : 0;
  const int r = tap / kernel_w, s = tap - r * kernel_w;
  // the pixel (image, output row, column) of each B row this thread copies, in the next slice to
  // load; stepped on by T16N_BK pixels per slice instead of divided anew
  int b_n[B_CH], b_oy[B_CH], b_ox[B_CH];
#pragma unroll
  for (int e = 0; e < B_CH; ++e) {
    const int t = t_begin + kb + e * (T16N_THREADS / B_Q), p = t % P;
    b_n[e] = t / P;
    b_oy[e] = p / width_out;
    b_ox[e] = p - b_oy[e] * width_out;
  }

  auto load = [&](const int stage, const int slice) {  // slices in order: 0, 1, ...
    unsigned short* As = t16n_smem + stage * STAGE;
    unsigned short* Bs = As + BM * T16N_BK;
    const int t0 = t_begin + slice * T16N_BK;
#pragma unroll
    for (int e = 0; e < A_CH; ++e) {
      const int k = ka + e * (T16N_THREADS / A_Q), t = t0 + k;
      const bool ok = m_ok && t < t_end;
      t16_copy16(As + t16n_kat(k, qa, A_Q), ok ? dy + (long long)t * num_output + m : dy, ok);
    }
#pragma unroll
    for (int e = 0; e < B_CH; ++e) {
      const int k = kb + e * (T16N_THREADS / B_Q), t = t0 + k;
      const int iy = b_oy[e] * stride_h - pad_h + r, ix = b_ox[e] * stride_w - pad_w + s;
      const bool ok = col_ok && t < t_end && (unsigned)iy < (unsigned)height && (unsigned)ix < (unsigned)width;
      t16_copy16(Bs + t16n_kat(k, qb, B_Q),
                 ok ? x + ((long long)(b_n[e] * height + iy) * width + ix) * channels + c : x, ok);
      b_ox[e] += T16N_BK;
      while (b_ox[e] >= width_out) {
        b_ox[e] -= width_out;
        if (++b_oy[e] == height_out) b_oy[e] = 0, ++b_n[e];
      }
    }
  };

  float acc[WM / 16][WN / 8][4] = {};

#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < slices) load(st, st);
    t16_commit();
  }
  for (int sl = 0; sl < slices; ++sl) {
    t16_wait<STAGES - 2>();
    __syncthreads();
    if (sl + STAGES - 1 < slices) load((sl + STAGES - 1) % STAGES, sl + STAGES - 1);
    t16_commit();
    const unsigned short* As = t16n_smem + (sl % STAGES) * STAGE;
    const unsigned short* Bs = As + BM * T16N_BK;
#pragma unroll
    for (int kk = 0; kk < T16N_BK / 16; ++kk) {
      unsigned a[WM / 16][4], b[WN / 8][2];
#pragma unroll
      for (int i = 0; i < WM / 16; ++i)  // matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15)
        t16_ldmatrix4_trans(a[i], As + t16n_kat(16 * kk + (lane & 7) + ((lane >> 4) << 3),
                                                (wm * WM + i * 16) / 8 + ((lane >> 3) & 1), A_Q));
#pragma unroll
      for (int j = 0; j < WN / 8; j += 2) {  // matrices (k 0-7, cols j..), (k 8-15, j..), (k 0-7, j+1..), (k 8-15, j+1..)
        unsigned rr[4];
        t16_ldmatrix4_trans(rr, Bs + t16n_kat(16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3),
                                              (wn * WN + j * 8) / 8 + (lane >> 4), B_Q));
        b[j][0] = rr[0], b[j][1] = rr[1], b[j + 1][0] = rr[2], b[j + 1][1] = rr[3];
      }
#pragma unroll
      for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j) t16_mma<KIND>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  t16_wait<0>();

  const int taps = kernel_h * kernel_w, dw_cols = taps * dw_channels;
  float* part = ws + (long long)blockIdx.y * num_output * dw_cols;
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int j = 0; j < WN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + wn * WN + j * 8 + 2 * tq + e;
      if (col >= Kg) continue;
      const int ct = col / channels, cc = col - ct * channels, off = cc * taps + ct;
      if (cc >= dw_channels) continue;  // a staged channel of zeros
#pragma unroll
      for (int i = 0; i < WM / 16; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int mm = m0 + wm * WM + i * 16 + g + 8 * h;
          if (mm < num_output) part[(long long)mm * dw_cols + off] = acc[i][j][2 * h + e];
        }
    }
#else
  __trap();
#endif
}

}  // extern "C++"

// dy: NHWC (num, height_out, width_out, num_output); x: NHWC (num, height, width, channels); ws: fp32
// (gridDim.y, num_output, dw_channels*kernel_h*kernel_w) partial sums; chunk: pixels a split sums (a
// multiple of T16N_BK); dw_channels <= channels: the weights' channels (x's past them are zeros). Grid: (ceil(num_output / BM) * ceil(Kg / BN), splits, 1), 256 threads,
// the forward's dynamic shared memory of the same tile.
#define T16N_WGRAD(NAME, BM, BN, WM, WN, STAGES, MIN_BLOCKS)                                                 \
  __global__ void __launch_bounds__(T16N_THREADS, MIN_BLOCKS) NAME(                                         \
      const Dtype* dy, const Dtype* x, float* ws, const int chunk, const int dw_channels,                   \
      T16N_GEOMETRY_PARAMS) {                                                                               \
    t16n_wgrad<BM, BN, WM, WN, STAGES>(dy, x, ws, chunk, dw_channels, num, channels, height, width,        \
                                       num_output, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w,    \
                                       height_out, width_out);                                              \
  }

T16N_WGRAD(t16n_wgrad_128x128, 128, 128, 32, 64, 4, 2)
T16N_WGRAD(t16n_wgrad_128x64, 128, 64, 32, 32, 4, 2)
T16N_WGRAD(t16n_wgrad_64x128, 64, 128, 32, 32, 4, 2)
T16N_WGRAD(t16n_wgrad_64x64, 64, 64, 32, 16, 4, 3)

// ==== staging: NCHW -> NHWC =====================================================================
// dst (N, plane, channels) = src (N, channels, in_plane) at pixel p's source (p / out_w) * sh * in_w +
// (p % out_w) * sw: the transpose (out_w = in_w, in_plane = plane, strides 1), or a subsampled copy (a
// 1x1 convolution at stride (sh, sw) without padding reads only those pixels); channels % 8 == 0. Block (256 threads):
// T16N_TT pixels x T16N_TT channels of image blockIdx.y (blockIdx.x = pixel tile * channel tiles +
// channel tile). Reads: a warp takes 32 consecutive pixels of one channel (coalesced), 16 loads in
// flight a thread; the tile is kept [channel][pixel] with rows of T16N_TT + 2 elements (the 16
// 4-byte words a warp's row write touches are consecutive; the column reads below meet at most
// 2 to a bank); writes: 16 bytes (8 channels of a pixel) a thread, a warp 4 pixels' 128-byte runs.
#define T16N_TT 64
#define T16N_TP (T16N_TT + 2)

__global__ void __launch_bounds__(T16N_THREADS) t16n_to_nhwc(const Dtype* src, Dtype* dst, const int channels,
                                                              const int plane, const int out_w, const int in_plane,
                                                              const int in_w, const int sh, const int sw) {
  __shared__ __align__(16) Dtype tile[T16N_TT * T16N_TP];
  const int ctiles = (channels + T16N_TT - 1) / T16N_TT;
  const int c0 = (blockIdx.x % ctiles) * T16N_TT, p0 = (blockIdx.x / ctiles) * T16N_TT;
  const Dtype* s = src + (long long)blockIdx.y * channels * in_plane;
  Dtype* d = dst + (long long)blockIdx.y * channels * plane;
  const int tid = threadIdx.x;
  const int ITEMS = T16N_TT * T16N_TT / T16N_THREADS;
  static_assert(T16N_THREADS % T16N_TT == 0, "a thread's loads share one pixel");
  const int pix = p0 + tid % T16N_TT, sp = (pix / out_w) * sh * in_w + (pix % out_w) * sw;  // its source
  Dtype v[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int c = (tid + k * T16N_THREADS) / T16N_TT;
    v[k] = (pix < plane && c0 + c < channels) ? s[(long long)(c0 + c) * in_plane + sp] : Dtype(0);
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int l = tid + k * T16N_THREADS;
    tile[(l / T16N_TT) * T16N_TP + l % T16N_TT] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < T16N_TT * T16N_TT / 8 / T16N_THREADS; ++k) {
    const int u = tid + k * T16N_THREADS, q = u % (T16N_TT / 8), p = u / (T16N_TT / 8);
    if (p0 + p < plane && c0 + 8 * q < channels) {
      Vec<8> out;
#pragma unroll
      for (int j = 0; j < 8; ++j) out.v[j] = tile[(8 * q + j) * T16N_TP + p];
      vstore<8>(d + (long long)(p0 + p) * channels + c0 + 8 * q, 0, out);
    }
  }
}

// dst (N, plane, dchannels) = src (N, channels, plane) with channels dchannels > channels zero, dchannels
// % 8 == 0: the staging of channel counts off the multiple of 8 (an RGB stem's 3). One thread per
// (image, 8-channel group, pixel), pixels fastest: every load is coalesced across a warp's pixels, a
// 16-byte store per thread (consecutive for dchannels 8). count = N * plane * dchannels / 8.
__global__ void t16n_to_nhwc_narrow(const int count, const Dtype* src, Dtype* dst, const int channels,
                                    const int dchannels, const int plane) {
  const int groups = dchannels / 8;
  CUDA_KERNEL_LOOP(i, count) {
    const int p = i % plane, rest = i / plane, g = rest % groups, n = rest / groups;
    const Dtype* s = src + ((long long)n * channels + 8 * g) * plane + p;
    Vec<8> out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = 8 * g + j < channels ? s[(long long)j * plane] : Dtype(0);
    vstore<8>(dst + ((long long)n * plane + p) * dchannels + 8 * g, 0, out);
  }
}
