// SmoothL1Loss: one fused pass d = w_in * (p - t) (kept for backward) with the block sums of
// w_out * f(d) (LossLayer's first reduction stage); backward one pass per bottom. Math and sums in
// Mtype (to_m / from_m from the backend prelude).
#include "loss_layer.cuh"

// Launch with LOSS_REDUCE_THREADS threads per block; w_in / w_out are read only when weighted.
__global__ void smooth_l1_forward(const int n, const Dtype* p, const Dtype* t, const Dtype* w_in,
                                  const Dtype* w_out, const int weighted, const Mtype sigma2,
                                  Dtype* diff, Mtype* partials) {
  __shared__ Mtype smem[LOSS_REDUCE_THREADS];
  const Mtype s2 = Mtype(sigma2);
  Mtype acc = 0;
  CUDA_KERNEL_LOOP(i, n) {
    Mtype d = to_m(p[i]) - to_m(t[i]);
    if (weighted) d *= to_m(w_in[i]);
    diff[i] = from_m(d);
    const Mtype a = fabs(d);
    Mtype f = a < Mtype(1) / s2 ? Mtype(0.5) * s2 * d * d : a - Mtype(0.5) / s2;
    if (weighted) f *= to_m(w_out[i]);
    acc += f;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx = sign * top_diff[0] / norm[0] * f'(d) (* w_in * w_out).
__global__ void smooth_l1_backward(const int n, const Mtype sign, const Dtype* top_diff,
                                   const Dtype* norm, const Dtype* diff, const Dtype* w_in,
                                   const Dtype* w_out, const int weighted, const Mtype sigma2,
                                   Dtype* dx) {
  const Mtype alpha = Mtype(sign) * to_m(top_diff[0]) / to_m(norm[0]);
  const Mtype s2 = Mtype(sigma2);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype d = to_m(diff[i]);
    Mtype g = fabs(d) < Mtype(1) / s2 ? s2 * d : Mtype((Mtype(0) < d) - (d < Mtype(0)));
    if (weighted) g *= to_m(w_in[i]) * to_m(w_out[i]);
    dx[i] = from_m(alpha * g);
  }
}
