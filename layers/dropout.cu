// Dropout with a counter-based generator: the uint32 draw for element i is a hash of
// (seed, counter, i), so a forward needs no generator state on the device and identical
// (seed, counter) pairs give identical masks. Dtype and CUDA_KERNEL_LOOP come from the prelude.

// A 32-bit finalizer with good avalanche (xor-shift / multiply rounds).
__device__ __forceinline__ unsigned int dropout_mix(unsigned int x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ unsigned int dropout_draw(unsigned int seed, unsigned int counter,
                                                     unsigned int i) {
  const unsigned int key = dropout_mix(seed ^ 0x9e3779b9U) ^ dropout_mix(counter * 0x85ebca6bU + 0x632be5abU);
  return dropout_mix(dropout_mix(i ^ key) + key);
}

// mask[i] = draw; y = x * (draw > thres) * scale
__global__ void dropout_forward(const int n, const Dtype* x, const unsigned int seed,
                                const unsigned int counter, const unsigned int thres,
                                unsigned int* mask, const Dtype scale, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const unsigned int r = dropout_draw(seed, counter, static_cast<unsigned int>(i));
    mask[i] = r;
    y[i] = r > thres ? x[i] * scale : Dtype(0);
  }
}

__global__ void dropout_backward(const int n, const Dtype* dy, const unsigned int* mask,
                                 const unsigned int thres, const Dtype scale, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) { dx[i] = mask[i] > thres ? dy[i] * scale : Dtype(0); }
}

// y = x * scale (the TEST phase; x may equal y)
__global__ void dropout_scale(const int n, const Dtype* x, const Dtype scale, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = x[i] * scale; }
}
