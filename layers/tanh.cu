// TanH. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

__global__ void tanh_forward(const int n, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = tanh(x[i]); }
}

__global__ void tanh_backward(const int n, const Dtype* dy, const Dtype* y, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype t = y[i];
    dx[i] = dy[i] * (Dtype(1) - t * t);
  }
}
