// Softmax over the channel axis of an (outer, channels, inner) array. Dtype and
// CUDA_KERNEL_LOOP come from the backend prelude. One thread per (outer, inner) position,
// n = outer * inner; consecutive threads read consecutive inner positions.

// y(o, :, s) = exp(x - max) / sum exp(x - max). In place (y == x) is fine.
__global__ void softmax_forward(const int n, const int channels, const int inner, const Dtype* x,
                                Dtype* y) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int base = o * channels * inner + s;
    Dtype m = x[base];
    for (int c = 1; c < channels; ++c) m = max(m, x[base + c * inner]);
    Dtype sum = 0;
    for (int c = 0; c < channels; ++c) {
      const Dtype e = exp(x[base + c * inner] - m);
      y[base + c * inner] = e;
      sum += e;
    }
    for (int c = 0; c < channels; ++c) y[base + c * inner] /= sum;
  }
}

// dx(o, c, s) = (dy - sum_k dy(o, k, s) * y(o, k, s)) * y(o, c, s). In place (dx == dy) is fine.
__global__ void softmax_backward(const int n, const int channels, const int inner, const Dtype* y,
                                 const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int base = o * channels * inner + s;
    Dtype dot = 0;
    for (int c = 0; c < channels; ++c) dot += dy[base + c * inner] * y[base + c * inner];
    for (int c = 0; c < channels; ++c) {
      const int i = base + c * inner;
      dx[i] = (dy[i] - dot) * y[i];
    }
  }
}
