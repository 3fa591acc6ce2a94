// EuclideanLoss: one fused pass diff = a - b with the block sums of diff^2 (LossLayer's first
// reduction stage). Dtype and CUDA_KERNEL_LOOP come from the backend prelude.
#include "loss_layer.cuh"

// diff[i] = a[i] - b[i]; partials[blockIdx.x] = the block's sum of diff^2. Launch with
// LOSS_REDUCE_THREADS threads per block; LossLayer.gpu_finish adds the partials.
__global__ void euclidean_forward(const int n, const Dtype* a, const Dtype* b, Dtype* diff,
                                  Dtype* partials) {
  __shared__ Dtype smem[LOSS_REDUCE_THREADS];
  Dtype acc = 0;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype d = a[i] - b[i];
    diff[i] = d;
    acc += d * d;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx[i] = sign * top_diff[0] / norm[0] * diff[i] (norm: the batch size LossLayer stored).
__global__ void euclidean_backward(const int n, const Dtype sign, const Dtype* top_diff, const Dtype* norm,
                                   const Dtype* diff, Dtype* dx) {
  const Dtype alpha = sign * top_diff[0] / norm[0];
  CUDA_KERNEL_LOOP(i, n) { dx[i] = alpha * diff[i]; }
}
