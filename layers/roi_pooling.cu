// ROIPooling: forward one thread per output (roi, c, ph, pw); backward one thread per input
// element, gathering (no atomics, deterministic) the top gradients of every roi bin whose argmax
// is that element. Argmax positions are stored as Dtype (exact below 2^24 for float; only below 2^11
// for half and 2^8 for bfloat16, so half nets need a float argmax blob). Corners, bins and sums in
// Mtype (to_m / from_m from the backend prelude).

extern "C++" {
// The roi's scaled, rounded corners (C round: halves away from zero) and batch index.
__device__ __forceinline__ void roi_corners(const Dtype* r, const Mtype scale, int* b, int* x1,
                                            int* y1, int* x2, int* y2) {
  *b = static_cast<int>(to_m(r[0]));
  *x1 = static_cast<int>(round(to_m(r[1]) * scale));
  *y1 = static_cast<int>(round(to_m(r[2]) * scale));
  *x2 = static_cast<int>(round(to_m(r[3]) * scale));
  *y2 = static_cast<int>(round(to_m(r[4]) * scale));
}
}

__global__ void roi_pool_forward(const int n, const Dtype* x, const Mtype scale, const int N,
                                 const int C, const int H, const int W, const int PH, const int PW,
                                 const Dtype* rois, Dtype* y, Dtype* argmax) {
  CUDA_KERNEL_LOOP(i, n) {
    const int pw = i % PW;
    const int ph = (i / PW) % PH;
    const int c = (i / (PW * PH)) % C;
    const int r = i / (PW * PH * C);
    int b, x1, y1, x2, y2;
    roi_corners(rois + r * 5, Mtype(scale), &b, &x1, &y1, &x2, &y2);
    if (b < 0 || b >= N) {
      y[i] = 0;
      argmax[i] = -1;
      continue;
    }
    const Mtype bh = static_cast<Mtype>(max(y2 - y1 + 1, 1)) / static_cast<Mtype>(PH);
    const Mtype bw = static_cast<Mtype>(max(x2 - x1 + 1, 1)) / static_cast<Mtype>(PW);
    const int hs = min(max(static_cast<int>(floor(static_cast<Mtype>(ph) * bh)) + y1, 0), H);
    const int he = min(max(static_cast<int>(ceil(static_cast<Mtype>(ph + 1) * bh)) + y1, 0), H);
    const int ws = min(max(static_cast<int>(floor(static_cast<Mtype>(pw) * bw)) + x1, 0), W);
    const int we = min(max(static_cast<int>(ceil(static_cast<Mtype>(pw + 1) * bw)) + x1, 0), W);
    if (he <= hs || we <= ws) {
      y[i] = 0;
      argmax[i] = -1;
      continue;
    }
    const Dtype* plane = x + ((long long)b * C + c) * H * W;
    int best = hs * W + ws;
    Mtype m = to_m(plane[best]);
    for (int h = hs; h < he; ++h) {
      for (int w = ws; w < we; ++w) {
        const int k = h * W + w;
        if (to_m(plane[k]) > m) {
          m = to_m(plane[k]);
          best = k;
        }
      }
    }
    y[i] = from_m(m);
    argmax[i] = static_cast<Dtype>(best);
  }
}

__global__ void roi_pool_backward(const int n, const Dtype* dy, const Dtype* argmax, const int R,
                                  const Mtype scale, const int C, const int H, const int W,
                                  const int PH, const int PW, const Dtype* rois, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int h = (i / W) % H;
    const int c = (i / (W * H)) % C;
    const int b = i / (W * H * C);
    const Mtype me = static_cast<Mtype>(h * W + w);
    Mtype acc = 0;
    for (int r = 0; r < R; ++r) {
      int rb, x1, y1, x2, y2;
      roi_corners(rois + r * 5, Mtype(scale), &rb, &x1, &y1, &x2, &y2);
      const int rh = max(y2 - y1 + 1, 1), rw = max(x2 - x1 + 1, 1);
      if (rb != b || w < x1 || w >= x1 + rw || h < y1 || h >= y1 + rh) continue;
      const Mtype bh = static_cast<Mtype>(rh) / static_cast<Mtype>(PH);
      const Mtype bw = static_cast<Mtype>(rw) / static_cast<Mtype>(PW);
      // Bins that may contain (h, w): a superset, each checked against the stored argmax.
      const int ph0 = min(max(static_cast<int>(floor(static_cast<Mtype>(h - y1) / bh)) - 1, 0), PH);
      const int ph1 = min(max(static_cast<int>(ceil(static_cast<Mtype>(h - y1 + 1) / bh)) + 1, 0), PH);
      const int pw0 = min(max(static_cast<int>(floor(static_cast<Mtype>(w - x1) / bw)) - 1, 0), PW);
      const int pw1 = min(max(static_cast<int>(ceil(static_cast<Mtype>(w - x1 + 1) / bw)) + 1, 0), PW);
      const int base = (r * C + c) * PH * PW;
      for (int ph = ph0; ph < ph1; ++ph) {
        for (int pw = pw0; pw < pw1; ++pw) {
          if (to_m(argmax[base + ph * PW + pw]) == me) acc += to_m(dy[base + ph * PW + pw]);
        }
      }
    }
    dx[i] = from_m(acc);
  }
}
