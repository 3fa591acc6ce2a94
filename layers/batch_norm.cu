// BatchNorm over a (num, C, S) view; per-channel vectors are indexed by c = (i / S) % C.

// tmp = (x - mean[c])^2
__global__ void bn_sq_dev(const int n, const int C, const int S, const Dtype* x,
                          const Dtype* mean, Dtype* tmp) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype d = x[i] - mean[(i / S) % C];
    tmp[i] = d * d;
  }
}

// y = (x - mean[c]) / std[c]; x and y may alias.
__global__ void bn_normalize(const int n, const int C, const int S, const Dtype* x,
                             const Dtype* mean, const Dtype* std, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / S) % C;
    y[i] = (x[i] - mean[c]) / std[c];
  }
}

// dx = dy / std[c] (global statistics: the statistics are constants)
__global__ void bn_div_channel(const int n, const int C, const int S, const Dtype* dy,
                               const Dtype* std, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = dy[i] / std[(i / S) % C];
  }
}

// dx = (dy - sum_dy[c]/m - y * sum_dyy[c]/m) / std[c]; dy and dx may alias.
__global__ void bn_backward(const int n, const int C, const int S, const Dtype* dy,
                            const Dtype* y, const Dtype* sum_dy, const Dtype* sum_dyy,
                            const Dtype* std, const Dtype inv_m, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / S) % C;
    dx[i] = (dy[i] - inv_m * sum_dy[c] - y[i] * inv_m * sum_dyy[c]) / std[c];
  }
}
