// LRN on an (N, C, H, W) array, one thread per element; windows of odd `size` centred on the
// element, zero beyond the edges. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

// scale = base + coeff * sum of x^2 over the channels [c - pre, c + pre]
__global__ void lrn_scale_across(const int count, const Dtype* x, const int channels,
                                 const int height, const int width, const int size,
                                 const Dtype base, const Dtype coeff, Dtype* scale) {
  CUDA_KERNEL_LOOP(i, count) {
    const int hw = height * width;
    const int s = i % hw;
    const int c = (i / hw) % channels;
    const int n = i / (hw * channels);
    const int pre = (size - 1) / 2;
    const int lo = max(c - pre, 0), hi = min(c + pre, channels - 1);
    const Dtype* col = x + n * channels * hw + s;
    Dtype acc = 0;
    for (int j = lo; j <= hi; ++j) acc += col[j * hw] * col[j * hw];
    scale[i] = base + coeff * acc;
  }
}

// scale = base + coeff * sum of x^2 over the size x size spatial window
__global__ void lrn_scale_within(const int count, const Dtype* x, const int channels,
                                 const int height, const int width, const int size,
                                 const Dtype base, const Dtype coeff, Dtype* scale) {
  CUDA_KERNEL_LOOP(i, count) {
    const int w = i % width;
    const int h = (i / width) % height;
    const int pre = (size - 1) / 2;
    const Dtype* plane = x + (i / (width * height)) * height * width;
    const int h0 = max(h - pre, 0), h1 = min(h + pre, height - 1);
    const int w0 = max(w - pre, 0), w1 = min(w + pre, width - 1);
    Dtype acc = 0;
    for (int hh = h0; hh <= h1; ++hh)
      for (int ww = w0; ww <= w1; ++ww) {
        const Dtype v = plane[hh * width + ww];
        acc += v * v;
      }
    scale[i] = base + coeff * acc;
  }
}

// y = x * scale^neg_beta
__global__ void lrn_output(const int count, const Dtype* x, const Dtype* scale,
                           const Dtype neg_beta, Dtype* y) {
  CUDA_KERNEL_LOOP(i, count) { y[i] = x[i] * pow(scale[i], neg_beta); }
}

// dx = dy * scale^neg_beta - ratio * x * sum over the channel window of dy * y / scale
__global__ void lrn_diff_across(const int count, const Dtype* x, const Dtype* y,
                                const Dtype* dy, const Dtype* scale, const int channels,
                                const int height, const int width, const int size,
                                const Dtype neg_beta, const Dtype ratio, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int hw = height * width;
    const int s = i % hw;
    const int c = (i / hw) % channels;
    const int n = i / (hw * channels);
    const int pre = (size - 1) / 2;
    const int lo = max(c - pre, 0), hi = min(c + pre, channels - 1);
    const int base = n * channels * hw + s;
    Dtype acc = 0;
    for (int j = lo; j <= hi; ++j) {
      const int q = base + j * hw;
      acc += dy[q] * y[q] / scale[q];
    }
    dx[i] = dy[i] * pow(scale[i], neg_beta) - ratio * x[i] * acc;
  }
}

// dx = dy * scale^neg_beta - ratio * x * sum over the spatial window of dy * y / scale
__global__ void lrn_diff_within(const int count, const Dtype* x, const Dtype* y,
                                const Dtype* dy, const Dtype* scale, const int channels,
                                const int height, const int width, const int size,
                                const Dtype neg_beta, const Dtype ratio, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int w = i % width;
    const int h = (i / width) % height;
    const int pre = (size - 1) / 2;
    const int plane = (i / (width * height)) * height * width;
    const int h0 = max(h - pre, 0), h1 = min(h + pre, height - 1);
    const int w0 = max(w - pre, 0), w1 = min(w + pre, width - 1);
    Dtype acc = 0;
    for (int hh = h0; hh <= h1; ++hh)
      for (int ww = w0; ww <= w1; ++ww) {
        const int q = plane + hh * width + ww;
        acc += dy[q] * y[q] / scale[q];
      }
    dx[i] = dy[i] * pow(scale[i], neg_beta) - ratio * x[i] * acc;
  }
}
