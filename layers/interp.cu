// Interp: aligned-corner bilinear resize of each (H, W) plane, reading the Hi x Wi window that
// starts at (off, off). One thread per output element (coalesced writes). The ratios and source
// coordinates are single precision, as in the DeepLab / PSPNet layer.

extern "C++" {
__device__ __forceinline__ void interp_source(const int o, const int n_in, const int n_out,
                                              int* lo, int* step, float* lam) {
  const float ratio = n_out > 1 ? static_cast<float>(n_in - 1) / (n_out - 1) : 0.f;
  const float r = ratio * o;
  *lo = static_cast<int>(r);
  *step = *lo < n_in - 1 ? 1 : 0;
  *lam = r - *lo;
}
}

__global__ void interp_forward(const int n, const int H, const int W, const int off, const int Hi,
                               const int Wi, const int Ho, const int Wo, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w2 = i % Wo;
    const int h2 = (i / Wo) % Ho;
    const int plane = i / (Wo * Ho);
    const Dtype* src = x + (long long)plane * H * W + off * W + off;
    if (Hi == Ho && Wi == Wo) {
      y[i] = src[h2 * W + w2];
    } else {
      int h1, hp, w1, wp;
      float hlf, wlf;
      interp_source(h2, Hi, Ho, &h1, &hp, &hlf);
      interp_source(w2, Wi, Wo, &w1, &wp, &wlf);
      const Dtype hl = hlf, wl = wlf;
      const Dtype* p = src + h1 * W + w1;
      y[i] = (Dtype(1) - hl) * ((Dtype(1) - wl) * p[0] + wl * p[wp]) +
             hl * ((Dtype(1) - wl) * p[hp * W] + wl * p[hp * W + wp]);
    }
  }
}

// Adjoint: each output gradient is added to its (up to) four sources; dx must be zeroed first.
__global__ void interp_backward(const int n, const int H, const int W, const int off, const int Hi,
                                const int Wi, const int Ho, const int Wo, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w2 = i % Wo;
    const int h2 = (i / Wo) % Ho;
    const int plane = i / (Wo * Ho);
    Dtype* dst = dx + (long long)plane * H * W + off * W + off;
    const Dtype g = dy[i];
    if (Hi == Ho && Wi == Wo) {
      dst[h2 * W + w2] = g;
    } else {
      int h1, hp, w1, wp;
      float hlf, wlf;
      interp_source(h2, Hi, Ho, &h1, &hp, &hlf);
      interp_source(w2, Wi, Wo, &w1, &wp, &wlf);
      const Dtype hl = hlf, wl = wlf;
      Dtype* p = dst + h1 * W + w1;
      atomicAdd(p, (Dtype(1) - hl) * (Dtype(1) - wl) * g);
      atomicAdd(p + wp, (Dtype(1) - hl) * wl * g);
      atomicAdd(p + hp * W, hl * (Dtype(1) - wl) * g);
      atomicAdd(p + hp * W + wp, hl * wl * g);
    }
  }
}
