// MVN over a (rows, dim) view; per-row vectors are indexed by r = i / dim. Arithmetic in Mtype
// (to_m / from_m from the backend prelude).

// y = x - mean[r]; x and y may alias.
__global__ void mvn_sub_row(const int n, const int dim, const Dtype* x, const Dtype* mean,
                            Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = from_m(to_m(x[i]) - to_m(mean[i / dim]));
  }
}

// y /= std[r]
__global__ void mvn_div_row(const int n, const int dim, const Dtype* std, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = from_m(to_m(y[i]) / to_m(std[i / dim]));
  }
}

// dx = (dy - inv_dim * (sum_dy[r] + y * sum_dyy[r])) / std[r]; dy and dx may alias.
__global__ void mvn_backward(const int n, const int dim, const Dtype* dy, const Dtype* y,
                             const Dtype* sum_dy, const Dtype* sum_dyy, const Dtype* std,
                             const Mtype inv_dim, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / dim;
    dx[i] = from_m((to_m(dy[i]) - Mtype(inv_dim) * (to_m(sum_dy[r]) + to_m(y[i]) * to_m(sum_dyy[r]))) / to_m(std[r]));
  }
}
