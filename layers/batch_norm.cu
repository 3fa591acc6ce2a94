// BatchNorm over a (num, C, S) view. Per-channel statistics are computed on the device (the
// running sums and their scale factor are never read on the host), so passes can be captured in
// CUDA graphs. The element passes are vectorized by W (vec.cuh).
//
// The chain kernels (bn_chain_*) run BatchNorm -> per-channel affine (Scale) -> ReLU as one
// forward and one backward (runtime/fusion.py's NormChain; BatchNorm alone in place uses them too):
//   forward   xh = (x - mean[c]) * inv_std[c], saved;  y = relu?(xh * gamma[c] + beta[c])
//   backward  dz = relu? dy * (y > 0) : dy;  per channel s0 = sum dz, s1 = sum dz * xh;
//             gamma' += s1, beta' += s0; then with g = gamma[c] (1 without an affine), r = inv_std[c]
//             batch statistics:  dx = g * r * (dz - s0 / m - xh * s1 / m)
//             global statistics: dx = dz * g * r (written by the reducing pass itself)
// the same arithmetic, in the same order, as the layers' own passes where they are exact
// (forward; the global-statistics backward), and the batch formula with xh in place of x - mean.
// Arithmetic and sums are in Mtype (to_m / from_m from the backend prelude); what a layer's own pass
// would store (xh, the scaled value) is rounded to Dtype where that pass would store it. Statistics
// are Mtype buffers (float for the half types: the running sums, mean, var, inv_std, the chain's
// coefficients and partial sums); data, and the Scale's gamma, beta and their gradients, are Dtype.
#include "block_sum.cuh"
#include "vec.cuh"

// Global statistics: mean = f * run_mean, var = f * run_var with f = 1 / run_s (0 when run_s == 0).
__global__ void bn_global_stats(const int C, const Mtype* run_mean, const Mtype* run_var,
                                const Mtype* run_s, const Mtype eps, Mtype* mean, Mtype* inv_std) {
  const Mtype f = run_s[0] == Mtype(0) ? Mtype(0) : Mtype(1) / run_s[0];
  CUDA_KERNEL_LOOP(c, C) {
    mean[c] = f * run_mean[c];
    inv_std[c] = Mtype(1) / sqrt(f * run_var[c] + Mtype(eps));
  }
}

// Batch statistics (mean, biased var) given: inv_std, and the running sums
// run_s = maf * run_s + 1, run_mean = mean + maf * run_mean, run_var = corr * var + maf * run_var.
__global__ void bn_batch_stats(const int C, const Mtype maf, const Mtype corr, const Mtype eps,
                               const Mtype* mean, const Mtype* var, Mtype* run_mean,
                               Mtype* run_var, Mtype* run_s, Mtype* inv_std) {
  CUDA_KERNEL_LOOP(c, C) {
    if (c == 0) run_s[0] = Mtype(maf) * run_s[0] + Mtype(1);
    run_mean[c] = mean[c] + Mtype(maf) * run_mean[c];
    run_var[c] = Mtype(corr) * var[c] + Mtype(maf) * run_var[c];
    inv_std[c] = Mtype(1) / sqrt(var[c] + Mtype(eps));
  }
}

extern "C++" {
// y = (x - mean[c]) * inv_std[c]; x and y may alias.
template <int W>
__device__ void bn_normalize(const int n, const int C, const int S, const Dtype* x,
                             const Mtype* mean, const Mtype* inv_std, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Mtype m = mean[c], r = inv_std[c];
    Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = from_m((to_m(v.v[j]) - m) * r);
    vstore<W>(y, u, v);
  }
}

// y = x * inv_std[c] (the global-statistics backward: dx = dy / std); x and y may alias.
template <int W>
__device__ void bn_scale(const int n, const int C, const int S, const Dtype* x, const Mtype* inv_std, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const Mtype r = inv_std[vchannel<W>(u, C, S)];
    Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = from_m(to_m(v.v[j]) * r);
    vstore<W>(y, u, v);
  }
}

// Batch statistics backward with xc = x - mean[c], r = inv_std[c]:
// dx = (dy - mean_dy[c] - xc * r^2 * mean_dyxc[c]) * r, where mean_dy = mean(dy) and
// mean_dyxc = mean(dy * xc) over (num, S). dy and dx may alias.
template <int W>
__device__ void bn_backward(const int n, const int C, const int S, const Dtype* dy,
                            const Dtype* x, const Mtype* mean, const Mtype* inv_std,
                            const Mtype* mean_dy, const Mtype* mean_dyxc, Dtype* dx) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Mtype m = mean[c], r = inv_std[c], a = mean_dy[c], b = r * r * mean_dyxc[c];
    Vec<W> g = vload<W>(dy, u);
    const Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) g.v[j] = from_m((to_m(g.v[j]) - a - (to_m(v.v[j]) - m) * b) * r);
    vstore<W>(dx, u, g);
  }
}

// Chain forward over an (num, C, S) view: xhat = xh, y = relu?(xh * gamma + beta) (has_s / has_b
// 0: no scale / no shift; relu: ReLU with negative_slope 0). x may alias y or xhat.
template <int W>
__device__ void bn_chain_forward(const int n, const int C, const int S, const Dtype* x, const Mtype* mean,
                                 const Mtype* inv_std, const Dtype* gamma, const Dtype* beta, const int has_s,
                                 const int has_b, const int relu, Dtype* xhat, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Mtype m = mean[c], r = inv_std[c];
    const Mtype g = has_s ? to_m(gamma[c]) : Mtype(1), b = has_b ? to_m(beta[c]) : Mtype(0);
    Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = from_m((to_m(v.v[j]) - m) * r);
    vstore<W>(xhat, u, v);
    if (has_s || has_b || relu) {
#pragma unroll
      for (int j = 0; j < W; ++j) {
        if (has_s) v.v[j] = from_m(to_m(v.v[j]) * g + b);
        else if (has_b) v.v[j] = from_m(to_m(v.v[j]) + b);
        if (relu && !(to_m(v.v[j]) > 0)) v.v[j] = from_m(to_m(v.v[j]) * Mtype(0));
      }
    }
    vstore<W>(y, u, v);
  }
}

// The chain's gradient at unit u: dz = dy, times ReLU's mask (y > 0 ? 1 : 0) when relu.
template <int W>
__device__ __forceinline__ Vec<W> bn_chain_dz(const Dtype* dy, const Dtype* y, const int relu, const int u) {
  Vec<W> d = vload<W>(dy, u);
  if (relu) {
    const Vec<W> m = vload<W>(y, u);
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = from_m(to_m(d.v[j]) * (to_m(m.v[j]) > 0 ? Mtype(1) : Mtype(0)));
  }
  return d;
}

// Chain backward, first pass, block blk: channel blk / chunks, chunk blk % chunks of its
// num * S elements (math_functions.cu's channel_reduce layout): part[c * chunks + chunk] = sum dz,
// part[(C + c) * chunks + chunk] = sum dz * xh. write_dx: also dx = dz * g * r (global statistics;
// dx may alias dy).
template <int W>
__device__ void bn_chain_reduce(const int chunks, const int num, const int C, const int S, const Dtype* dy,
                                const Dtype* y, const Dtype* xhat, const int relu, const Dtype* gamma,
                                const int has_s, const Mtype* inv_std, const int write_dx, Dtype* dx,
                                Mtype* part) {
  const int c = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int units = num * (S / W);
  const int per = (units + chunks - 1) / chunks;
  const int end = min(units, (chunk + 1) * per);
  const Mtype g = has_s ? to_m(gamma[c]) : Mtype(1), r = write_dx ? inv_std[c] : Mtype(0);
  Mtype s0 = 0, s1 = 0;
  for (int u = chunk * per + threadIdx.x; u < end; u += blockDim.x) {
    const int e = u * W, o = e / S;
    const int unit = ((o * C + c) * S + (e - o * S)) / W;
    Vec<W> d = bn_chain_dz<W>(dy, y, relu, unit);
    const Vec<W> xh = vload<W>(xhat, unit);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      s0 += to_m(d.v[j]);
      s1 += to_m(d.v[j]) * to_m(xh.v[j]);
    }
    if (write_dx) {
#pragma unroll
      for (int j = 0; j < W; ++j) d.v[j] = from_m(to_m(d.v[j]) * g * r);
      vstore<W>(dx, unit, d);
    }
  }
  block_sum2(s0, s1);
  if (threadIdx.x == 0) {
    part[c * chunks + chunk] = s0;
    part[(C + c) * chunks + chunk] = s1;
  }
}

// Chain backward, second pass (batch statistics): dx = coef[c] * (dz - a[c] - xh * b[c]); dx may
// alias dy.
template <int W>
__device__ void bn_chain_backward(const int n, const int C, const int S, const Dtype* dy, const Dtype* y,
                                  const Dtype* xhat, const int relu, const Mtype* coef, const Mtype* a,
                                  const Mtype* b, Dtype* dx) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Mtype k = coef[c], ac = a[c], bc = b[c];
    Vec<W> d = bn_chain_dz<W>(dy, y, relu, u);
    const Vec<W> xh = vload<W>(xhat, u);
#pragma unroll
    for (int j = 0; j < W; ++j) d.v[j] = from_m(k * (to_m(d.v[j]) - ac - to_m(xh.v[j]) * bc));
    vstore<W>(dx, u, d);
  }
}
}  // extern "C++"

// Chain backward, between the passes: the channel sums s0 = sum dz, s1 = sum dz * xh from the
// partials; gamma_diff += s1 and beta_diff += s0 where asked (as reduce_finish accumulates);
// batch: coef = g * inv_std, a = s0 * inv_m, b = s1 * inv_m for bn_chain_backward.
__global__ void bn_chain_finish(const int C, const int chunks, const Mtype* part, const int want_gamma,
                                Dtype* gamma_diff, const int want_beta, Dtype* beta_diff, const int batch,
                                const Mtype inv_m, const Dtype* gamma, const int has_s, const Mtype* inv_std,
                                Mtype* coef, Mtype* a, Mtype* b) {
  CUDA_KERNEL_LOOP(c, C) {
    Mtype s0 = 0, s1 = 0;
    for (int k = 0; k < chunks; ++k) {
      s0 += part[c * chunks + k];
      s1 += part[(C + c) * chunks + k];
    }
    if (want_gamma) gamma_diff[c] = from_m(s1 + to_m(gamma_diff[c]));
    if (want_beta) beta_diff[c] = from_m(s0 + to_m(beta_diff[c]));
    if (batch) {
      coef[c] = (has_s ? to_m(gamma[c]) : Mtype(1)) * inv_std[c];
      a[c] = s0 * Mtype(inv_m);
      b[c] = s1 * Mtype(inv_m);
    }
  }
}

#define BN_ENTRIES(W)                                                                          \
  __global__ void bn_scale_v##W(const int n, const int C, const int S, const Dtype* x,         \
                                const Mtype* inv_std, Dtype* y) {                              \
    bn_scale<W>(n, C, S, x, inv_std, y);                                                       \
  }                                                                                            \
  __global__ void bn_normalize_v##W(const int n, const int C, const int S, const Dtype* x,     \
                                    const Mtype* mean, const Mtype* inv_std, Dtype* y) {       \
    bn_normalize<W>(n, C, S, x, mean, inv_std, y);                                             \
  }                                                                                            \
  __global__ void bn_backward_v##W(const int n, const int C, const int S, const Dtype* dy,     \
                                   const Dtype* x, const Mtype* mean, const Mtype* inv_std,    \
                                   const Mtype* mean_dy, const Mtype* mean_dyxc, Dtype* dx) {  \
    bn_backward<W>(n, C, S, dy, x, mean, inv_std, mean_dy, mean_dyxc, dx);                     \
  }                                                                                            \
  __global__ void bn_chain_forward_v##W(const int n, const int C, const int S, const Dtype* x,  \
                                        const Mtype* mean, const Mtype* inv_std,                \
                                        const Dtype* gamma, const Dtype* beta, const int has_s, \
                                        const int has_b, const int relu, Dtype* xhat, Dtype* y) { \
    bn_chain_forward<W>(n, C, S, x, mean, inv_std, gamma, beta, has_s, has_b, relu, xhat, y);   \
  }                                                                                            \
  __global__ void __launch_bounds__(REDUCE_THREADS)                                            \
      bn_chain_reduce_v##W(const int chunks, const int num, const int C, const int S,          \
                           const Dtype* dy, const Dtype* y, const Dtype* xhat, const int relu,  \
                           const Dtype* gamma, const int has_s, const Mtype* inv_std,           \
                           const int write_dx, Dtype* dx, Mtype* part) {                        \
    bn_chain_reduce<W>(chunks, num, C, S, dy, y, xhat, relu, gamma, has_s, inv_std, write_dx, dx, part); \
  }                                                                                            \
  __global__ void bn_chain_backward_v##W(const int n, const int C, const int S,                \
                                         const Dtype* dy, const Dtype* y, const Dtype* xhat,    \
                                         const int relu, const Mtype* coef, const Mtype* a,     \
                                         const Mtype* b, Dtype* dx) {                           \
    bn_chain_backward<W>(n, C, S, dy, y, xhat, relu, coef, a, b, dx);                          \
  }
BN_ENTRIES(1)
BN_ENTRIES(4)
