// Upsample kernels (max-unpooling by a mask is math_functions' plane_scatter / plane_gather).

// Nearest neighbour x (planes of H x W) -> y (planes of H*sh x W*sw): one thread per output.
__global__ void upsample_nearest_forward(const int n, const int H, const int W, const int sh,
                                         const int sw, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int Wo = W * sw, Ho = H * sh;
    const int w = i % Wo;
    const int h = (i / Wo) % Ho;
    const int p = i / (Wo * Ho);
    y[i] = x[((long long)p * H + h / sh) * W + w / sw];
  }
}

// One thread per input: the sum of its sh x sw block.
__global__ void upsample_nearest_backward(const int n, const int H, const int W, const int sh,
                                          const int sw, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int h = (i / W) % H;
    const int p = i / (W * H);
    const int Wo = W * sw;
    const Dtype* src = dy + ((long long)p * H * sh + h * sh) * Wo + w * sw;
    Dtype acc = 0;
    for (int a = 0; a < sh; ++a) {
      for (int b = 0; b < sw; ++b) acc += src[a * Wo + b];
    }
    dx[i] = acc;
  }
}

// ---- Max-unpooling (two bottoms): x and its mask idx (P planes of H x W, idx a flat index into the
// Ho x Wo output plane, truncated to int; outside [0, Ho*Wo) it takes no part). The result is
// y[p, k] = x[p, s] for the highest s with idx[p, s] == k, else 0 (a CPU loop in order).
// Source (h, w) owns the output window rows [h*sh, h*sh + sh) x cols [w*sw, w*sw + sw) (clipped
// to the plane); cells beyond H*sh rows or W*sw columns have no owner. A source whose index lies
// in its own window is "home" (the normal case: 2x2/2 pooling then scale 2), any other valid
// index is "stray". Windows are disjoint, so a cell named only by its owner needs no arbitration.

// Flat in-plane index of the source owning cell k (0 <= k < Ho*Wo), or -1.
__device__ __forceinline__ int unpool_owner(const int k, const int H, const int W, const int Wo, const int sh,
                                            const int sw) {
  const int hi = k / Wo / sh, wi = k % Wo / sw;
  return (hi < H && wi < W) ? hi * W + wi : -1;
}

// The stray target of source s (flat over all planes), or -1 when its index is home or invalid.
__device__ __forceinline__ int unpool_stray_target(const int s, const int H, const int W, const int Ho,
                                                   const int Wo, const int sh, const int sw, const Dtype* idx) {
  const int k = static_cast<int>(idx[s]);
  if (k < 0 || k >= Ho * Wo) return -1;
  return unpool_owner(k, H, W, Wo, sh, sw) == s % (H * W) ? -1 : k;
}

// Pass 1, one thread per (plane p, row r < R = max(Ho, H*sh), source column w): writes row r's
// columns [w*sw, w*sw + sw) (the last column also the unowned ones up to Wo), each cell once: x of
// the owner when the owner's index names the cell, else 0. The thread on the first row of a
// window also checks its owner's index and sets *stray to 1 if the index is stray (every source
// is checked once; rows r >= Ho only check). Exact when no index is stray.
__global__ void unpool_forward(const int n, const int H, const int W, const int Ho, const int Wo, const int R,
                               const int sh, const int sw, const Dtype* x, const Dtype* idx, Dtype* y,
                               Dtype* stray) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int q = i / W;
    const int r = q % R;
    const int p = q / R;
    const int hi = r / sh;
    const int c0 = w * sw;
    const int cend = min(c0 + sw, Wo);  // the owner's columns in this row
    int col = -1;                       // the column of this row the owner's index names, if in its window
    Dtype v = 0;
    if (hi < H) {
      const long long src = ((long long)p * H + hi) * W + w;
      const int k = static_cast<int>(idx[src]);
      if (r < Ho && k >= r * Wo + c0 && k < r * Wo + cend) {
        col = k - r * Wo;
        v = x[src];
      }
      if (r == hi * sh && k >= 0 && k < Ho * Wo && unpool_owner(k, H, W, Wo, sh, sw) != hi * W + w) {
        *stray = Dtype(1);
      }
    }
    if (r < Ho) {
      Dtype* row = y + ((long long)p * Ho + r) * Wo;
      const int c1 = w == W - 1 ? Wo : cend;
      for (int c = c0; c < c1; ++c) row[c] = c == col ? v : Dtype(0);
    }
  }
}

// Pass 2, one block: nothing unless pass 1 found a stray index; then each cell a stray index names
// goes to the highest source naming it (win: P*Ho*Wo ints of scratch, only the named cells are
// touched): clear, claim with atomicMax, and a stray winner writes unless the cell's owner names it
// and comes later. Resets *stray for the next call.
__global__ void unpool_fix_strays(const int n, const int H, const int W, const int Ho, const int Wo, const int sh,
                                  const int sw, const Dtype* x, const Dtype* idx, Dtype* y, int* win,
                                  Dtype* stray) {
  if (*stray == Dtype(0)) return;
  const int S = H * W;
  const long long T = (long long)Ho * Wo;
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const int k = unpool_stray_target(s, H, W, Ho, Wo, sh, sw, idx);
    if (k >= 0) win[(s / S) * T + k] = 0;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const int k = unpool_stray_target(s, H, W, Ho, Wo, sh, sw, idx);
    if (k >= 0) atomicMax(win + (s / S) * T + k, s + 1);
  }
  __syncthreads();
  for (int s = threadIdx.x; s < n; s += blockDim.x) {
    const int k = unpool_stray_target(s, H, W, Ho, Wo, sh, sw, idx);
    if (k < 0) continue;
    const long long cell = (s / S) * T + k;
    if (win[cell] != s + 1) continue;
    const int o = unpool_owner(k, H, W, Wo, sh, sw);
    const int owner = (s / S) * S + o;
    if (o < 0 || owner < s || static_cast<int>(idx[owner]) != k) y[cell] = x[s];
  }
  __syncthreads();
  if (threadIdx.x == 0) *stray = Dtype(0);
}
