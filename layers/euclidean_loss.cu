// EuclideanLoss: one fused pass diff = a - b with the block sums of diff^2 (LossLayer's first
// reduction stage). Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude;
// the arithmetic and the block sums are in Mtype.
#include "loss_layer.cuh"

// diff[i] = a[i] - b[i]; partials[blockIdx.x] = the block's sum of diff^2. Launch with
// LOSS_REDUCE_THREADS threads per block; LossLayer.gpu_finish adds the partials.
__global__ void euclidean_forward(const int n, const Dtype* a, const Dtype* b, Dtype* diff,
                                  Mtype* partials) {
  __shared__ Mtype smem[LOSS_REDUCE_THREADS];
  Mtype acc = 0;
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype d = to_m(a[i]) - to_m(b[i]);
    diff[i] = from_m(d);
    acc += d * d;
  }
  acc = loss_block_sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// dx[i] = sign * top_diff[0] / norm[0] * diff[i] (norm: the batch size LossLayer stored).
__global__ void euclidean_backward(const int n, const Mtype sign, const Dtype* top_diff, const Dtype* norm,
                                   const Dtype* diff, Dtype* dx) {
  const Mtype alpha = Mtype(sign) * to_m(top_diff[0]) / to_m(norm[0]);
  CUDA_KERNEL_LOOP(i, n) { dx[i] = from_m(alpha * to_m(diff[i])); }
}
