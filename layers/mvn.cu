// MVN over a (rows, dim) view; per-row vectors are indexed by r = i / dim.

// y = x - mean[r]; x and y may alias.
__global__ void mvn_sub_row(const int n, const int dim, const Dtype* x, const Dtype* mean,
                            Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = x[i] - mean[i / dim];
  }
}

// y /= std[r]
__global__ void mvn_div_row(const int n, const int dim, const Dtype* std, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] /= std[i / dim];
  }
}

// dx = (dy - inv_dim * (sum_dy[r] + y * sum_dyy[r])) / std[r]; dy and dx may alias.
__global__ void mvn_backward(const int n, const int dim, const Dtype* dy, const Dtype* y,
                             const Dtype* sum_dy, const Dtype* sum_dyy, const Dtype* std,
                             const Dtype inv_dim, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / dim;
    dx[i] = (dy[i] - inv_dim * (sum_dy[r] + y[i] * sum_dyy[r])) / std[r];
  }
}
