// Eltwise MAX. The mask holds, per element, the index of the winning bottom (as a Dtype). Comparisons
// and arithmetic are in Mtype (to_m / from_m from the backend prelude).

// Folds bottom b (index idx + 1) into the running max a. With idx == 0, a is bottom 0 and the
// mask starts here; afterwards a is the top itself (a == top is allowed: each thread reads its
// element before writing it).
__global__ void eltwise_max_forward(const int n, const Dtype* a, const Dtype* b, const int idx,
                                    Dtype* top, Dtype* mask) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype va = a[i];
    const Dtype vb = b[i];
    if (idx == 0) {
      if (to_m(va) > to_m(vb)) {
        top[i] = va;
        mask[i] = 0;
      } else {
        top[i] = vb;
        mask[i] = 1;
      }
    } else if (to_m(vb) > to_m(va)) {
      top[i] = vb;
      mask[i] = (Dtype)(idx + 1);
    }
  }
}

__global__ void eltwise_max_backward(const int n, const Dtype* top_diff, const Dtype* mask,
                                     const int idx, Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    bottom_diff[i] = ((int)to_m(mask[i]) == idx) ? top_diff[i] : (Dtype)0;
  }
}

// Eltwise SUM with the in-place ReLU (negative_slope 0) after it, and the Split after that, as one
// pass each way (runtime/fusion.py's SumReLU); the arithmetic of the layers' own passes, in their
// order (weighted_sum.cuh, ReLU's product, Eltwise's scale), vectorized by W.
#include "vec.cuh"
#include "weighted_sum.cuh"

extern "C++" {
// g = s_0 (m == 1: the top's own diff) or the Split's sum s_0 * 1 + 1 * s_1 + .. (m <= 4 tops);
// dz = g * (y > 0 ? 1 : 0), written to t (the top's diff; may alias s_0); then d_i = c_i * dz for
// each bottom i < nb whose bit is set in prop.
template <int W>
__device__ void eltwise_sum_relu_backward(const int n, const int m, const Dtype* s0, const Dtype* s1,
                                          const Dtype* s2, const Dtype* s3, const Dtype* y, Dtype* t,
                                          const int nb, const int prop, const Mtype c0, const Mtype c1,
                                          const Mtype c2, const Mtype c3, Dtype* d0, Dtype* d1, Dtype* d2,
                                          Dtype* d3) {
  const Dtype* src[3] = {s1, s2, s3};
  const Mtype co[4] = {Mtype(c0), Mtype(c1), Mtype(c2), Mtype(c3)};
  Dtype* dst[4] = {d0, d1, d2, d3};
  CUDA_KERNEL_LOOP(u, n) {
    Vec<W> g = vload<W>(s0, u);
    if (m > 1) {  // the Split's sum in Mtype, stored as Dtype before ReLU's product (as unfused)
      Mtype gm[W];
#pragma unroll
      for (int j = 0; j < W; ++j) gm[j] = to_m(g.v[j]) * Mtype(1);
#pragma unroll
      for (int r = 0; r < 3; ++r) {
        if (r + 1 < m) {
          const Vec<W> v = vload<W>(src[r], u);
#pragma unroll
          for (int j = 0; j < W; ++j) gm[j] += Mtype(1) * to_m(v.v[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < W; ++j) g.v[j] = from_m(gm[j]);
    }
    const Vec<W> mask = vload<W>(y, u);
#pragma unroll
    for (int j = 0; j < W; ++j) g.v[j] = from_m(to_m(g.v[j]) * (to_m(mask.v[j]) > 0 ? Mtype(1) : Mtype(0)));
    vstore<W>(t, u, g);
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      if (b < nb && (prop >> b & 1)) {
        Vec<W> d;
#pragma unroll
        for (int j = 0; j < W; ++j) d.v[j] = from_m(co[b] * to_m(g.v[j]));
        vstore<W>(dst[b], u, d);
      }
    }
  }
}
}  // extern "C++"

#define ELTWISE_SUM_RELU(W)                                                                          \
  __global__ void eltwise_sum_relu_v##W(const int n, const int k, const Dtype* a0, const Dtype* a1, \
                                        const Dtype* a2, const Dtype* a3, const Mtype c0,           \
                                        const Mtype c1, const Mtype c2, const Mtype c3, Dtype* y) {  \
    weighted_sum<W, true>(n, k, a0, a1, a2, a3, Mtype(c0), Mtype(c1), Mtype(c2), Mtype(c3), y);           \
  }                                                                                                 \
  __global__ void eltwise_sum_relu_backward_v##W(                                                   \
      const int n, const int m, const Dtype* s0, const Dtype* s1, const Dtype* s2, const Dtype* s3, \
      const Dtype* y, Dtype* t, const int nb, const int prop, const Mtype c0, const Mtype c1,       \
      const Mtype c2, const Mtype c3, Dtype* d0, Dtype* d1, Dtype* d2, Dtype* d3) {                 \
    eltwise_sum_relu_backward<W>(n, m, s0, s1, s2, s3, y, t, nb, prop, c0, c1, c2, c3, d0, d1, d2, d3); \
  }
ELTWISE_SUM_RELU(1)
ELTWISE_SUM_RELU(4)
