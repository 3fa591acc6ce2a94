// Unpooling: pooled (H, W) planes -> unpooled (Ho, Wo) planes. Window of pooled cell (ph, pw):
// rows ph * sh - pdh .. + kh, columns pw * sw - pdw .. + kw.

// MAX switches, one thread per pooled element: mode 0 copies the mask, 1 recomputes the first
// maximum of the window in ref (the pre-pooling input, Ho x Wo planes), 2 takes the window's
// first cell clipped to the output.
__global__ void unpool_switches(const int n, const int H, const int W, const int Ho, const int Wo,
                                const int kh, const int kw, const int sh, const int sw,
                                const int pdh, const int pdw, const int mode, const int C, const int Cm,
                                const Dtype* ref, Dtype* idx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int pw = i % W;
    const int ph = (i / W) % H;
    const int plane = i / (W * H);
    const int hs = ph * sh - pdh, ws = pw * sw - pdw;
    if (mode == 0) {
      // the mask has Cm >= C channels per image: plane (n, c) reads the mask's plane (n, c)
      idx[i] = ref[((long long)(plane / C) * Cm + plane % C) * H * W + ph * W + pw];
    } else if (mode == 2) {
      const int uh = max(0, min(hs, Ho - 1)), uw = max(0, min(ws, Wo - 1));
      idx[i] = static_cast<Dtype>(uh * Wo + uw);
    } else {
      const int h0 = max(hs, 0), w0 = max(ws, 0);
      const int h1 = min(hs + kh, Ho), w1 = min(ws + kw, Wo);
      const Dtype* r = ref + (long long)plane * Ho * Wo;
      int best = h0 * Wo + w0;
      if (h1 > h0 && w1 > w0) {
        Dtype m = r[best];
        for (int h = h0; h < h1; ++h) {
          for (int w = w0; w < w1; ++w) {
            if (r[h * Wo + w] > m) {
              m = r[h * Wo + w];
              best = h * Wo + w;
            }
          }
        }
      }
      idx[i] = static_cast<Dtype>(best);
    }
  }
}

// y zeroed first; indices outside the plane are skipped.
extern "C++" {
// Window size counted before clipping at the start (Caffe's average pooling).
__device__ __forceinline__ int unpool_span(const int start, const int k, const int n_out, const int pad) {
  return min(start + k, n_out + pad) - start;
}
}

// AVE (average != 0: value / window size) or TILE: one thread per output, gathering the pooled
// cells whose windows cover it.
__global__ void unpool_window_forward(const int n, const int H, const int W, const int Ho,
                                      const int Wo, const int kh, const int kw, const int sh,
                                      const int sw, const int pdh, const int pdw,
                                      const int average, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = i % Wo + pdw;
    const int h = (i / Wo) % Ho + pdh;
    const int plane = i / (Wo * Ho);
    const int ph0 = h < kh ? 0 : (h - kh) / sh + 1;
    const int ph1 = min(h / sh + 1, H);
    const int pw0 = w < kw ? 0 : (w - kw) / sw + 1;
    const int pw1 = min(w / sw + 1, W);
    const Dtype* src = x + (long long)plane * H * W;
    Mtype acc = 0;  // sums in Mtype (to_m / from_m from the backend prelude)
    for (int ph = ph0; ph < ph1; ++ph) {
      for (int pw = pw0; pw < pw1; ++pw) {
        Mtype v = to_m(src[ph * W + pw]);
        if (average) {
          v /= unpool_span(ph * sh - pdh, kh, Ho, pdh) * unpool_span(pw * sw - pdw, kw, Wo, pdw);
        }
        acc += v;
      }
    }
    y[i] = from_m(acc);
  }
}

// Adjoint: one thread per pooled cell, summing its (clipped) window.
__global__ void unpool_window_backward(const int n, const int H, const int W, const int Ho,
                                       const int Wo, const int kh, const int kw, const int sh,
                                       const int sw, const int pdh, const int pdw,
                                       const int average, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int pw = i % W;
    const int ph = (i / W) % H;
    const int plane = i / (W * H);
    const int hs = ph * sh - pdh, ws = pw * sw - pdw;
    const int h0 = max(hs, 0), w0 = max(ws, 0);
    const int h1 = min(hs + kh, Ho), w1 = min(ws + kw, Wo);
    const Dtype* src = dy + (long long)plane * Ho * Wo;
    Mtype acc = 0;
    for (int h = h0; h < h1; ++h) {
      for (int w = w0; w < w1; ++w) acc += to_m(src[h * Wo + w]);
    }
    if (average) acc /= unpool_span(hs, kh, Ho, pdh) * unpool_span(ws, kw, Wo, pdw);
    dx[i] = from_m(acc);
  }
}
