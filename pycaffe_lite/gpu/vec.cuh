// Vectorized access for kernels over an (outer, dim, inner) view: a unit of W consecutive
// elements of one row (W divides inner; the pointers are aligned to W * sizeof(Dtype): the caller
// checks both, see math_functions.vec_width). W == 4 gives 128-bit loads and stores for float.
// Included after the backend prelude (Dtype; __half and __nv_bfloat16 too: W == 8 gives 128 bits).
#pragma once

extern "C++" {
template <int W>
struct alignas(W * sizeof(Dtype)) Vec {
  Dtype v[W];
};

template <int W>
__device__ __forceinline__ Vec<W> vload(const Dtype* p, int unit) {
  return reinterpret_cast<const Vec<W>*>(p)[unit];
}

template <int W>
__device__ __forceinline__ void vstore(Dtype* p, int unit, const Vec<W>& x) {
  reinterpret_cast<Vec<W>*>(p)[unit] = x;
}

// Channel of unit u of an (outer, dim, inner) view.
template <int W>
__device__ __forceinline__ int vchannel(int unit, int dim, int inner) {
  return (unit * W / inner) % dim;
}
}  // extern "C++"
