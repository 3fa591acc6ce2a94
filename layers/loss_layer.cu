// LossLayer's device reduction: per-item losses -> one partial sum per block -> top[0].
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; the sums are in
// Mtype, and so are the per-block partials (a float buffer for the half types). Launch with LOSS_REDUCE_THREADS threads.
#include "loss_layer.cuh"

// Block b writes partials[b] = sum of its items' loss and partials[gridDim.x + b] = sum of their
// valid flags (when has_valid).
__global__ void loss_partials(const int n, const Dtype* loss, const Dtype* valid, const int has_valid,
                              Mtype* partials) {
  __shared__ Mtype smem[LOSS_REDUCE_THREADS];
  Mtype l = 0, c = 0;
  CUDA_KERNEL_LOOP(i, n) {
    l += to_m(loss[i]);
    if (has_valid) c += to_m(valid[i]);
  }
  l = loss_block_sum(l, smem);
  if (has_valid) c = loss_block_sum(c, smem);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = l;
    if (has_valid) partials[gridDim.x + blockIdx.x] = c;
  }
}

// One block: norm = max(1, use_valid ? sum(partials[blocks:2*blocks]) : fixed_norm);
// top[0] = scale * sum(partials[:blocks]) / norm; status[0] = norm (read by backward kernels).
__global__ void loss_finish(const int blocks, const Mtype* partials, const int use_valid,
                            const Mtype fixed_norm, const Mtype scale, Dtype* top, Dtype* status) {
  __shared__ Mtype smem[LOSS_REDUCE_THREADS];
  Mtype l = 0, c = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) {
    l += partials[i];
    if (use_valid) c += partials[blocks + i];
  }
  l = loss_block_sum(l, smem);
  if (use_valid) c = loss_block_sum(c, smem);
  if (threadIdx.x == 0) {
    const Mtype norm = max(Mtype(1), use_valid ? c : Mtype(fixed_norm));
    top[0] = from_m(Mtype(scale) * l / norm);
    status[0] = from_m(norm);
  }
}
