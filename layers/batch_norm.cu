// BatchNorm over a (num, C, S) view. Per-channel statistics are computed on the device (the
// running sums and their scale factor are never read on the host), so passes can be captured in
// CUDA graphs. The element passes are vectorized by W (vec.cuh).
#include "vec.cuh"

// Global statistics: mean = f * run_mean, var = f * run_var with f = 1 / run_s (0 when run_s == 0).
__global__ void bn_global_stats(const int C, const Dtype* run_mean, const Dtype* run_var,
                                const Dtype* run_s, const Dtype eps, Dtype* mean, Dtype* inv_std) {
  const Dtype f = run_s[0] == Dtype(0) ? Dtype(0) : Dtype(1) / run_s[0];
  CUDA_KERNEL_LOOP(c, C) {
    mean[c] = f * run_mean[c];
    inv_std[c] = Dtype(1) / sqrt(f * run_var[c] + eps);
  }
}

// Batch statistics (mean, biased var) given: inv_std, and the running sums
// run_s = maf * run_s + 1, run_mean = mean + maf * run_mean, run_var = corr * var + maf * run_var.
__global__ void bn_batch_stats(const int C, const Dtype maf, const Dtype corr, const Dtype eps,
                               const Dtype* mean, const Dtype* var, Dtype* run_mean,
                               Dtype* run_var, Dtype* run_s, Dtype* inv_std) {
  CUDA_KERNEL_LOOP(c, C) {
    if (c == 0) run_s[0] = maf * run_s[0] + Dtype(1);
    run_mean[c] = mean[c] + maf * run_mean[c];
    run_var[c] = corr * var[c] + maf * run_var[c];
    inv_std[c] = Dtype(1) / sqrt(var[c] + eps);
  }
}

extern "C++" {
// y = (x - mean[c]) * inv_std[c]; x and y may alias.
template <int W>
__device__ void bn_normalize(const int n, const int C, const int S, const Dtype* x,
                             const Dtype* mean, const Dtype* inv_std, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Dtype m = mean[c], r = inv_std[c];
    Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) v.v[j] = (v.v[j] - m) * r;
    vstore<W>(y, u, v);
  }
}

// Batch statistics backward with xc = x - mean[c], r = inv_std[c]:
// dx = (dy - mean_dy[c] - xc * r^2 * mean_dyxc[c]) * r, where mean_dy = mean(dy) and
// mean_dyxc = mean(dy * xc) over (num, S). dy and dx may alias.
template <int W>
__device__ void bn_backward(const int n, const int C, const int S, const Dtype* dy,
                            const Dtype* x, const Dtype* mean, const Dtype* inv_std,
                            const Dtype* mean_dy, const Dtype* mean_dyxc, Dtype* dx) {
  CUDA_KERNEL_LOOP(u, n) {
    const int c = vchannel<W>(u, C, S);
    const Dtype m = mean[c], r = inv_std[c], a = mean_dy[c], b = r * r * mean_dyxc[c];
    Vec<W> g = vload<W>(dy, u);
    const Vec<W> v = vload<W>(x, u);
#pragma unroll
    for (int j = 0; j < W; ++j) g.v[j] = (g.v[j] - a - (v.v[j] - m) * b) * r;
    vstore<W>(dx, u, g);
  }
}
}  // extern "C++"

#define BN_ENTRIES(W)                                                                          \
  __global__ void bn_normalize_v##W(const int n, const int C, const int S, const Dtype* x,     \
                                    const Dtype* mean, const Dtype* inv_std, Dtype* y) {       \
    bn_normalize<W>(n, C, S, x, mean, inv_std, y);                                             \
  }                                                                                            \
  __global__ void bn_backward_v##W(const int n, const int C, const int S, const Dtype* dy,     \
                                   const Dtype* x, const Dtype* mean, const Dtype* inv_std,    \
                                   const Dtype* mean_dy, const Dtype* mean_dyxc, Dtype* dx) {  \
    bn_backward<W>(n, C, S, dy, x, mean, inv_std, mean_dy, mean_dyxc, dx);                     \
  }
BN_ENTRIES(1)
BN_ENTRIES(4)
