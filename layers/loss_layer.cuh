// Block reduction shared by the loss kernels (included by loss_layer.cu and the losses that fuse
// their per-item math with the first reduction stage). Blocks are LOSS_REDUCE_THREADS wide
// (loss_layer.py: REDUCE_THREADS). Dtype comes from the backend prelude.
#ifndef LOSS_LAYER_CUH
#define LOSS_LAYER_CUH

#define LOSS_REDUCE_THREADS 256

// Sum of v over the block, valid in thread 0; every thread of the block must call it.
__device__ Dtype loss_block_sum(Dtype v, Dtype* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int step = LOSS_REDUCE_THREADS / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) smem[threadIdx.x] += smem[threadIdx.x + step];
    __syncthreads();
  }
  const Dtype sum = smem[0];
  __syncthreads();  // smem may be reused by the caller's next reduction
  return sum;
}

#endif  // LOSS_LAYER_CUH
