// Softmax over the channel axis of an (outer, channels, inner) array. Dtype, Mtype, to_m, from_m and
// CUDA_KERNEL_LOOP come from the backend prelude; maxima, exponentials and sums are in Mtype. One thread per (outer, inner) position,
// n = outer * inner; consecutive threads read consecutive inner positions.

// y(o, :, s) = exp(x - max) / sum exp(x - max). In place (y == x) is fine.
__global__ void softmax_forward(const int n, const int channels, const int inner, const Dtype* x,
                                Dtype* y) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int base = o * channels * inner + s;
    Mtype m = to_m(x[base]);
    for (int c = 1; c < channels; ++c) m = max(m, to_m(x[base + c * inner]));
    Mtype sum = 0;
    for (int c = 0; c < channels; ++c) {
      const Mtype e = exp(to_m(x[base + c * inner]) - m);
      y[base + c * inner] = from_m(e);
      sum += e;
    }
    for (int c = 0; c < channels; ++c) y[base + c * inner] = from_m(to_m(y[base + c * inner]) / sum);
  }
}

// dx(o, c, s) = (dy - sum_k dy(o, k, s) * y(o, k, s)) * y(o, c, s). In place (dx == dy) is fine.
__global__ void softmax_backward(const int n, const int channels, const int inner, const Dtype* y,
                                 const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int base = o * channels * inner + s;
    Mtype dot = 0;
    for (int c = 0; c < channels; ++c) dot += to_m(dy[base + c * inner]) * to_m(y[base + c * inner]);
    for (int c = 0; c < channels; ++c) {
      const int i = base + c * inner;
      dx[i] = from_m((to_m(dy[i]) - dot) * to_m(y[i]));
    }
  }
}

// inner == 1 (classifier outputs): one warp per contiguous row of `channels` values, n = rows * 32
// threads (whole warps, so every lane of a warp runs each grid-stride step together). The xor
// butterflies give every lane the same, fixed-order result.
__device__ __forceinline__ Mtype softmax_warp_max(Mtype v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ Mtype softmax_warp_sum(Mtype v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void softmax_forward_rows(const int n, const int channels, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(t, n) {
    const int lane = t % 32;
    const Dtype* xr = x + (t / 32) * channels;
    Dtype* yr = y + (t / 32) * channels;
    Mtype m = to_m(xr[0]);
    for (int c = lane; c < channels; c += 32) m = max(m, to_m(xr[c]));
    m = softmax_warp_max(m);
    Mtype sum = 0;
    for (int c = lane; c < channels; c += 32) {
      const Mtype e = exp(to_m(xr[c]) - m);
      yr[c] = from_m(e);
      sum += e;
    }
    sum = softmax_warp_sum(sum);
    for (int c = lane; c < channels; c += 32) yr[c] = from_m(to_m(yr[c]) / sum);
  }
}

__global__ void softmax_backward_rows(const int n, const int channels, const Dtype* y, const Dtype* dy,
                                      Dtype* dx) {
  CUDA_KERNEL_LOOP(t, n) {
    const int lane = t % 32, base = (t / 32) * channels;
    Mtype dot = 0;
    for (int c = lane; c < channels; c += 32) dot += to_m(dy[base + c]) * to_m(y[base + c]);
    dot = softmax_warp_sum(dot);
    for (int c = lane; c < channels; c += 32) dx[base + c] = from_m((to_m(dy[base + c]) - dot) * to_m(y[base + c]));
  }
}
