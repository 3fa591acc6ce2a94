// Axpy: top = a[r] * x + y over rows r = (num, channel) of S elements each. Products and sums in
// Mtype (to_m / from_m from the backend prelude), so is the shared memory of the row sums.

__global__ void axpy_forward(const int n, const int S, const Dtype* a, const Dtype* x,
                             const Dtype* y, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    out[i] = from_m(to_m(a[i / S]) * to_m(x[i]) + to_m(y[i]));
  }
}

__global__ void axpy_x_backward(const int n, const int S, const Dtype* a, const Dtype* dtop,
                                Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = from_m(to_m(a[i / S]) * to_m(dtop[i]));
  }
}

// The whole backward in one pass over dtop (and x for da): da[r] = sum_s dtop[r, s] x[r, s],
// dx = a[r] dtop, dy = dtop (each output optional, flags uniform over the launch). Block (tx, ty):
// ty rows at a time, tx lanes along each row, coalesced. tx == 32: a warp per row and its sum a
// xor butterfly; tx a multiple of 32 (ty == 1): the warps' sums then meet in shared memory.
// Every thread runs the same number of row steps, so whole warps take part in each shuffle.
__global__ void axpy_backward(const int rows, const int S, const int do_da, const int do_dx, const int do_dy,
                              const Dtype* a, const Dtype* x, const Dtype* dtop, Dtype* da, Dtype* dx,
                              Dtype* dy) {
  __shared__ Mtype part[32];
  for (int r0 = blockIdx.x * blockDim.y; r0 < rows; r0 += gridDim.x * blockDim.y) {
    const int r = r0 + threadIdx.y;
    const bool live = r < rows;
    Mtype acc = 0;
    if (live) {
      const long long base = (long long)r * S;
      const Mtype ar = do_dx ? to_m(a[r]) : Mtype(0);
#pragma unroll 4
      for (int s = threadIdx.x; s < S; s += blockDim.x) {
        const Dtype g = dtop[base + s];
        if (do_da) acc += to_m(g) * to_m(x[base + s]);
        if (do_dx) dx[base + s] = from_m(ar * to_m(g));
        if (do_dy) dy[base + s] = g;
      }
    }
    if (!do_da) continue;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (blockDim.x == 32) {
      if (threadIdx.x == 0 && live) da[r] = from_m(acc);
      continue;
    }
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0 && live) {
      Mtype t = 0;
      for (int w = 0; w < (int)blockDim.x / 32; ++w) t += part[w];
      da[r] = from_m(t);
    }
    __syncthreads();
  }
}
