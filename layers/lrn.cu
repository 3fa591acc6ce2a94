// LRN on an (N, C, H, W) array, one thread per element; windows of odd `size` centred on the
// element, zero beyond the edges. Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the
// backend prelude; window sums and powers are in Mtype.

extern "C++" {
// Sum of f(q) over the element indices q of element i's window: the channels [c - pre, c + pre]
// (ACROSS) or the size x size spatial window of its plane (WITHIN).
template <bool ACROSS, class F>
__device__ Mtype window_sum(const int i, const int channels, const int height, const int width,
                            const int size, const F f) {
  const int pre = (size - 1) / 2, hw = height * width;
  Mtype acc = 0;
  if (ACROSS) {
    const int s = i % hw, c = (i / hw) % channels;
    const int base = (i / (hw * channels)) * channels * hw + s;
    for (int j = max(c - pre, 0); j <= min(c + pre, channels - 1); ++j) acc += f(base + j * hw);
  } else {
    const int w = i % width, h = (i / width) % height, plane = (i / hw) * hw;
    for (int hh = max(h - pre, 0); hh <= min(h + pre, height - 1); ++hh)
      for (int ww = max(w - pre, 0); ww <= min(w + pre, width - 1); ++ww) acc += f(plane + hh * width + ww);
  }
  return acc;
}

struct Squares {  // x^2: the forward's window terms
  const Dtype* x;
  __device__ Mtype operator()(const int q) const { return to_m(x[q]) * to_m(x[q]); }
};

struct Ratios {  // dy * y / scale: the backward's window terms
  const Dtype *dy, *y, *scale;
  __device__ Mtype operator()(const int q) const { return to_m(dy[q]) * to_m(y[q]) / to_m(scale[q]); }
};
}  // extern "C++"

// scale = base + coeff * sum of x^2 over the window
#define LRN_SCALE(NAME, ACROSS)                                                                 \
  __global__ void NAME(const int count, const Dtype* x, const int channels, const int height,  \
                       const int width, const int size, const Mtype base, const Mtype coeff,   \
                       Dtype* scale) {                                                          \
    const Squares f = {x};                                                                      \
    CUDA_KERNEL_LOOP(i, count) {                                                                \
      scale[i] = from_m(Mtype(base) + Mtype(coeff) * window_sum<ACROSS>(i, channels, height, width, size, f)); \
    }                                                                                           \
  }

// dx = dy * scale^neg_beta - ratio * x * sum over the window of dy * y / scale
#define LRN_DIFF(NAME, ACROSS)                                                                  \
  __global__ void NAME(const int count, const Dtype* x, const Dtype* y, const Dtype* dy,       \
                       const Dtype* scale, const int channels, const int height,               \
                       const int width, const int size, const Mtype neg_beta,                  \
                       const Mtype ratio, Dtype* dx) {                                          \
    const Ratios f = {dy, y, scale};                                                            \
    CUDA_KERNEL_LOOP(i, count) {                                                                \
      dx[i] = from_m(to_m(dy[i]) * pow(to_m(scale[i]), Mtype(neg_beta)) -                        \
                     Mtype(ratio) * to_m(x[i]) * window_sum<ACROSS>(i, channels, height, width, size, f)); \
    }                                                                                           \
  }

LRN_SCALE(lrn_scale_across, true)
LRN_SCALE(lrn_scale_within, false)
LRN_DIFF(lrn_diff_across, true)
LRN_DIFF(lrn_diff_within, false)

// y = x * scale^neg_beta
__global__ void lrn_output(const int count, const Dtype* x, const Dtype* scale,
                           const Mtype neg_beta, Dtype* y) {
  CUDA_KERNEL_LOOP(i, count) { y[i] = from_m(to_m(x[i]) * pow(to_m(scale[i]), Mtype(neg_beta))); }
}
