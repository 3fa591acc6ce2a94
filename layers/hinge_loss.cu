// HingeLoss on (num, dim) scores and num labels. Dtype and CUDA_KERNEL_LOOP come from the prelude.
#include "loss_layer.cuh"

// d[n, j] = max(0, 1 + s*x[n, j]) with s = -1 at j == label_n, +1 elsewhere, fused with the block
// sums of d (or d^2 when squared) into partials[blockIdx.x] (LossLayer's first reduction stage;
// launch with LOSS_REDUCE_THREADS threads). A label outside [0, dim) or not a number gives NaN margins and sets the
// bad-label flag status[1] = 1, status[2] = label (LossLayer.gpu_status).
__global__ void hinge_forward(const int count, const Dtype* x, const Dtype* label, const int dim,
                              const int squared, Dtype* d, Dtype* partials, Dtype* status) {
  __shared__ Dtype smem[LOSS_REDUCE_THREADS];
  Dtype acc = 0;
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    int l;
    const bool ok = loss_label_int(label[n], &l);
    Dtype m;
    if (!ok || l < 0 || l >= dim) {
      m = Dtype(__int_as_float(0x7fffffff));
      status[1] = 1;
      status[2] = label[n];
    } else {
      m = max(Dtype(0), Dtype(1) + ((j == l) ? -x[i] : x[i]));
    }
    d[i] = m;
    acc += squared ? m * m : m;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx = s*sign(d)*w/norm (L1) or 2*s*d*w/norm (squared, L2); w = top_diff[0], norm = norm[0].
__global__ void hinge_backward(const int count, const Dtype* d, const Dtype* label, const int dim,
                               const int squared, const Dtype* top_diff, const Dtype* norm, Dtype* dx) {
  const Dtype scale = top_diff[0] / norm[0];
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    int l;
    loss_label_int(label[n], &l);
    const Dtype v = (j == l) ? -d[i] : d[i];
    if (squared) {
      dx[i] = Dtype(2) * v * scale;
    } else {
      dx[i] = Dtype((Dtype(0) < v) - (v < Dtype(0))) * scale;
    }
  }
}
