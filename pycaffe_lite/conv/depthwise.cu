// Depthwise convolution: group == channels; num_output = channels * mult, output channel m reads
// input channel m / mult. Layouts: x (num, C, H, W), w (M, 1, kh, kw), y (num, M, Ho, Wo), M = C * mult.
// Note (n * M + m) / mult = n * C + m / mult: the input plane of output plane n * M + m.
// Each pass has three entry points: _k3s1 and _k3s2 (3x3 kernel, stride 1 or 2, no dilation) and _any
// (kernel, stride and dilation from the arguments; the k3 variants ignore the kernel size, stride and
// dilation arguments). The k3 forward, k3s1 data gradient and k3 weight gradient give each thread a
// row vector of DW_V outputs (input pixels) along W: the input row segment they share is loaded once
// into registers. Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude: sums,
// the shared-memory reductions and the register rows are in Mtype.
#include "epilogue.cuh"

#define DW_THREADS 256  // block size of dw_backward_weight_*
#define DW_V 4  // outputs along W per thread in the row-vector (k3) kernels

#define DW_GEOMETRY_PARAMS                                                                        \
  const int channels, const int height, const int width, const int mult, const int kernel_h,     \
      const int kernel_w, const int stride_h, const int stride_w, const int pad_h, const int pad_w, \
      const int dil_h, const int dil_w, const int height_out, const int width_out

#define DW_GEOMETRY_ARGS                                                                          \
  channels, height, width, mult, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, \
      height_out, width_out

extern "C++" {

// ---- general kernels: any kernel size, stride, pad and dilation -------------------------------------
// y: index over (n, m, oh, ow).
__device__ __forceinline__ void dw_forward_body(const int count, const Dtype* __restrict__ x,
                                                const Dtype* __restrict__ w, const Dtype* __restrict__ bias,
                                                const int epilogue, Dtype* __restrict__ y, DW_GEOMETRY_PARAMS) {
  const int kh = kernel_h, kw = kernel_w, sh = stride_h, sw = stride_w;
  const int num_output = channels * mult;
  CUDA_KERNEL_LOOP(index, count) {
    const int ow = index % width_out;
    const int t = index / width_out;
    const int oh = t % height_out;
    const int plane = t / height_out;  // n * M + m
    const int m = plane % num_output;
    const Dtype* xp = x + (plane / mult) * height * width;
    const Dtype* wp = w + m * kh * kw;
    const int h0 = oh * sh - pad_h, w0 = ow * sw - pad_w;
    Mtype sum = 0;
    for (int i = 0; i < kh; ++i) {
      const int ih = h0 + i * dil_h;
      if (ih < 0 || ih >= height) continue;
      for (int j = 0; j < kw; ++j) {
        const int iw = w0 + j * dil_w;
        if (iw >= 0 && iw < width) sum += to_m(wp[i * kw + j]) * to_m(xp[ih * width + iw]);
      }
    }
    y[index] = conv_epilogue(sum, bias, m, epilogue);
  }
}

// dx (assigned): index over (n, c, ih, iw); sums dy over the mult output channels of c and the taps
// whose window covers (ih, iw). K > 0: a KxK kernel, S > 0: stride S (unrolled); 0: run-time values.
template <int K, int S>
__device__ __forceinline__ void dw_backward_data_body(const int count, const Dtype* __restrict__ dy,
                                                      const Dtype* __restrict__ w, Dtype* __restrict__ dx,
                                                      DW_GEOMETRY_PARAMS) {
  const int kh = K ? K : kernel_h, kw = K ? K : kernel_w;
  const int sh = S ? S : stride_h, sw = S ? S : stride_w;
  const int out_plane = height_out * width_out;
  CUDA_KERNEL_LOOP(index, count) {
    const int iw = index % width;
    const int t = index / width;
    const int ih = t % height;
    const int plane = t / height;  // n * C + c
    const int c = plane % channels;
    Mtype sum = 0;
    for (int r = 0; r < mult; ++r) {
      const Dtype* dyp = dy + (plane * mult + r) * out_plane;  // output plane n * M + c * mult + r
      const Dtype* wp = w + (c * mult + r) * kh * kw;
#pragma unroll
      for (int i = 0; i < kh; ++i) {
        const int th = ih + pad_h - i * dil_h;  // = oh * sh
        if (th < 0 || th % sh) continue;
        const int oh = th / sh;
        if (oh >= height_out) continue;
#pragma unroll
        for (int j = 0; j < kw; ++j) {
          const int tw = iw + pad_w - j * dil_w;
          if (tw < 0 || tw % sw) continue;
          const int ow = tw / sw;
          if (ow < width_out) sum += to_m(wp[i * kw + j]) * to_m(dyp[oh * width_out + ow]);
        }
      }
    }
    dx[index] = from_m(sum);
  }
}

// Sum acc[0..T] over the block by a fixed shared-memory tree (deterministic), then: thread u < T the
// tap t0 + u, thread T the bias sum (when has_bias and t0 == 0): with chunks == 1 added straight into
// dw[m, tap] / db[m], else stored in part[(m * chunks + s) * (taps + 1) + tap] (tap == taps: bias).
template <int T>
__device__ __forceinline__ void dw_reduce_store(const Mtype* acc, Mtype* red, const int t0, const int taps,
                                                const int has_bias, const int chunks, const int m, const int s,
                                                Dtype* part, Dtype* dw, Dtype* db) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int u = 0; u <= T; ++u) red[u * DW_THREADS + tid] = acc[u];
  __syncthreads();
  for (int half = DW_THREADS / 2; half > 0; half >>= 1) {
    if (tid < half) {
#pragma unroll
      for (int u = 0; u <= T; ++u) red[u * DW_THREADS + tid] += red[u * DW_THREADS + tid + half];
    }
    __syncthreads();
  }
  if (tid <= T && (tid < T || (t0 == 0 && has_bias))) {
    const int tap = tid < T ? t0 + tid : taps;
    const Mtype v = red[tid * DW_THREADS];
    if (chunks > 1) part[(m * chunks + s) * (taps + 1) + tap] = from_m(v);
    else if (tap < taps) dw[m * taps + tap] = from_m(to_m(dw[m * taps + tap]) + v);
    else db[m] = from_m(to_m(db[m]) + v);
  }
  __syncthreads();  // red is reused by the next sweep
}

// Weight (and bias) gradient partial sums. Block b: output channel m = b / chunks, chunk s = b % chunks
// of the num * P positions e = n * P + p (P = Ho * Wo) of that channel: [s * chunk, min(num * P, (s+1) * chunk)).
// One sweep per tap (and the bias sum in the first), each reduced and stored by dw_reduce_store
// (partials for dw_reduce_weight when chunks > 1).
__device__ __forceinline__ void dw_backward_weight_body(const Dtype* __restrict__ x, const Dtype* __restrict__ dy,
                                                        const int num, const int chunk, const int chunks,
                                                        const int has_bias, Dtype* __restrict__ part,
                                                        Dtype* __restrict__ dw, Dtype* __restrict__ db,
                                                        DW_GEOMETRY_PARAMS) {
  __shared__ Mtype red[2 * DW_THREADS];
  const int kw = kernel_w, taps = kernel_h * kernel_w, num_output = channels * mult;
  const int m = blockIdx.x / chunks, s = blockIdx.x - m * chunks;
  const int out_plane = height_out * width_out, total = num * out_plane;
  const int e0 = s * chunk, e1 = min(total, e0 + chunk);
  const int tid = threadIdx.x;
  for (int tap = 0; tap < taps; ++tap) {
    const int i = tap / kw, j = tap - i * kw;
    Mtype acc[2] = {0, 0};  // tap, bias
    for (int e = e0 + tid; e < e1; e += DW_THREADS) {
      const int n = e / out_plane, p = e - n * out_plane;
      const int oh = p / width_out, ow = p - oh * width_out;
      const Mtype g = to_m(dy[(n * num_output + m) * out_plane + p]);
      const int ih = oh * stride_h - pad_h + i * dil_h, iw = ow * stride_w - pad_w + j * dil_w;
      acc[1] += g;
      if (ih >= 0 && ih < height && iw >= 0 && iw < width)
        acc[0] += g * to_m(x[((n * channels + m / mult) * height + ih) * width + iw]);
    }
    dw_reduce_store<1>(acc, red, tap, taps, has_bias, chunks, m, s, part, dw, db);
  }
}

// ---- row-vector kernels: 3x3, stride S, no dilation; DW_V outputs along W per thread ----------------
// Input columns w0 .. w0 + SPAN - 1 of row ih (zero outside the image) into r, as Mtype.
template <int SPAN>
__device__ __forceinline__ void dw_load_row(const Dtype* __restrict__ row, const int w0, const int width,
                                            Mtype* r) {
#pragma unroll
  for (int u = 0; u < SPAN; ++u) r[u] = (w0 + u >= 0 && w0 + u < width) ? to_m(row[w0 + u]) : Mtype(0);
}

// index over (n, m, oh, q): outputs ow = q * DW_V + v, v < DW_V, of row oh.
template <int S>
__device__ __forceinline__ void dw_forward_rows(const int count, const Dtype* __restrict__ x,
                                                const Dtype* __restrict__ w, const Dtype* __restrict__ bias,
                                                const int epilogue, Dtype* __restrict__ y, DW_GEOMETRY_PARAMS) {
  constexpr int SPAN = (DW_V - 1) * S + 3;
  const int num_output = channels * mult, quads = (width_out + DW_V - 1) / DW_V;
  CUDA_KERNEL_LOOP(index, count) {
    const int q = index % quads;
    const int t = index / quads;
    const int oh = t % height_out;
    const int plane = t / height_out;  // n * M + m
    const int m = plane % num_output;
    const Dtype* xp = x + (plane / mult) * height * width;
    Mtype k[9];
#pragma unroll
    for (int u = 0; u < 9; ++u) k[u] = to_m(w[m * 9 + u]);
    const int ow0 = q * DW_V, h0 = oh * S - pad_h, w0 = ow0 * S - pad_w;
    Mtype sum[DW_V];
#pragma unroll
    for (int v = 0; v < DW_V; ++v) sum[v] = 0;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int ih = h0 + i;
      if (ih < 0 || ih >= height) continue;
      Mtype r[SPAN];
      dw_load_row<SPAN>(xp + ih * width, w0, width, r);
#pragma unroll
      for (int v = 0; v < DW_V; ++v)
#pragma unroll
        for (int j = 0; j < 3; ++j) sum[v] += k[i * 3 + j] * r[v * S + j];
    }
    Dtype* yp = y + (plane * height_out + oh) * width_out;
#pragma unroll
    for (int v = 0; v < DW_V; ++v)
      if (ow0 + v < width_out) yp[ow0 + v] = conv_epilogue(sum[v], bias, m, epilogue);
  }
}

// Stride 1: dx[n, c, ih, iw] = sum_{r, i, j} w[c*mult + r, i, j] dy[n, c*mult + r, ih + pad_h - i, iw + pad_w - j];
// index over (n, c, ih, q): input pixels iw = q * DW_V + v, v < DW_V.
__device__ __forceinline__ void dw_backward_data_rows(const int count, const Dtype* __restrict__ dy,
                                                      const Dtype* __restrict__ w, Dtype* __restrict__ dx,
                                                      DW_GEOMETRY_PARAMS) {
  constexpr int SPAN = DW_V + 2;
  const int quads = (width + DW_V - 1) / DW_V, out_plane = height_out * width_out;
  CUDA_KERNEL_LOOP(index, count) {
    const int q = index % quads;
    const int t = index / quads;
    const int ih = t % height;
    const int plane = t / height;  // n * C + c
    const int c = plane % channels;
    const int iw0 = q * DW_V, w0 = iw0 + pad_w - 2;  // dy column of r[0]
    Mtype sum[DW_V];
#pragma unroll
    for (int v = 0; v < DW_V; ++v) sum[v] = 0;
    for (int rr = 0; rr < mult; ++rr) {
      const Dtype* dyp = dy + (plane * mult + rr) * out_plane;
      const Dtype* k = w + (c * mult + rr) * 9;
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int oh = ih + pad_h - i;
        if (oh < 0 || oh >= height_out) continue;
        Mtype r[SPAN];
        dw_load_row<SPAN>(dyp + oh * width_out, w0, width_out, r);
#pragma unroll
        for (int v = 0; v < DW_V; ++v)
#pragma unroll
          for (int j = 0; j < 3; ++j) sum[v] += to_m(k[i * 3 + j]) * r[v + 2 - j];  // ow = iw + pad_w - j
      }
    }
    Dtype* dxp = dx + (plane * height + ih) * width;
#pragma unroll
    for (int v = 0; v < DW_V; ++v)
      if (iw0 + v < width) dxp[iw0 + v] = from_m(sum[v]);
  }
}

// Weight gradient over positions e = (n, oh, q) of channel m (total num * Ho * quads), each the DW_V
// outputs ow = q * DW_V + v < Wo; chunking, reduction and output as dw_backward_weight_body.
template <int S>
__device__ __forceinline__ void dw_backward_weight_rows(const Dtype* __restrict__ x, const Dtype* __restrict__ dy,
                                                        const int num, const int chunk, const int chunks,
                                                        const int has_bias, Dtype* __restrict__ part,
                                                        Dtype* __restrict__ dw, Dtype* __restrict__ db,
                                                        DW_GEOMETRY_PARAMS) {
  constexpr int SPAN = (DW_V - 1) * S + 3;
  __shared__ Mtype red[10 * DW_THREADS];
  const int num_output = channels * mult, quads = (width_out + DW_V - 1) / DW_V;
  const int m = blockIdx.x / chunks, s = blockIdx.x - m * chunks;
  const int total = num * height_out * quads, e0 = s * chunk, e1 = min(total, e0 + chunk);
  Mtype acc[10];
#pragma unroll
  for (int u = 0; u < 10; ++u) acc[u] = 0;
  for (int e = e0 + threadIdx.x; e < e1; e += DW_THREADS) {
    const int q = e % quads;
    const int t = e / quads;
    const int oh = t % height_out, n = t / height_out;
    const int ow0 = q * DW_V;
    const Dtype* dyp = dy + ((n * num_output + m) * height_out + oh) * width_out;
    Mtype g[DW_V];
#pragma unroll
    for (int v = 0; v < DW_V; ++v) {
      g[v] = ow0 + v < width_out ? to_m(dyp[ow0 + v]) : Mtype(0);
      acc[9] += g[v];
    }
    const Dtype* xp = x + (n * channels + m / mult) * height * width;
    const int h0 = oh * S - pad_h, w0 = ow0 * S - pad_w;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int ih = h0 + i;
      if (ih < 0 || ih >= height) continue;
      Mtype r[SPAN];
      dw_load_row<SPAN>(xp + ih * width, w0, width, r);
#pragma unroll
      for (int j = 0; j < 3; ++j)
#pragma unroll
        for (int v = 0; v < DW_V; ++v) acc[i * 3 + j] += g[v] * r[v * S + j];
    }
  }
  dw_reduce_store<9>(acc, red, 0, 9, has_bias, chunks, m, s, part, dw, db);
}

}  // extern "C++"

// Entry points: FWD, DATA and WEIGHT are the bodies' calls (template arguments included).
#define DW_ENTRY_POINTS(SUFFIX, FWD, DATA, WEIGHT)                                                   \
  __global__ void dw_forward_##SUFFIX(const int count, const Dtype* x, const Dtype* w, const Dtype* bias, \
                                      const int epilogue, Dtype* y, DW_GEOMETRY_PARAMS) {            \
    FWD(count, x, w, bias, epilogue, y, DW_GEOMETRY_ARGS);                                           \
  }                                                                                                  \
  __global__ void dw_backward_data_##SUFFIX(const int count, const Dtype* dy, const Dtype* w, Dtype* dx, \
                                            DW_GEOMETRY_PARAMS) {                                    \
    DATA(count, dy, w, dx, DW_GEOMETRY_ARGS);                                                        \
  }                                                                                                  \
  __global__ void __launch_bounds__(DW_THREADS) dw_backward_weight_##SUFFIX(                         \
      const Dtype* x, const Dtype* dy, const int num, const int chunk, const int chunks,             \
      const int has_bias, Dtype* part, Dtype* dw, Dtype* db, DW_GEOMETRY_PARAMS) {                   \
    WEIGHT(x, dy, num, chunk, chunks, has_bias, part, dw, db, DW_GEOMETRY_ARGS);                      \
  }

#define DW_COMMA ,
DW_ENTRY_POINTS(k3s1, dw_forward_rows<1>, dw_backward_data_rows, dw_backward_weight_rows<1>)
DW_ENTRY_POINTS(k3s2, dw_forward_rows<2>, dw_backward_data_body<3 DW_COMMA 2>, dw_backward_weight_rows<2>)
DW_ENTRY_POINTS(any, dw_forward_body, dw_backward_data_body<0 DW_COMMA 0>, dw_backward_weight_body)

// Sum the chunk partials in a fixed order: dw[m, u] += sum_s part[m, s, u] for u < taps, and
// db[m] += sum_s part[m, s, taps] when has_bias. index over (m, u), u <= taps.
__global__ void dw_reduce_weight(const int count, const Dtype* part, const int chunks, const int taps,
                                 const int has_bias, Dtype* dw, Dtype* db) {
  CUDA_KERNEL_LOOP(index, count) {
    const int u = index % (taps + 1), m = index / (taps + 1);
    if (u == taps && !has_bias) continue;
    const Dtype* p = part + m * chunks * (taps + 1) + u;
    Mtype sum = 0;
    for (int s = 0; s < chunks; ++s) sum += to_m(p[s * (taps + 1)]);
    if (u < taps) dw[m * taps + u] = from_m(to_m(dw[m * taps + u]) + sum);
    else db[m] = from_m(to_m(db[m]) + sum);
  }
}
