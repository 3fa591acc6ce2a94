// SmoothL1Loss: one fused pass d = w_in * (p - t) (kept for backward) with the block sums of
// w_out * f(d) (LossLayer's first reduction stage); backward one pass per bottom.
#include "loss_layer.cuh"

// Launch with LOSS_REDUCE_THREADS threads per block; w_in / w_out are read only when weighted.
__global__ void smooth_l1_forward(const int n, const Dtype* p, const Dtype* t, const Dtype* w_in,
                                  const Dtype* w_out, const int weighted, const Dtype sigma2,
                                  Dtype* diff, Dtype* partials) {
  __shared__ Dtype smem[LOSS_REDUCE_THREADS];
  Dtype acc = 0;
  CUDA_KERNEL_LOOP(i, n) {
    Dtype d = p[i] - t[i];
    if (weighted) d *= w_in[i];
    diff[i] = d;
    const Dtype a = fabs(d);
    Dtype f = a < Dtype(1) / sigma2 ? Dtype(0.5) * sigma2 * d * d : a - Dtype(0.5) / sigma2;
    if (weighted) f *= w_out[i];
    acc += f;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx = sign * top_diff[0] / norm[0] * f'(d) (* w_in * w_out).
__global__ void smooth_l1_backward(const int n, const Dtype sign, const Dtype* top_diff,
                                   const Dtype* norm, const Dtype* diff, const Dtype* w_in,
                                   const Dtype* w_out, const int weighted, const Dtype sigma2,
                                   Dtype* dx) {
  const Dtype alpha = sign * top_diff[0] / norm[0];
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype d = diff[i];
    Dtype g = fabs(d) < Dtype(1) / sigma2 ? sigma2 * d : Dtype((Dtype(0) < d) - (d < Dtype(0)));
    if (weighted) g *= w_in[i] * w_out[i];
    dx[i] = alpha * g;
  }
}
