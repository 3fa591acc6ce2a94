// Sigmoid. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

__global__ void sigmoid_forward(const int n, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = Dtype(0.5) * tanh(Dtype(0.5) * x[i]) + Dtype(0.5);
  }
}

__global__ void sigmoid_backward(const int n, const Dtype* dy, const Dtype* y, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype s = y[i];
    dx[i] = dy[i] * s * (Dtype(1) - s);
  }
}
