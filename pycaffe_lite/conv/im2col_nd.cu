// im2col / col2im for N-D convolutions of up to three spatial axes (fewer axes are given as leading
// axes of size 1 with kernel 1, pad 0, stride 1, dilation 1). Image batch: (num, channels, d0, d1, d2).
// Columns: (num, channels*k0*k1*k2, o0*o1*o2), BVLC's im2col_nd order per image: row
// (c*k0 + a)*k1*k2 + b*k2 + e holds, for every output position (x0, x1, x2), the input element
// (x0*s0 - p0 + a*l0, x1*s1 - p1 + b*l1, x2*s2 - p2 + e*l2) of channel c, or zero outside the image.
// A call covers the output slab x0 in [x0_begin, x0_begin + x0_rows) (the whole output when x0_rows is
// o0): the columns then are (num, channels*k0*k1*k2, x0_rows*o1*o2), so large volumes can be done in
// slabs. Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

// One thread per (n, c, x0, x1, x2) of the slab, x2 fastest: writes its k0*k1*k2 column entries.
__global__ void im2col_nd3(const int count, const Dtype* im, const int d0, const int d1, const int d2,
                           const int o0, const int o1, const int o2, const int k0, const int k1, const int k2,
                           const int p0, const int p1, const int p2, const int s0, const int s1, const int s2,
                           const int l0, const int l1, const int l2, const int x0_begin, const int x0_rows,
                           Dtype* col) {
  const int slab = x0_rows * o1 * o2;
  const int kernel_size = k0 * k1 * k2;
  CUDA_KERNEL_LOOP(index, count) {
    const int o = index % slab;
    const int nc = index / slab;  // image * channels + channel
    const int x2 = o % o2;
    const int x1 = (o / o2) % o1;
    const int x0 = x0_begin + o / (o1 * o2);
    const Dtype* src = im + nc * d0 * d1 * d2;
    Dtype* dst = col + nc * kernel_size * slab + o;
    for (int a = 0; a < k0; ++a) {
      const int i0 = x0 * s0 - p0 + a * l0;
      const bool in0 = i0 >= 0 && i0 < d0;
      for (int b = 0; b < k1; ++b) {
        const int i1 = x1 * s1 - p1 + b * l1;
        const bool in1 = in0 && i1 >= 0 && i1 < d1;
        for (int e = 0; e < k2; ++e) {
          const int i2 = x2 * s2 - p2 + e * l2;
          *dst = (in1 && i2 >= 0 && i2 < d2) ? src[(i0 * d1 + i1) * d2 + i2] : Dtype(0);
          dst += slab;
        }
      }
    }
  }
}

// Adjoint of im2col_nd3 for one slab: one thread per image element (n, c, i0, i1, i2) sums, without
// atomics, the slab's column entries that read it, and assigns the sum to im (accumulate == 0) or adds
// it (accumulate != 0, the later slabs).
__global__ void col2im_nd3(const int count, const Dtype* col, const int d0, const int d1, const int d2,
                           const int o0, const int o1, const int o2, const int k0, const int k1, const int k2,
                           const int p0, const int p1, const int p2, const int s0, const int s1, const int s2,
                           const int l0, const int l1, const int l2, const int x0_begin, const int x0_rows,
                           const int accumulate, Dtype* im) {
  const int slab = x0_rows * o1 * o2;
  const int kernel_size = k0 * k1 * k2;
  CUDA_KERNEL_LOOP(index, count) {
    const int i2 = index % d2;
    const int i1 = (index / d2) % d1;
    const int i0 = (index / (d1 * d2)) % d0;
    const int nc = index / (d0 * d1 * d2);
    const Dtype* src = col + nc * kernel_size * slab;
    Mtype sum = 0;  // in Mtype (to_m / from_m from the backend prelude)
    for (int a = 0; a < k0; ++a) {
      const int t0 = i0 + p0 - a * l0;  // = x0 * s0 for the output x0 that reads i0
      if (t0 < 0 || t0 % s0 != 0) continue;
      const int x0 = t0 / s0 - x0_begin;
      if (x0 < 0 || x0 >= x0_rows) continue;
      for (int b = 0; b < k1; ++b) {
        const int t1 = i1 + p1 - b * l1;
        if (t1 < 0 || t1 % s1 != 0 || t1 / s1 >= o1) continue;
        for (int e = 0; e < k2; ++e) {
          const int t2 = i2 + p2 - e * l2;
          if (t2 < 0 || t2 % s2 != 0 || t2 / s2 >= o2) continue;
          const int row = (a * k1 + b) * k2 + e;
          sum += to_m(src[row * slab + (x0 * o1 + t1 / s1) * o2 + t2 / s2]);
        }
      }
    }
    im[index] = from_m(accumulate ? to_m(im[index]) + sum : sum);
  }
}
