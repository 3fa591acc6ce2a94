// Scale: y[o, d, i] = x[o, d, i] * s[d] (+ b[d]) over a (outer, dim, inner) view.

__global__ void scale_forward(const int n, const int dim, const int inner, const Dtype* x,
                              const Dtype* s, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = x[i] * s[(i / inner) % dim];
  }
}

__global__ void scale_bias_forward(const int n, const int dim, const int inner, const Dtype* x,
                                   const Dtype* s, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int d = (i / inner) % dim;
    y[i] = x[i] * s[d] + b[d];
  }
}
