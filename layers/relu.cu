// ReLU with an optional leaky slope. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

__global__ void relu_forward(const int n, const Dtype* x, Dtype* y, const Dtype slope) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype v = x[i];
    y[i] = v > 0 ? v : v * slope;
  }
}

__global__ void relu_backward(const int n, const Dtype* dy, const Dtype* x, Dtype* dx,
                              const Dtype slope) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = x[i] > 0 ? dy[i] : dy[i] * slope;
  }
}
