// Shared kernels that are more than one statement (math_functions.py generates the one-statement
// element-wise ones): per-channel affine maps and sums of several inputs, vectorized by W
// (vec.cuh), and per-channel reductions over an (outer, dim, inner) view. Dtype, Mtype, to_m, from_m:
// the prelude; arithmetic and sums are in Mtype, stored values in Dtype. The reductions' per-block
// partial sums are Mtype buffers (float for the half types), and so are per-channel statistics
// (a shift, moments_finish's mean and var, reduce_finish_m's outputs: BatchNorm's float statistics).
#include "block_sum.cuh"
#include "vec.cuh"
#include "weighted_sum.cuh"

extern "C++" {
// y = x * s[c] + b[c] (either term optional; RELU: then v > 0 ? v : v * 0, ReLULayer's formula)
// over an (outer, dim, inner) view; x and y may alias.
template <int W, bool HAS_S, bool HAS_B, bool RELU = false>
__device__ void channel_affine(const int n, const int dim, const int inner, const Dtype* x,
                               const Dtype* s, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, dim, inner);
    const Mtype sc = HAS_S ? to_m(s[c]) : Mtype(1), bc = HAS_B ? to_m(b[c]) : Mtype(0);
    Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      Mtype m = HAS_S ? to_m(v.v[j]) * sc + bc : to_m(v.v[j]) + bc;
      if (RELU && !(m > 0)) m *= Mtype(0);
      v.v[j] = from_m(m);
    }
    vstore<W>(y, u, v);
  }
}

// dst[r * dst_stride + c] = src[r * src_stride + c] for u = r * cols + c < n (all in units of W).
template <int W>
__device__ void copy_rows(const int n, const int cols, const Dtype* src, const int src_stride,
                          Dtype* dst, const int dst_stride) {
  CUDA_KERNEL_LOOP(u, n) {
    const int r = u / cols, c = u - r * cols;
    vstore<W>(dst, r * dst_stride + c, vload<W>(src, r * src_stride + c));
  }
}

enum ReduceOp { OP_SUM, OP_MOMENTS, OP_DOT, OP_DOT_SHIFT, OP_DOT_DX, OP_RELU_SUM };

// Partial per-channel sums over an (outer, dim, inner) view. Block blk handles channel
// blk / chunks and the chunk blk % chunks of that channel's outer * inner elements; it writes
// part[c * chunks + chunk] (first sum) and part[(dim + c) * chunks + chunk] (second sum):
//   OP_SUM:       a
//   OP_MOMENTS:   d and d * d with d = a - (the channel's first element a[c * inner])
//   OP_DOT:       a and a * b
//   OP_DOT_SHIFT: a and a * (b - shift[c])   (shift: Mtype statistics)
//   OP_DOT_DX:    a and a * b, and also writes y = a * q[c] (y may alias a)
//   OP_RELU_SUM:  z = a * (b > 0 ? 1 : 0) (ReLU's backward, negative_slope 0, b its output), and
//                 writes y = z (y may alias a); the second sum is 0
// Unused pointers may be anything non-null.
template <int W, int OP>
__device__ void channel_reduce(const int chunks, const int outer, const int dim, const int inner,
                               const Dtype* a, const Dtype* b, const Mtype* shift,
                               const Dtype* q, Dtype* y, Mtype* part) {
  const int c = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int units = outer * (inner / W);  // of this channel
  const int per = (units + chunks - 1) / chunks;
  const int end = min(units, (chunk + 1) * per);
  const Mtype k = OP == OP_MOMENTS ? to_m(a[c * inner]) : OP == OP_DOT_SHIFT ? shift[c] : Mtype(0);
  const Mtype qc = OP == OP_DOT_DX ? to_m(q[c]) : Mtype(0);
  Mtype s0 = 0, s1 = 0;
  for (int u = chunk * per + threadIdx.x; u < end; u += blockDim.x) {
    const int e = u * W, o = e / inner;
    const int unit = ((o * dim + c) * inner + (e - o * inner)) / W;
    Vec<W> va = vload<W>(a, unit);
    Vec<W> vb;
    if (OP >= OP_DOT) vb = vload<W>(b, unit);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      if (OP == OP_MOMENTS) {
        const Mtype d = to_m(va.v[j]) - k;
        s0 += d;
        s1 += d * d;
      } else if (OP == OP_RELU_SUM) {
        va.v[j] = from_m(to_m(va.v[j]) * (to_m(vb.v[j]) > 0 ? Mtype(1) : Mtype(0)));
        s0 += to_m(va.v[j]);
      } else {
        s0 += to_m(va.v[j]);
        if (OP >= OP_DOT) s1 += to_m(va.v[j]) * (to_m(vb.v[j]) - k);
        if (OP == OP_DOT_DX) va.v[j] = from_m(to_m(va.v[j]) * qc);
      }
    }
    if (OP == OP_DOT_DX || OP == OP_RELU_SUM) vstore<W>(y, unit, va);
  }
  block_sum2(s0, s1);
  if (threadIdx.x == 0) {
    part[c * chunks + chunk] = s0;
    part[(dim + c) * chunks + chunk] = s1;
  }
}
}  // extern "C++"

#define AFFINE(NAME, W, S, B, R)                                                           \
  __global__ void NAME##_v##W(const int n, const int dim, const int inner, const Dtype* x, \
                              const Dtype* s, const Dtype* b, Dtype* y) {                  \
    channel_affine<W, S, B, R>(n, dim, inner, x, s, b, y);                                 \
  }
AFFINE(affine_s, 1, true, false, false)
AFFINE(affine_s, 4, true, false, false)
AFFINE(affine_b, 1, false, true, false)
AFFINE(affine_b, 4, false, true, false)
AFFINE(affine_sb, 1, true, true, false)
AFFINE(affine_sb, 4, true, true, false)
AFFINE(affine_b_relu, 1, false, true, true)  // bias then ReLU: the gemm engine's fused epilogue
AFFINE(affine_b_relu, 4, false, true, true)

#define WSUM(W)                                                                              \
  __global__ void weighted_sum_v##W(const int n, const int k, const Dtype* a0,               \
                                    const Dtype* a1, const Dtype* a2, const Dtype* a3,       \
                                    const Mtype c0, const Mtype c1, const Mtype c2,          \
                                    const Mtype c3, Dtype* y) {                              \
    weighted_sum<W>(n, k, a0, a1, a2, a3, Mtype(c0), Mtype(c1), Mtype(c2), Mtype(c3), y);    \
  }
WSUM(1)
WSUM(4)

#define COPY_ROWS(W)                                                                           \
  __global__ void copy_rows_v##W(const int n, const int cols, const Dtype* src,                \
                                 const int src_stride, Dtype* dst, const int dst_stride) {     \
    copy_rows<W>(n, cols, src, src_stride, dst, dst_stride);                                   \
  }
COPY_ROWS(1)
COPY_ROWS(4)

#define REDUCE(NAME, W, OP)                                                                  \
  __global__ void __launch_bounds__(REDUCE_THREADS)                                          \
  NAME##_v##W(const int chunks, const int outer, const int dim, const int inner,             \
              const Dtype* a, const Dtype* b, const Mtype* shift, const Dtype* q, Dtype* y,  \
              Mtype* part) {                                                                 \
    channel_reduce<W, OP>(chunks, outer, dim, inner, a, b, shift, q, y, part);              \
  }
REDUCE(reduce_sum, 1, OP_SUM)
REDUCE(reduce_sum, 4, OP_SUM)
REDUCE(reduce_moments, 1, OP_MOMENTS)
REDUCE(reduce_moments, 4, OP_MOMENTS)
REDUCE(reduce_dot, 1, OP_DOT)
REDUCE(reduce_dot, 4, OP_DOT)
REDUCE(reduce_dot_shift, 1, OP_DOT_SHIFT)
REDUCE(reduce_dot_shift, 4, OP_DOT_SHIFT)
REDUCE(reduce_dot_dx, 1, OP_DOT_DX)
REDUCE(reduce_dot_dx, 4, OP_DOT_DX)
REDUCE(reduce_relu_sum, 1, OP_RELU_SUM)
REDUCE(reduce_relu_sum, 4, OP_RELU_SUM)

// Second level of channel_reduce: out0[c] = alpha * (first sum) + beta0 * out0[c] when which & 1,
// out1[c] = alpha * (second sum) + beta1 * out1[c] when which & 2 (beta 0 never reads out).
// reduce_finish stores Dtype outputs (gradients of params), reduce_finish_m Mtype ones (statistics).
extern "C++" {
template <typename Out>
__device__ __forceinline__ void reduce_finish_t(const int dim, const int chunks, const Mtype* part, const Mtype alpha,
                                                const int which, Out* out0, const Mtype beta0, Out* out1,
                                                const Mtype beta1) {
  CUDA_KERNEL_LOOP(c, dim) {
    Mtype s0 = 0, s1 = 0;
    for (int k = 0; k < chunks; ++k) {
      s0 += part[c * chunks + k];
      s1 += part[(dim + c) * chunks + k];
    }
    if (which & 1) out0[c] = Out(Mtype(alpha) * s0 + (Mtype(beta0) == Mtype(0) ? Mtype(0) : Mtype(beta0) * Mtype(out0[c])));
    if (which & 2) out1[c] = Out(Mtype(alpha) * s1 + (Mtype(beta1) == Mtype(0) ? Mtype(0) : Mtype(beta1) * Mtype(out1[c])));
  }
}
}  // extern "C++"

__global__ void reduce_finish(const int dim, const int chunks, const Mtype* part, const Mtype alpha,
                              const int which, Dtype* out0, const Mtype beta0, Dtype* out1,
                              const Mtype beta1) {
  reduce_finish_t<Dtype>(dim, chunks, part, alpha, which, out0, beta0, out1, beta1);
}

__global__ void reduce_finish_m(const int dim, const int chunks, const Mtype* part, const Mtype alpha,
                                const int which, Mtype* out0, const Mtype beta0, Mtype* out1,
                                const Mtype beta1) {
  reduce_finish_t<Mtype>(dim, chunks, part, alpha, which, out0, beta0, out1, beta1);
}

// Second level of reduce_moments over m = outer * inner elements per channel: mean and biased
// variance (shifted sums: mean = k + s0 / m, var = s1 / m - (s0 / m)^2), both Mtype.
__global__ void moments_finish(const int dim, const int chunks, const int m, const int inner,
                               const Dtype* x, const Mtype* part, Mtype* mean, Mtype* var) {
  CUDA_KERNEL_LOOP(c, dim) {
    Mtype s0 = 0, s1 = 0;
    for (int k = 0; k < chunks; ++k) {
      s0 += part[c * chunks + k];
      s1 += part[(dim + c) * chunks + k];
    }
    const Mtype d = s0 / m;
    mean[c] = to_m(x[c * inner]) + d;
    var[c] = max(s1 / m - d * d, Mtype(0));
  }
}

// Plane scatter/gather by flat index (max-unpooling): plane p of S source elements and plane p of T
// target elements; an index outside [0, T) takes no part. Where several sources name one target, the
// last (highest source index) wins, as a CPU loop in order leaves it: claim, then write.
__global__ void plane_scatter_claim(const int n, const int S, const int T, const Dtype* idx, int* winner) {
  CUDA_KERNEL_LOOP(i, n) {
    const int k = static_cast<int>(to_m(idx[i]));
    if (k >= 0 && k < T) atomicMax(winner + (long long)(i / S) * T + k, i + 1);
  }
}

__global__ void plane_scatter(const int n, const int S, const int T, const Dtype* x, const Dtype* idx,
                              const int* winner, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int k = static_cast<int>(to_m(idx[i]));
    const long long cell = (long long)(i / S) * T + k;
    if (k >= 0 && k < T && winner[cell] == i + 1) y[cell] = x[i];
  }
}

__global__ void plane_gather(const int n, const int S, const int T, const Dtype* y, const Dtype* idx,
                             Dtype* x) {
  CUDA_KERNEL_LOOP(i, n) {
    const int k = static_cast<int>(to_m(idx[i]));
    x[i] = (k >= 0 && k < T) ? y[(long long)(i / S) * T + k] : Dtype(0);
  }
}
