// Bias: y[o, d, i] = x[o, d, i] + b[d] over a (outer, dim, inner) view.

__global__ void bias_forward(const int n, const int dim, const int inner, const Dtype* x,
                             const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = x[i] + b[(i / inner) % dim];
  }
}
