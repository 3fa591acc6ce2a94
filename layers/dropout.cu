// Dropout's device generator: Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11), keyed by (seed, stream) and counting over (i, offset, 0, 0). The offset lives in
// device memory and dropout_advance bumps it after each forward, so a CUDA graph replay draws a fresh
// mask without any host write. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

__host__ __device__ __forceinline__ unsigned int philox_mulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}

// First 32-bit word of Philox-4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).
__host__ __device__ __forceinline__ unsigned int philox4x32_10(unsigned int c0, unsigned int c1,
                                                               unsigned int c2, unsigned int c3,
                                                               unsigned int k0, unsigned int k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9U;
      k1 += 0xBB67AE85U;
    }
    const unsigned int hi0 = philox_mulhi(0xD2511F53U, c0), lo0 = 0xD2511F53U * c0;
    const unsigned int hi1 = philox_mulhi(0xCD9E8D57U, c2), lo1 = 0xCD9E8D57U * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return c0;
}

// mask[i] = draw > thres (keep); y[i] = keep ? x[i] * scale : 0. x may equal y.
__global__ void dropout_forward_train(const int n, const Dtype* x, const unsigned int* offset,
                                      const unsigned int seed, const unsigned int stream,
                                      const unsigned int thres, const Mtype scale, Dtype* mask, Dtype* y) {
  const unsigned int off = *offset;
  CUDA_KERNEL_LOOP(i, n) {
    const bool keep = philox4x32_10(static_cast<unsigned int>(i), off, 0U, 0U, seed, stream) > thres;
    mask[i] = keep ? Dtype(1) : Dtype(0);
    y[i] = keep ? from_m(to_m(x[i]) * Mtype(scale)) : Dtype(0);  // the product in Mtype
  }
}

// One thread: the next forward draws from the next counter block.
__global__ void dropout_advance(unsigned int* offset) { *offset += 1U; }
