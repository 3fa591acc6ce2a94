// BN (yjxiong / PSPNet / SegNet): per-channel coefficients y = a x + b and the element passes. The
// per-channel sums come from math_functions (channel_moments, channel_dot).

#include "vec.cuh"

// a = slope * inv_std, b = bias - mu * a with inv_std = 1 / sqrt(var + eps) when normalize, else
// (SegNet INFERENCE) a = slope, b = bias, mu = 0, inv_std = 1. With update the running values
// become momentum * run + (1 - momentum) * batch.
__global__ void bn_coeffs(const int C, const Dtype* mu, const Dtype* var, const Dtype* slope,
                          const Dtype* bias, const Mtype eps, const int normalize, const int update,
                          const Mtype momentum, Dtype* run_mean, Dtype* run_var, Dtype* a, Dtype* b,
                          Dtype* mean_out, Dtype* inv_std_out) {
  CUDA_KERNEL_LOOP(c, C) {
    const Mtype m = to_m(normalize ? mu[c] : Dtype(0));
    const Mtype r = normalize ? Mtype(1) / sqrt(to_m(var[c]) + Mtype(eps)) : Mtype(1);
    if (update) {
      run_mean[c] = from_m(Mtype(momentum) * to_m(run_mean[c]) + (Mtype(1) - Mtype(momentum)) * to_m(mu[c]));
      run_var[c] = from_m(Mtype(momentum) * to_m(run_var[c]) + (Mtype(1) - Mtype(momentum)) * to_m(var[c]));
    }
    a[c] = from_m(to_m(slope[c]) * r);
    b[c] = from_m(to_m(bias[c]) - m * to_m(a[c]));
    mean_out[c] = from_m(m);
    inv_std_out[c] = from_m(r);
  }
}

// The element passes over units of W consecutive elements of a channel's row (W = 4: 128-bit loads
// and stores for float; the caller picks W with math_functions.vec_width). n counts units.
extern "C++" {
// y = a[c] x + b[c]; with keep, x_hat = (x - mean[c]) * inv_std[c]. x and y may alias.
template <int W>
__device__ void bn_affine(const int n, const int C, const int S, const Dtype* x, const Dtype* a, const Dtype* b,
                          const Dtype* mean, const Dtype* inv_std, const int keep, Dtype* x_hat, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    Vec<W> v = vload<W>(x, u);
    if (keep) {
      const Mtype m = to_m(mean[c]), r = to_m(inv_std[c]);
      Vec<W> h;
#pragma unroll
      for (int j = 0; j < W; ++j) h.v[j] = from_m((to_m(v.v[j]) - m) * r);
      vstore<W>(x_hat, u, h);
    }
    const Mtype ac = to_m(a[c]), bc = to_m(b[c]);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = from_m(ac * to_m(v.v[j]) + bc);
    vstore<W>(y, u, v);
  }
}

// Batch statistics: dx = a[c] (dy - sum_dy[c] / m - x_hat sum_dyx[c] / m); dy and dx may alias.
// x_hat is xs, or with normalize (xs the input) (xs - mean[c]) * inv_std[c] as bn_affine keeps it.
template <int W>
__device__ void bn_backward_batch(const int n, const int C, const int S, const Mtype inv_m, const Dtype* dy,
                                  const Dtype* xs, const int normalize, const Dtype* mean, const Dtype* inv_std,
                                  const Dtype* a, const Dtype* sum_dy, const Dtype* sum_dyx, Dtype* dx) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Mtype ac = to_m(a[c]), p = to_m(sum_dy[c]) * Mtype(inv_m), q = to_m(sum_dyx[c]) * Mtype(inv_m);
    const Mtype m = normalize ? to_m(mean[c]) : Mtype(0), r = normalize ? to_m(inv_std[c]) : Mtype(1);
    Vec<W> d = vload<W>(dy, u);
    const Vec<W> h = vload<W>(xs, u);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Mtype hj = to_m(h.v[j]);
      d.v[j] = from_m(ac * (to_m(d.v[j]) - p - (normalize ? (hj - m) * r : hj) * q));
    }
    vstore<W>(dx, u, d);
  }
}

// Fixed statistics: dx = a[c] dy.
template <int W>
__device__ void bn_backward_fixed(const int n, const int C, const int S, const Dtype* dy, const Dtype* a, Dtype* dx) {
  CUDA_KERNEL_LOOP(u, n) {
    const Mtype ac = to_m(a[vchannel<W>(u, C, S)]);
    Vec<W> d = vload<W>(dy, u);
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = from_m(to_m(d.v[j]) * ac);
    vstore<W>(dx, u, d);
  }
}
}  // extern "C++"

#define BN_ENTRIES(W)                                                                                       \
  __global__ void bn_affine_v##W(const int n, const int C, const int S, const Dtype* x, const Dtype* a,     \
                                 const Dtype* b, const Dtype* mean, const Dtype* inv_std, const int keep,   \
                                 Dtype* x_hat, Dtype* y) {                                                  \
    bn_affine<W>(n, C, S, x, a, b, mean, inv_std, keep, x_hat, y);                                          \
  }                                                                                                         \
  __global__ void bn_backward_batch_v##W(const int n, const int C, const int S, const Mtype inv_m,          \
                                         const Dtype* dy, const Dtype* xs, const int normalize,             \
                                         const Dtype* mean, const Dtype* inv_std, const Dtype* a,           \
                                         const Dtype* sum_dy, const Dtype* sum_dyx, Dtype* dx) {            \
    bn_backward_batch<W>(n, C, S, inv_m, dy, xs, normalize, mean, inv_std, a, sum_dy, sum_dyx, dx);         \
  }                                                                                                         \
  __global__ void bn_backward_fixed_v##W(const int n, const int C, const int S, const Dtype* dy,            \
                                         const Dtype* a, Dtype* dx) {                                       \
    bn_backward_fixed<W>(n, C, S, dy, a, dx);                                                               \
  }
BN_ENTRIES(1)
BN_ENTRIES(4)
