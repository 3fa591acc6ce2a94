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

// inner == 1 (classifier outputs): one warp per contiguous row of `channels` values, n = rows * 32
// threads (whole warps, so every lane of a warp runs each grid-stride step together). The xor
// butterflies give every lane the same, fixed-order result.
__device__ __forceinline__ Dtype softmax_warp_max(Dtype v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ Dtype softmax_warp_sum(Dtype v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void softmax_forward_rows(const int n, const int channels, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(t, n) {
    const int lane = t % 32;
    const Dtype* xr = x + (t / 32) * channels;
    Dtype* yr = y + (t / 32) * channels;
    Dtype m = xr[0];
    for (int c = lane; c < channels; c += 32) m = max(m, xr[c]);
    m = softmax_warp_max(m);
    Dtype sum = 0;
    for (int c = lane; c < channels; c += 32) {
      const Dtype e = exp(xr[c] - m);
      yr[c] = e;
      sum += e;
    }
    sum = softmax_warp_sum(sum);
    for (int c = lane; c < channels; c += 32) yr[c] /= sum;
  }
}

__global__ void softmax_backward_rows(const int n, const int channels, const Dtype* y, const Dtype* dy,
                                      Dtype* dx) {
  CUDA_KERNEL_LOOP(t, n) {
    const int lane = t % 32, base = (t / 32) * channels;
    Dtype dot = 0;
    for (int c = lane; c < channels; c += 32) dot += dy[base + c] * y[base + c];
    dot = softmax_warp_sum(dot);
    for (int c = lane; c < channels; c += 32) dx[base + c] = (dy[base + c] - dot) * y[base + c];
  }
}
