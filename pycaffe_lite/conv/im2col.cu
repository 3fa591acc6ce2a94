// im2col / col2im over a whole minibatch of 2-D images, with padding, stride and dilation.
// Image batch: (num, channels, height, width). Column buffer: (channels*kernel_h*kernel_w, num,
// height_col*width_col): row r = (c*kernel_h + i)*kernel_w + j holds, for every image n and
// output pixel (y, x), the input pixel (y*stride_h - pad_h + i*dilation_h,
// x*stride_w - pad_w + j*dilation_w) of channel c, or zero outside the image.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude (col2im sums in Mtype).

// One thread per (c, n, y, x), in that order (x fastest): writes its kernel_h*kernel_w entries.
__global__ void im2col_batch(const int count, const Dtype* data_im, const int num, const int channels,
                             const int height, const int width,
                             const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
                             const int stride_h, const int stride_w,
                             const int dilation_h, const int dilation_w,
                             const int height_col, const int width_col, Dtype* data_col) {
  const int spatial_col = height_col * width_col;
  const int row_stride = num * spatial_col;  // elements between consecutive column rows
  CUDA_KERNEL_LOOP(index, count) {
    const int x = index % width_col;
    const int y = (index / width_col) % height_col;
    const int n = (index / spatial_col) % num;
    const int c = index / row_stride;
    const int h0 = y * stride_h - pad_h;
    const int w0 = x * stride_w - pad_w;
    const Dtype* plane = data_im + (n * channels + c) * height * width;
    // first row of this channel, at (n, y, x)
    Dtype* col = data_col + c * kernel_h * kernel_w * row_stride + n * spatial_col + y * width_col + x;
    for (int i = 0; i < kernel_h; ++i) {
      const int h = h0 + i * dilation_h;
      for (int j = 0; j < kernel_w; ++j) {
        const int w = w0 + j * dilation_w;
        *col = (h >= 0 && h < height && w >= 0 && w < width) ? plane[h * width + w] : Dtype(0);
        col += row_stride;
      }
    }
  }
}

// Adjoint of im2col_batch: one thread per image element (n, c, h, w) sums, without atomics, every
// column entry that read it, and assigns the sum to data_im.
__global__ void col2im_batch(const int count, const Dtype* data_col, const int num, const int channels,
                             const int height, const int width,
                             const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
                             const int stride_h, const int stride_w,
                             const int dilation_h, const int dilation_w,
                             const int height_col, const int width_col, Dtype* data_im) {
  const int spatial_col = height_col * width_col;
  const int row_stride = num * spatial_col;
  CUDA_KERNEL_LOOP(index, count) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int c = (index / (width * height)) % channels;
    const int n = index / (width * height * channels);
    Mtype sum = 0;
    for (int i = 0; i < kernel_h; ++i) {
      const int hs = h + pad_h - i * dilation_h;  // = y * stride_h for the output row y that reads h
      if (hs < 0 || hs % stride_h != 0) continue;
      const int y = hs / stride_h;
      if (y >= height_col) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int ws = w + pad_w - j * dilation_w;
        if (ws < 0 || ws % stride_w != 0) continue;
        const int x = ws / stride_w;
        if (x >= width_col) continue;
        const int row = (c * kernel_h + i) * kernel_w + j;
        sum += to_m(data_col[row * row_stride + n * spatial_col + y * width_col + x]);
      }
    }
    data_im[index] = from_m(sum);
  }
}

// col2im_batch without dilation, threads laid out by stride phase: index -> (n, c, ph, pw, hq, wq),
// pixel (h, w) = (ph + stride_h*hq, pw + stride_w*wq) over phase planes of ceil(H/sh) x ceil(W/sw)
// (positions past the image do nothing; count = num*C*sh*sw*ceil(H/sh)*ceil(W/sw)). Within a phase
// every thread reads the same taps, i = (ph + pad_h) % sh + sh*u (and likewise j), at output rows
// and columns that step down by one per tap: no per-tap divisibility tests, and a warp's consecutive
// wq read consecutive columns of a column-buffer row (coalesced) where col2im_batch leaves stride-1
// lanes of every stride idle per tap.
__global__ void col2im_batch_phased(const int count, const Dtype* data_col, const int num, const int channels,
                                    const int height, const int width, const int kernel_h, const int kernel_w,
                                    const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                                    const int height_col, const int width_col, Dtype* data_im) {
  const int spatial_col = height_col * width_col;
  const int row_stride = num * spatial_col;
  const int hq_n = (height + stride_h - 1) / stride_h, wq_n = (width + stride_w - 1) / stride_w;
  CUDA_KERNEL_LOOP(index, count) {
    const int wq = index % wq_n;
    int rest = index / wq_n;
    const int hq = rest % hq_n;
    rest /= hq_n;
    const int pw = rest % stride_w;
    rest /= stride_w;
    const int ph = rest % stride_h;
    rest /= stride_h;
    const int c = rest % channels, n = rest / channels;
    const int h = ph + stride_h * hq, w = pw + stride_w * wq;
    if (h >= height || w >= width) continue;
    const int i0 = (ph + pad_h) % stride_h, j0 = (pw + pad_w) % stride_w;
    const int y0 = hq + (ph + pad_h - i0) / stride_h, x0 = wq + (pw + pad_w - j0) / stride_w;
    const Dtype* col = data_col + (long long)n * spatial_col;
    Mtype sum = 0;
    for (int i = i0, y = y0; i < kernel_h; i += stride_h, --y) {
      if ((unsigned)y >= (unsigned)height_col) continue;
      for (int j = j0, x = x0; j < kernel_w; j += stride_w, --x) {
        if ((unsigned)x >= (unsigned)width_col) continue;
        sum += to_m(col[(long long)((c * kernel_h + i) * kernel_w + j) * row_stride + y * width_col + x]);
      }
    }
    data_im[((long long)(n * channels + c) * height + h) * width + w] = from_m(sum);
  }
}

// Raw<BYTES>::T: a BYTES-wide plain type, for moving BYTES / sizeof(Dtype) values in one load or store.
extern "C++" {
template <int BYTES> struct Raw;
template <> struct Raw<16> { typedef uint4 T; };
template <> struct Raw<8> { typedef uint2 T; };
template <> struct Raw<4> { typedef unsigned T; };

// Values per BYTES-wide unit (1 where BYTES < sizeof(Dtype): such kernels compile but are never launched).
template <int BYTES>
struct Units {
  static const int V = BYTES >= (int)sizeof(Dtype) ? BYTES / (int)sizeof(Dtype) : 1;
};

// d[j] = s[j] for j in unit k of a row of n values (j in [k*V, k*V + V) and j < n): one BYTES-wide
// load where vs (s aligned to BYTES) and one store where vd (d aligned to BYTES), element by element
// otherwise, and for the row's last, partial unit (nothing past n is read or written).
template <int BYTES>
__device__ __forceinline__ void copy_unit(const Dtype* s, Dtype* d, const int k, const int n, const int vs,
                                          const int vd) {
  const int V = Units<BYTES>::V;
  typedef typename Raw<BYTES>::T T;
  const int j = k * V;
  if (n - j < V) {  // (not j + V > n: n may be near INT_MAX)
    for (int e = j; e < n; ++e) d[e] = s[e];
    return;
  }
  if (vs && vd) {
    *reinterpret_cast<T*>(d + j) = *reinterpret_cast<const T*>(s + j);
    return;
  }
  __align__(16) Dtype buf[V];
  if (vs) {
    *reinterpret_cast<T*>(buf) = *reinterpret_cast<const T*>(s + j);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) buf[e] = s[j + e];
  }
  if (vd) {
    *reinterpret_cast<T*>(d + j) = *reinterpret_cast<const T*>(buf);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) d[j + e] = buf[e];
  }
}

// Rows of the 2-D/3-D launches below: x (blockIdx.x, threadIdx.x) runs over the units of a row,
// y (blockIdx.y, threadIdx.y) over rows (planes or leading-axis entries), z over a second row axis;
// every axis loops grid-stride, so no position is ever divided out of a flat index.
#define COPY_UNITS_LOOP(k, units) \
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < (units); k += blockDim.x * gridDim.x)
#define COPY_ROWS_LOOP(r, rows) \
  for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < (rows); r += blockDim.y * gridDim.y)

// swap_leading_axes below, unit by unit: z over b, y over a, x over the units of inner.
template <int BYTES>
__device__ __forceinline__ void swap_leading_axes_vec(const Dtype* in, const int a_dim, const int b_dim,
                                                      const int inner, const int vec, Dtype* out) {
  const int units = inner / Units<BYTES>::V + (inner % Units<BYTES>::V != 0);
  for (int b = blockIdx.z; b < b_dim; b += gridDim.z) {
    COPY_ROWS_LOOP(a, a_dim) {
      const Dtype* s = in + ((long long)a * b_dim + b) * inner;
      Dtype* d = out + ((long long)b * a_dim + a) * inner;
      COPY_UNITS_LOOP(k, units) copy_unit<BYTES>(s, d, k, inner, vec, vec);
    }
  }
}

// copy_planes below, unit by unit: y over planes, x over the units of a plane.
template <int BYTES>
__device__ __forceinline__ void copy_planes_vec(const int planes, const Dtype* src, const int src_stride,
                                                const int plane, const int dst_stride, Dtype* dst,
                                                const int vec_src, const int vec_dst) {
  const int units = plane / Units<BYTES>::V + (plane % Units<BYTES>::V != 0);
  COPY_ROWS_LOOP(p, planes) {
    const Dtype* s = src + (long long)p * src_stride;
    Dtype* d = dst + (long long)p * dst_stride;
    COPY_UNITS_LOOP(k, units) copy_unit<BYTES>(s, d, k, plane, vec_src, vec_dst);
  }
}
}  // extern "C++"

// out(b, a, s) = in(a, b, s): swaps the two leading axes of an (a_dim, b_dim, inner) array, e.g.
// (num, channels, spatial) <-> (channels, num, spatial). Launched 3-D (block (X, Y), grid (units of
// inner, a, b), see above); units of BYTES / sizeof(Dtype) values move as one load and store where
// vec (in, out and inner * sizeof(Dtype) all multiples of BYTES), element by element otherwise.
__global__ void swap_leading_axes_16b(const Dtype* in, const int a_dim, const int b_dim, const int inner,
                                      const int vec, Dtype* out) {
  swap_leading_axes_vec<16>(in, a_dim, b_dim, inner, vec, out);
}
__global__ void swap_leading_axes_8b(const Dtype* in, const int a_dim, const int b_dim, const int inner,
                                     const int vec, Dtype* out) {
  swap_leading_axes_vec<8>(in, a_dim, b_dim, inner, vec, out);
}
__global__ void swap_leading_axes_4b(const Dtype* in, const int a_dim, const int b_dim, const int inner,
                                     const int vec, Dtype* out) {
  swap_leading_axes_vec<4>(in, a_dim, b_dim, inner, vec, out);
}

// dst (planes, dst_stride)[:, :plane] = src (planes, src_stride)[:, :plane]: planes of `plane` values
// between buffers whose planes start `src_stride` / `dst_stride` values apart (a 1x1 convolution's
// planes padded to an aligned leading dimension for cuBLAS, and back). Other values of dst stay.
// Launched 2-D (grid (units of a plane, planes)); a unit's BYTES / sizeof(Dtype) values are read in
// one load where vec_src (src and src_stride * sizeof(Dtype) multiples of BYTES) and written in one
// store where vec_dst (the same for dst), element by element otherwise (a plane's last, partial unit
// always: nothing of dst past `plane` is written, nothing of src past it read).
__global__ void copy_planes_16b(const int planes, const Dtype* src, const int src_stride, const int plane,
                                const int dst_stride, Dtype* dst, const int vec_src, const int vec_dst) {
  copy_planes_vec<16>(planes, src, src_stride, plane, dst_stride, dst, vec_src, vec_dst);
}
__global__ void copy_planes_8b(const int planes, const Dtype* src, const int src_stride, const int plane,
                               const int dst_stride, Dtype* dst, const int vec_src, const int vec_dst) {
  copy_planes_vec<8>(planes, src, src_stride, plane, dst_stride, dst, vec_src, vec_dst);
}
__global__ void copy_planes_4b(const int planes, const Dtype* src, const int src_stride, const int plane,
                               const int dst_stride, Dtype* dst, const int vec_src, const int vec_dst) {
  copy_planes_vec<4>(planes, src, src_stride, plane, dst_stride, dst, vec_src, vec_dst);
}

// A strided 1x1 convolution's input, subsampled: y (N*C, oh, ow) = x (N*C, h, w)[:, ::sh, ::sw].
// The scalar kernel (one output value a thread, its position divided out of the index): for counts
// no vector kernel below tiles, or a y they cannot store to.
__global__ void subsample_planes(const int count, const Dtype* x, const int h, const int w, const int oh,
                                 const int ow, const int sh, const int sw, Dtype* y) {
  CUDA_KERNEL_LOOP(i, count) {
    const int ox = i % ow;
    const int t = i / ow;
    const int oy = t % oh;
    const int nc = t / oh;
    y[i] = x[((long long)nc * h + oy * sh) * w + ox * sw];
  }
}

// subsample_planes with each thread writing V = BYTES / sizeof(Dtype) consecutive values of y in one
// BYTES-wide store (count % V == 0, y aligned to BYTES): the position of its first value is divided
// out once, the next ones follow by counters across rows and planes.
extern "C++" {
template <int BYTES>
__device__ __forceinline__ void subsample_planes_vec(const int vcount, const Dtype* x, const int h, const int w,
                                                     const int oh, const int ow, const int sh, const int sw,
                                                     Dtype* y) {
  const int V = Units<BYTES>::V;
  const long long row_step = (long long)sh * w, plane_step = (long long)h * w;
  CUDA_KERNEL_LOOP(v, vcount) {
    const int i = v * V;
    const int t = i / ow, nc = t / oh;
    int ox = i - t * ow, oy = t - nc * oh;
    long long plane = nc * plane_step, row = plane + oy * row_step;
    __align__(16) Dtype out[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      out[e] = x[row + (long long)ox * sw];
      if (++ox == ow) {  // next row (and plane)
        ox = 0, row += row_step;
        if (++oy == oh) oy = 0, plane += plane_step, row = plane;
      }
    }
    *reinterpret_cast<typename Raw<BYTES>::T*>(y + i) = *reinterpret_cast<const typename Raw<BYTES>::T*>(out);
  }
}
}  // extern "C++"

__global__ void subsample_planes_16b(const int vcount, const Dtype* x, const int h, const int w, const int oh,
                                     const int ow, const int sh, const int sw, Dtype* y) {
  subsample_planes_vec<16>(vcount, x, h, w, oh, ow, sh, sw, y);
}
__global__ void subsample_planes_8b(const int vcount, const Dtype* x, const int h, const int w, const int oh,
                                    const int ow, const int sh, const int sw, Dtype* y) {
  subsample_planes_vec<8>(vcount, x, h, w, oh, ow, sh, sw, y);
}
__global__ void subsample_planes_4b(const int vcount, const Dtype* x, const int h, const int w, const int oh,
                                    const int ow, const int sh, const int sw, Dtype* y) {
  subsample_planes_vec<4>(vcount, x, h, w, oh, ow, sh, sw, y);
}

// Its adjoint: x (N*C, h, w) = y (N*C, oh, ow) at every (sh, sw)-th pixel, 0 elsewhere (every x written).
__global__ void upsample_planes(const int count, const Dtype* y, const int h, const int w, const int oh,
                                const int ow, const int sh, const int sw, Dtype* x) {
  CUDA_KERNEL_LOOP(i, count) {
    const int ix = i % w;
    const int t = i / w;
    const int iy = t % h;
    const int nc = t / h;
    const int oy = iy / sh, ox = ix / sw;
    x[i] = (iy % sh == 0 && ix % sw == 0 && oy < oh && ox < ow) ? y[((long long)nc * oh + oy) * ow + ox]
                                                                 : from_m(Mtype(0));
  }
}

// upsample_planes with each thread writing V = BYTES / sizeof(Dtype) consecutive elements of x in one
// BYTES-wide store (count % V == 0, x aligned to BYTES): the pixel position advances by counters,
// not by divisions per element (the scalar kernel is bound by its integer divisions).
extern "C++" {
template <int BYTES>
__device__ __forceinline__ void upsample_planes_vec(const int vcount, const Dtype* y, const int h, const int w,
                                                    const int oh, const int ow, const int sh, const int sw, Dtype* x) {
  const int V = Units<BYTES>::V;
  CUDA_KERNEL_LOOP(v, vcount) {
    const int i = v * V;
    const int ix = i % w, t = i / w, iy = t % h;
    long long row = (long long)(t / h) * oh;  // (nc * oh): the first y row of this plane
    int ox = ix / sw, rx = ix - ox * sw, oy = iy / sh, ry = iy - oy * sh, col = ix;
    __align__(16) Dtype out[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      out[e] = (ry == 0 && rx == 0 && oy < oh && ox < ow) ? y[(row + oy) * ow + ox] : from_m(Mtype(0));
      if (++rx == sw) rx = 0, ++ox;
      if (++col == w) {  // next row (and plane)
        col = 0, rx = 0, ox = 0;
        if (++ry == sh) ry = 0, ++oy;
        if (oy * sh + ry == h) oy = 0, ry = 0, row += oh;
      }
    }
    *reinterpret_cast<typename Raw<BYTES>::T*>(x + i) = *reinterpret_cast<const typename Raw<BYTES>::T*>(out);
  }
}
}  // extern "C++"

__global__ void upsample_planes_16b(const int vcount, const Dtype* y, const int h, const int w, const int oh,
                                    const int ow, const int sh, const int sw, Dtype* x) {
  upsample_planes_vec<16>(vcount, y, h, w, oh, ow, sh, sw, x);
}
__global__ void upsample_planes_8b(const int vcount, const Dtype* y, const int h, const int w, const int oh,
                                   const int ow, const int sh, const int sw, Dtype* x) {
  upsample_planes_vec<8>(vcount, y, h, w, oh, ow, sh, sw, x);
}
__global__ void upsample_planes_4b(const int vcount, const Dtype* y, const int h, const int w, const int oh,
                                   const int ow, const int sh, const int sw, Dtype* x) {
  upsample_planes_vec<4>(vcount, y, h, w, oh, ow, sh, sw, x);
}
