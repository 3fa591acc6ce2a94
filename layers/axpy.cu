// Axpy: top = a[r] * x + y over rows r = (num, channel) of S elements each.

__global__ void axpy_forward(const int n, const int S, const Dtype* a, const Dtype* x,
                             const Dtype* y, Dtype* out) {
  CUDA_KERNEL_LOOP(i, n) {
    out[i] = a[i / S] * x[i] + y[i];
  }
}

__global__ void axpy_x_backward(const int n, const int S, const Dtype* a, const Dtype* dtop,
                                Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = a[i / S] * dtop[i];
  }
}

// da[r] = sum_s dtop[r, s] * x[r, s]: one block of 256 threads per row (grid-stride over rows),
// reads coalesced along s, a shared-memory tree reduction.
__global__ void axpy_scale_backward(const int rows, const int S, const Dtype* dtop, const Dtype* x,
                                    Dtype* da) {
  __shared__ Dtype part[256];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const Dtype* g = dtop + (long long)r * S;
    const Dtype* v = x + (long long)r * S;
    Dtype acc = 0;
    for (int s = threadIdx.x; s < S; s += blockDim.x) acc += g[s] * v[s];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) da[r] = part[0];
    __syncthreads();
  }
}
