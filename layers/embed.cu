// Embed over M indices and N outputs; weight is (K, N). Out-of-range indices read as zero rows
// and take no gradient (the CPU path raises on them; here we only avoid touching bad memory).

__global__ void embed_forward(const int n, const int N, const int K, const Dtype* index,
                              const Dtype* weight, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int m = i / N;
    const int row = static_cast<int>(index[m]);
    y[i] = (row >= 0 && row < K) ? weight[row * N + (i - m * N)] : Dtype(0);
  }
}

// dW[index[m], d] += dy[m, d]; repeated indices collide, hence atomicAdd.
__global__ void embed_backward(const int n, const int N, const int K, const Dtype* index,
                               const Dtype* dy, Dtype* dweight) {
  CUDA_KERNEL_LOOP(i, n) {
    const int m = i / N;
    const int row = static_cast<int>(index[m]);
    if (row >= 0 && row < K) {
      atomicAdd(dweight + row * N + (i - m * N), dy[i]);
    }
  }
}
