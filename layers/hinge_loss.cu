// HingeLoss on (num, dim) scores and num labels. Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come
// from the prelude; the margins and sums are in Mtype.
#include "loss_layer.cuh"

// d[n, j] = max(0, 1 + s*x[n, j]) with s = -1 at j == label_n, +1 elsewhere, fused with the block
// sums of d (or d^2 when squared) into partials[blockIdx.x] (LossLayer's first reduction stage;
// launch with LOSS_REDUCE_THREADS threads). A label outside [0, dim) or not a number gives NaN margins and sets the
// bad-label flag status[1] = 1, status[2] = label (LossLayer.gpu_status).
__global__ void hinge_forward(const int count, const Dtype* x, const Dtype* label, const int dim,
                              const int squared, Dtype* d, Mtype* partials, Dtype* status) {
  __shared__ Mtype smem[LOSS_REDUCE_THREADS];
  Mtype acc = 0;
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    int l;
    const bool ok = loss_label_int(label[n], &l);
    Mtype m;
    if (!ok || l < 0 || l >= dim) {
      m = Mtype(__int_as_float(0x7fffffff));
      status[1] = 1;
      status[2] = label[n];
    } else {
      m = max(Mtype(0), Mtype(1) + ((j == l) ? -to_m(x[i]) : to_m(x[i])));
    }
    d[i] = from_m(m);
    acc += squared ? m * m : m;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx = s*sign(d)*w/norm (L1) or 2*s*d*w/norm (squared, L2); w = top_diff[0], norm = norm[0].
__global__ void hinge_backward(const int count, const Dtype* d, const Dtype* label, const int dim,
                               const int squared, const Dtype* top_diff, const Dtype* norm, Dtype* dx) {
  const Mtype scale = to_m(top_diff[0]) / to_m(norm[0]);
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    int l;
    loss_label_int(label[n], &l);
    const Mtype v = (j == l) ? -to_m(d[i]) : to_m(d[i]);
    if (squared) {
      dx[i] = from_m(Mtype(2) * v * scale);
    } else {
      dx[i] = from_m(Mtype((Mtype(0) < v) - (v < Mtype(0))) * scale);
    }
  }
}
