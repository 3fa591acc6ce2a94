// Sums of up to four inputs with coefficients, vectorized by W (vec.cuh): math_functions.cu's
// weighted_sum kernels (Eltwise SUM, Split's backward) and, with RELU, Eltwise's fused sum + ReLU
// (layers/eltwise.cu). Included after the backend prelude (Dtype, Mtype, to_m, from_m) and vec.cuh.
#pragma once

extern "C++" {
// y = sum over j < k (k <= 4) of c_j * a_j, then with RELU v > 0 ? v : v * 0 (ReLU's formula,
// negative_slope 0); y may alias any input. The sums and coefficients are Mtype (float for the half
// types): each value is converted once in (to_m) and the result once out (from_m).
template <int W, bool RELU = false>
__device__ void weighted_sum(const int n, const int k, const Dtype* a0, const Dtype* a1,
                             const Dtype* a2, const Dtype* a3, const Mtype c0, const Mtype c1,
                             const Mtype c2, const Mtype c3, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    const Vec<W> first = vload<W>(a0, u);
    Mtype acc[W];
#pragma unroll
    for (int j = 0; j < W; ++j) acc[j] = to_m(first.v[j]) * c0;
    const Dtype* in[3] = {a1, a2, a3};
    const Mtype co[3] = {c1, c2, c3};
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      if (t + 1 < k) {
        const Vec<W> v = vload<W>(in[t], u);
#pragma unroll
        for (int j = 0; j < W; ++j) acc[j] += co[t] * to_m(v.v[j]);
      }
    }
    if (RELU)
#pragma unroll
      for (int j = 0; j < W; ++j)
        if (!(acc[j] > 0)) acc[j] *= Mtype(0);
    Vec<W> out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = from_m(acc[j]);
    vstore<W>(y, u, out);
  }
}
}  // extern "C++"
