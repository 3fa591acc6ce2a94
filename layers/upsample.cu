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
    Mtype acc = 0;  // the sum in Mtype (to_m / from_m from the backend prelude)
    for (int a = 0; a < sh; ++a) {
      for (int b = 0; b < sw; ++b) acc += to_m(src[a * Wo + b]);
    }
    dx[i] = from_m(acc);
  }
}

// ---- Max-unpooling (two bottoms): x and its mask idx (P planes of H x W, idx a flat index into the
// Ho x Wo output plane, truncated to int; outside [0, Ho*Wo) it takes no part). The result is
// y[p, k] = x[p, s] for the highest s with idx[p, s] == k, else 0 (a CPU loop in order).
// Source (h, w) owns the output window rows [h*sh, h*sh + sh) x cols [w*sw, w*sw + sw) (clipped
// to the plane); cells beyond H*sh rows or W*sw columns have no owner. A source whose index lies
// in its own window is "home" (the normal case: 2x2/2 pooling then scale 2), any other valid
// index is "stray". Windows are disjoint, so a cell named only by its owner needs no arbitration.
// flag[0]: set by unpool_forward when some index is stray; flag[1]: unpool_write's block count.
// Both are zero between calls.

// Four consecutive cells of one output row (one or two 16-byte stores when aligned).
struct __align__(4 * sizeof(Dtype)) unpool_cells { Dtype v[4]; };

// Whether index k (0 <= k < Ho*Wo) lies in the window of source (hi, wi).
__device__ __forceinline__ bool unpool_home(const int k, const int hi, const int wi, const int Wo, const int sh,
                                            const int sw) {
  const int kr = k / Wo, kc = k - kr * Wo;
  return kr >= hi * sh && kr < hi * sh + sh && kc >= wi * sw && kc < wi * sw + sw;
}

// The stray target of source s (flat over all planes, S = H*W per plane), or -1 when its index is
// home or invalid.
__device__ __forceinline__ int unpool_stray_target(const int s, const int H, const int W, const int Ho,
                                                   const int Wo, const int sh, const int sw, const Dtype* idx) {
  const int k = static_cast<int>(idx[s]);
  if (k < 0 || k >= Ho * Wo) return -1;
  const int t = s % (H * W);
  return unpool_home(k, t / W, t % W, Wo, sh, sw) ? -1 : k;
}

// Pass 1, one thread per (plane p, row r < R = max(Ho, H*sh), group g < G of 4 columns, where
// G*4 >= max(Wo, W*sw)): writes cells (p, r, 4g .. 4g+3) that lie in the plane, each once: x of
// the owner when the owner's index names the cell, else 0; vec != 0 (Wo % 4 == 0, y aligned):
// as one unpool_cells store. The thread holding a window's first row and first column checks
// that source's index (every source once): a stray one sets flag[0] and clears its target's
// claim slot in win (P*Ho*Wo ints) for unpool_claim. Exact when no index is stray.
__global__ void unpool_forward(const int n, const int H, const int W, const int Ho, const int Wo, const int R,
                               const int G, const int sh, const int sw, const int vec, const Dtype* x,
                               const Dtype* idx, Dtype* y, int* flag, int* win) {
  CUDA_KERNEL_LOOP(i, n) {
    const int q = i / G;
    const int c0 = (i - q * G) * 4;
    const int p = q / R;
    const int r = q - p * R;
    const int hi = r / sh;
    unpool_cells out;
#pragma unroll
    for (int j = 0; j < 4; ++j) out.v[j] = Dtype(0);
    if (hi < H) {
      const long long base = ((long long)p * H + hi) * W;
      const bool first = r == hi * sh;
      const int here = r < Ho ? r * Wo + c0 : -1;  // flat index of cell (r, c0); never matches off the plane
      int wi = c0 / sw;
      int b = c0 - wi * sw;  // column of c0 inside source wi's window
      int k = -1;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (wi < W) {
          if (j == 0 || b == 0) {
            k = static_cast<int>(idx[base + wi]);
            if (first && b == 0 && k >= 0 && k < Ho * Wo && !unpool_home(k, hi, wi, Wo, sh, sw)) {
              flag[0] = 1;
              win[(long long)p * Ho * Wo + k] = 0;
            }
          }
          // A column past Wo may match a cell of the next row; such columns are never stored.
          if (here >= 0 && k == here + j) out.v[j] = x[base + wi];
        }
        if (++b == sw) {
          b = 0;
          ++wi;
        }
      }
    }
    if (r < Ho && c0 < Wo) {
      Dtype* row = y + ((long long)p * Ho + r) * Wo + c0;
      if (vec) {
        *reinterpret_cast<unpool_cells*>(row) = out;
      } else {
        for (int j = 0; j < 4 && c0 + j < Wo; ++j) row[j] = out.v[j];
      }
    }
  }
}

// Pass 2, over all n sources (a small grid-stride grid): returns at once unless flag[0]; then each
// stray source claims its target: win = the highest s + 1 among the stray sources naming it.
__global__ void unpool_claim(const int n, const int H, const int W, const int Ho, const int Wo, const int sh,
                             const int sw, const Dtype* idx, const int* flag, int* win) {
  if (flag[0] == 0) return;
  const int S = H * W;
  const long long T = (long long)Ho * Wo;
  CUDA_KERNEL_LOOP(s, n) {
    const int k = unpool_stray_target(s, H, W, Ho, Wo, sh, sw, idx);
    if (k >= 0) atomicMax(win + (s / S) * T + k, s + 1);
  }
}

// Pass 3, same grid: returns at once unless flag[0]; then the winning stray source of each cell
// writes it unless the cell's owner names it and comes later (pass 1 wrote the owner's value). The
// last block to finish resets flag[0] and flag[1] (every block has read flag[0] by then).
__global__ void unpool_write(const int n, const int H, const int W, const int Ho, const int Wo, const int sh,
                             const int sw, const Dtype* x, const Dtype* idx, Dtype* y, int* flag,
                             const int* win) {
  if (flag[0] == 0) return;
  const int S = H * W;
  const long long T = (long long)Ho * Wo;
  CUDA_KERNEL_LOOP(s, n) {
    const int k = unpool_stray_target(s, H, W, Ho, Wo, sh, sw, idx);
    if (k < 0) continue;
    const long long cell = (s / S) * T + k;
    if (win[cell] != s + 1) continue;
    const int kr = k / Wo, kc = k % Wo;
    const int hi = kr / sh, wi = kc / sw;
    const int owner = (s / S) * S + hi * W + wi;
    if (hi >= H || wi >= W || owner < s || static_cast<int>(idx[owner]) != k) y[cell] = x[s];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(flag + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      flag[0] = 0;
      flag[1] = 0;
    }
  }
}

// ---- The SegNet case (2x2 windows, Ho == 2H, Wo == 2W, W even, x and idx aligned to 2 elements,
// y to 4): one thread per two consecutive sources of one row (8- or 16-byte loads of x and idx,
// each source read once) writing their whole 2 x 4 block of the top as two 4-cell stores. Same
// flag / win protocol as unpool_forward (the claim and write passes follow); a source is home iff
// its index is one of the 4 cells of its window. (Four sources a thread, 4 stores, measured 35-50 %
// slower on an H200.)
struct __align__(2 * sizeof(Dtype)) unpool_two { Dtype v[2]; };

// Two sources (values v0, v1, indices k0, k1) whose window pair starts at flat cell `top` of plane
// p: the pair's 2 x 4 block into a (row 2hi) and b (row 2hi + 1); a stray index flags.
__device__ __forceinline__ void unpool_pair(const Dtype v0, const Dtype v1, const Dtype k0f, const Dtype k1f,
                                            const int top, const int Wo, const int T, const long long p,
                                            unpool_cells& a, unpool_cells& b, int* flag, int* win) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = static_cast<int>(j ? k1f : k0f);
    const Dtype v = j ? v1 : v0;
    const int d = k - (top + 2 * j);
    a.v[2 * j] = d == 0 ? v : Dtype(0);
    a.v[2 * j + 1] = d == 1 ? v : Dtype(0);
    b.v[2 * j] = d == Wo ? v : Dtype(0);
    b.v[2 * j + 1] = d == Wo + 1 ? v : Dtype(0);
    if (d != 0 && d != 1 && d != Wo && d != Wo + 1 && k >= 0 && k < T) {
      flag[0] = 1;
      win[p * T + k] = 0;
    }
  }
}

// n = P * H * W / 2 threads; HW = H * W, T = Ho * Wo.
__global__ void unpool_forward_x2(const int n, const int HW, const int W, const int Wo, const int T,
                                  const Dtype* x, const Dtype* idx, Dtype* y, int* flag, int* win) {
  CUDA_KERNEL_LOOP(t, n) {
    const int s0 = t * 2;
    const int p = s0 / HW;
    const int rem = s0 - p * HW;
    const int hi = rem / W;
    const int top = 2 * hi * Wo + 2 * (rem - hi * W);
    const unpool_two xv = reinterpret_cast<const unpool_two*>(x)[t];
    const unpool_two kv = reinterpret_cast<const unpool_two*>(idx)[t];
    unpool_cells a, b;
    unpool_pair(xv.v[0], xv.v[1], kv.v[0], kv.v[1], top, Wo, T, p, a, b, flag, win);
    Dtype* o = y + (long long)p * T + top;
    *reinterpret_cast<unpool_cells*>(o) = a;
    *reinterpret_cast<unpool_cells*>(o + Wo) = b;
  }
}

