// Softmax over the channel axis of an (outer, channels, inner) array. Dtype and
// CUDA_KERNEL_LOOP come from the backend prelude. One thread per (outer, inner) position for
// the reductions; one thread per element for the broadcasts.

__global__ void softmax_channel_max(const int outer, const int channels, const int inner,
                                    const Dtype* x, Dtype* out) {
  CUDA_KERNEL_LOOP(p, outer * inner) {
    const int o = p / inner, s = p - o * inner;
    const Dtype* row = x + o * channels * inner + s;
    Dtype m = row[0];
    for (int c = 1; c < channels; ++c) m = max(m, row[c * inner]);
    out[p] = m;
  }
}

// y(o, c, s) -= v(o, s)
__global__ void softmax_channel_subtract(const int count, const int channels, const int inner,
                                         const Dtype* v, Dtype* y) {
  CUDA_KERNEL_LOOP(i, count) {
    const int o = i / (channels * inner), s = i % inner;
    y[i] -= v[o * inner + s];
  }
}

__global__ void softmax_channel_sum(const int outer, const int channels, const int inner,
                                    const Dtype* x, Dtype* out) {
  CUDA_KERNEL_LOOP(p, outer * inner) {
    const int o = p / inner, s = p - o * inner;
    const Dtype* row = x + o * channels * inner + s;
    Dtype acc = 0;
    for (int c = 0; c < channels; ++c) acc += row[c * inner];
    out[p] = acc;
  }
}

// y(o, c, s) /= v(o, s)
__global__ void softmax_channel_div(const int count, const int channels, const int inner,
                                    const Dtype* v, Dtype* y) {
  CUDA_KERNEL_LOOP(i, count) {
    const int o = i / (channels * inner), s = i % inner;
    y[i] /= v[o * inner + s];
  }
}

// out(o, s) = sum_c a(o, c, s) * b(o, c, s)
__global__ void softmax_channel_dot(const int outer, const int channels, const int inner,
                                    const Dtype* a, const Dtype* b, Dtype* out) {
  CUDA_KERNEL_LOOP(p, outer * inner) {
    const int o = p / inner, s = p - o * inner;
    const int base = o * channels * inner + s;
    Dtype acc = 0;
    for (int c = 0; c < channels; ++c) acc += a[base + c * inner] * b[base + c * inner];
    out[p] = acc;
  }
}
