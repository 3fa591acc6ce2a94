// Block-wide sums for the per-channel reductions (math_functions.cu's channel_reduce, the
// BatchNorm chain's in layers/batch_norm.cu): blocks of REDUCE_THREADS threads (math_functions.py's
// REDUCE_THREADS). Included after the backend prelude (Dtype, Mtype): sums are in Mtype, so a half
// kernel's partial sums stay float.
#pragma once

#define REDUCE_THREADS 256

extern "C++" {
// Sum of two values over the block; the result is valid in thread 0. blockDim.x == REDUCE_THREADS.
__device__ __forceinline__ void block_sum2(Mtype& s0, Mtype& s1) {
  __shared__ Mtype buf[2][REDUCE_THREADS / 32];
  for (int off = 16; off > 0; off >>= 1) {
    s0 += __shfl_down_sync(0xffffffffu, s0, off);
    s1 += __shfl_down_sync(0xffffffffu, s1, off);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    buf[0][warp] = s0;
    buf[1][warp] = s1;
  }
  __syncthreads();
  if (warp == 0) {
    s0 = lane < REDUCE_THREADS / 32 ? buf[0][lane] : Mtype(0);
    s1 = lane < REDUCE_THREADS / 32 ? buf[1][lane] : Mtype(0);
    for (int off = 16; off > 0; off >>= 1) {
      s0 += __shfl_down_sync(0xffffffffu, s0, off);
      s1 += __shfl_down_sync(0xffffffffu, s1, off);
    }
  }
}

}  // extern "C++"
