// Sums of up to four inputs with coefficients, vectorized by W (vec.cuh): math_functions.cu's
// weighted_sum kernels (Eltwise SUM, Split's backward) and, with RELU, Eltwise's fused sum + ReLU
// (layers/eltwise.cu). Included after the backend prelude (Dtype) and vec.cuh.
#pragma once

extern "C++" {
// y = sum over j < k (k <= 4) of c_j * a_j, then with RELU v > 0 ? v : v * 0 (ReLU's formula,
// negative_slope 0); y may alias any input.
template <int W, bool RELU = false>
__device__ void weighted_sum(const int n, const int k, const Dtype* a0, const Dtype* a1,
                             const Dtype* a2, const Dtype* a3, const Dtype c0, const Dtype c1,
                             const Dtype c2, const Dtype c3, Dtype* y) {
  CUDA_KERNEL_LOOP(u, n) {
    Vec<W> acc = vload<W>(a0, u);
#pragma unroll
    for (int j = 0; j < W; ++j) acc.v[j] *= c0;
    const Dtype* in[3] = {a1, a2, a3};
    const Dtype co[3] = {c1, c2, c3};
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      if (t + 1 < k) {
        const Vec<W> v = vload<W>(in[t], u);
#pragma unroll
        for (int j = 0; j < W; ++j) acc.v[j] += co[t] * v.v[j];
      }
    }
    if (RELU)
#pragma unroll
      for (int j = 0; j < W; ++j)
        if (!(acc.v[j] > 0)) acc.v[j] *= Dtype(0);
    vstore<W>(y, u, acc);
  }
}
}  // extern "C++"
