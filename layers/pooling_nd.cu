// Pooling over up to three spatial axes (d0, d1, d2) per plane, for Pooling's N-D and STOCHASTIC paths
// (layers/pooling_nd.py); fewer axes come as leading axes of size 1 (kernel 1, stride 1, pad 0).
// Window (x0, x1, x2) covers [x*stride - pad, +kernel) on each axis. MAX reads the part inside the
// input (first maximum in row-major order, -FLT_MAX and index -1 when empty); AVE divides the sum of
// that part by the window volume clipped to the padded input; STOCHASTIC (no padding) picks at TRAIN
// the first element whose running sum reaches u * window sum (u uniform in [0, 1)) and at TEST gives
// sum(x^2) / sum(x) (0 when the sum is not positive). Indices are flat within a plane:
// (i0 * d1 + i1) * d2 + i2. Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend
// prelude; maxima, sums and quotients are in Mtype.

#define ND_POOL_LOWEST ((Mtype)-3.402823466e+38f)

#define ND_POOL_ARGS                                                                              \
  const int d0, const int d1, const int d2, const int q0, const int q1, const int q2, const int k0, \
      const int k1, const int k2, const int s0, const int s1, const int s2, const int p0, const int p1, \
      const int p2

struct NdWindow {
  int plane, b0, b1, b2, e0, e1, e2;  // clipped bounds [b, e) per axis
  int size;                           // AVE's divisor: the window clipped to the padded input
};

__device__ NdWindow nd_window(const int index, ND_POOL_ARGS) {
  NdWindow w;
  const int x2 = index % q2;
  const int x1 = (index / q2) % q1;
  const int x0 = (index / (q1 * q2)) % q0;
  w.plane = index / (q0 * q1 * q2);
  const int a0 = x0 * s0 - p0, a1 = x1 * s1 - p1, a2 = x2 * s2 - p2;
  w.size = (min(a0 + k0, d0 + p0) - a0) * (min(a1 + k1, d1 + p1) - a1) * (min(a2 + k2, d2 + p2) - a2);
  w.b0 = max(a0, 0);
  w.b1 = max(a1, 0);
  w.b2 = max(a2, 0);
  w.e0 = min(a0 + k0, d0);
  w.e1 = min(a1 + k1, d1);
  w.e2 = min(a2 + k2, d2);
  return w;
}

__global__ void nd_max_pool_forward(const int count, const Dtype* bottom, ND_POOL_ARGS, Dtype* top, int* mask) {
  CUDA_KERNEL_LOOP(index, count) {
    const NdWindow w = nd_window(index, d0, d1, d2, q0, q1, q2, k0, k1, k2, s0, s1, s2, p0, p1, p2);
    const Dtype* x = bottom + w.plane * d0 * d1 * d2;
    Mtype best = ND_POOL_LOWEST;
    int arg = -1;
    for (int i0 = w.b0; i0 < w.e0; ++i0)
      for (int i1 = w.b1; i1 < w.e1; ++i1)
        for (int i2 = w.b2; i2 < w.e2; ++i2) {
          const int at = (i0 * d1 + i1) * d2 + i2;
          if (to_m(x[at]) > best) {
            best = to_m(x[at]);
            arg = at;
          }
        }
    top[index] = from_m(best);
    mask[index] = arg;
  }
}

__global__ void nd_ave_pool_forward(const int count, const Dtype* bottom, ND_POOL_ARGS, Dtype* top) {
  CUDA_KERNEL_LOOP(index, count) {
    const NdWindow w = nd_window(index, d0, d1, d2, q0, q1, q2, k0, k1, k2, s0, s1, s2, p0, p1, p2);
    const Dtype* x = bottom + w.plane * d0 * d1 * d2;
    Mtype sum = 0;
    for (int i0 = w.b0; i0 < w.e0; ++i0)
      for (int i1 = w.b1; i1 < w.e1; ++i1)
        for (int i2 = w.b2; i2 < w.e2; ++i2) sum += to_m(x[(i0 * d1 + i1) * d2 + i2]);
    top[index] = from_m(sum / w.size);
  }
}

__host__ __device__ __forceinline__ unsigned int nd_mulhi(unsigned int a, unsigned int b) {
  return static_cast<unsigned int>((static_cast<unsigned long long>(a) * b) >> 32);
}

// First word of Philox-4x32-10 (as Dropout's generator) of counter (c0, c1, 0, 0) under key (k0, k1).
__device__ __forceinline__ unsigned int nd_philox(unsigned int c0, unsigned int c1, unsigned int k0,
                                                  unsigned int k1) {
  unsigned int c2 = 0U, c3 = 0U;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9U;
      k1 += 0xBB67AE85U;
    }
    const unsigned int hi0 = nd_mulhi(0xD2511F53U, c0), lo0 = 0xD2511F53U * c0;
    const unsigned int hi1 = nd_mulhi(0xCD9E8D57U, c2), lo1 = 0xCD9E8D57U * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return c0;
}

// TRAIN: sample one element per window with probability proportional to its value; idx gets its flat
// index (the last element of the window when the running sum never reaches the threshold).
__global__ void nd_sto_pool_forward_train(const int count, const Dtype* bottom, ND_POOL_ARGS,
                                          const unsigned int* offset, const unsigned int seed,
                                          const unsigned int stream, Dtype* top, int* idx) {
  const unsigned int off = *offset;
  CUDA_KERNEL_LOOP(index, count) {
    const NdWindow w = nd_window(index, d0, d1, d2, q0, q1, q2, k0, k1, k2, s0, s1, s2, p0, p1, p2);
    const Dtype* x = bottom + w.plane * d0 * d1 * d2;
    Mtype total = 0;
    for (int i0 = w.b0; i0 < w.e0; ++i0)
      for (int i1 = w.b1; i1 < w.e1; ++i1)
        for (int i2 = w.b2; i2 < w.e2; ++i2) total += to_m(x[(i0 * d1 + i1) * d2 + i2]);
    const float u = nd_philox(static_cast<unsigned int>(index), off, seed, stream) * 2.3283064365386963e-10f;
    const float thres = u * total;
    Mtype run = 0;
    int pick = ((w.e0 - 1) * d1 + (w.e1 - 1)) * d2 + (w.e2 - 1);
    bool found = false;
    for (int i0 = w.b0; i0 < w.e0 && !found; ++i0)
      for (int i1 = w.b1; i1 < w.e1 && !found; ++i1)
        for (int i2 = w.b2; i2 < w.e2 && !found; ++i2) {
          const int at = (i0 * d1 + i1) * d2 + i2;
          run += to_m(x[at]);
          if (run >= thres) {
            pick = at;
            found = true;
          }
        }
    top[index] = x[pick];
    idx[index] = pick;
  }
}

__global__ void nd_sto_pool_advance(unsigned int* offset) { *offset += 1U; }

__global__ void nd_sto_pool_forward_test(const int count, const Dtype* bottom, ND_POOL_ARGS, Dtype* top) {
  CUDA_KERNEL_LOOP(index, count) {
    const NdWindow w = nd_window(index, d0, d1, d2, q0, q1, q2, k0, k1, k2, s0, s1, s2, p0, p1, p2);
    const Dtype* x = bottom + w.plane * d0 * d1 * d2;
    Mtype sum = 0, squares = 0;
    for (int i0 = w.b0; i0 < w.e0; ++i0)
      for (int i1 = w.b1; i1 < w.e1; ++i1)
        for (int i2 = w.b2; i2 < w.e2; ++i2) {
          const Mtype v = to_m(x[(i0 * d1 + i1) * d2 + i2]);
          sum += v;
          squares += v * v;
        }
    top[index] = from_m(sum > Mtype(0) ? squares / sum : Mtype(0));
  }
}

// Backward as a gather, one thread per bottom element: the windows that can cover it on each axis are
// [(i + p - k) / s + 1 (0 if i + p < k), min((i + p) / s + 1, q)). MAX and STOCHASTIC (routed) add the top
// diffs of windows whose index names this element; AVE adds each covering window's diff / its size.
__device__ __forceinline__ void nd_cover(const int i, const int d, const int q, const int k, const int s,
                                         const int p, int* lo, int* hi) {
  *lo = (i + p < k) ? 0 : (i + p - k) / s + 1;
  *hi = min((i + p) / s + 1, q);
}

__global__ void nd_routed_pool_backward(const int count, const Dtype* top_diff, const int* idx, ND_POOL_ARGS,
                                        Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(index, count) {
    const int i2 = index % d2;
    const int i1 = (index / d2) % d1;
    const int i0 = (index / (d1 * d2)) % d0;
    const int plane = index / (d0 * d1 * d2);
    const int at = (i0 * d1 + i1) * d2 + i2;
    int l0, h0, l1, h1, l2, h2;
    nd_cover(i0, d0, q0, k0, s0, p0, &l0, &h0);
    nd_cover(i1, d1, q1, k1, s1, p1, &l1, &h1);
    nd_cover(i2, d2, q2, k2, s2, p2, &l2, &h2);
    const int base = plane * q0 * q1 * q2;
    Mtype g = 0;
    for (int x0 = l0; x0 < h0; ++x0)
      for (int x1 = l1; x1 < h1; ++x1)
        for (int x2 = l2; x2 < h2; ++x2) {
          const int t = base + (x0 * q1 + x1) * q2 + x2;
          if (idx[t] == at) g += to_m(top_diff[t]);
        }
    bottom_diff[index] = from_m(g);
  }
}

__global__ void nd_ave_pool_backward(const int count, const Dtype* top_diff, ND_POOL_ARGS, Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(index, count) {
    const int i2 = index % d2;
    const int i1 = (index / d2) % d1;
    const int i0 = (index / (d1 * d2)) % d0;
    const int plane = index / (d0 * d1 * d2);
    int l0, h0, l1, h1, l2, h2;
    nd_cover(i0, d0, q0, k0, s0, p0, &l0, &h0);
    nd_cover(i1, d1, q1, k1, s1, p1, &l1, &h1);
    nd_cover(i2, d2, q2, k2, s2, p2, &l2, &h2);
    const int base = plane * q0 * q1 * q2;
    Mtype g = 0;
    for (int x0 = l0; x0 < h0; ++x0) {
      const int a0 = x0 * s0 - p0;
      const int z0 = min(a0 + k0, d0 + p0) - a0;
      for (int x1 = l1; x1 < h1; ++x1) {
        const int a1 = x1 * s1 - p1;
        const int z1 = min(a1 + k1, d1 + p1) - a1;
        for (int x2 = l2; x2 < h2; ++x2) {
          const int a2 = x2 * s2 - p2;
          const int z2 = min(a2 + k2, d2 + p2) - a2;
          g += to_m(top_diff[base + (x0 * q1 + x1) * q2 + x2]) / (z0 * z1 * z2);
        }
      }
    }
    bottom_diff[index] = from_m(g);
  }
}

// The mask top: the int indices as Dtype.
__global__ void nd_pool_index_to_dtype(const int count, const int* idx, Dtype* out) {
  CUDA_KERNEL_LOOP(index, count) { out[index] = static_cast<Dtype>(idx[index]); }
}
