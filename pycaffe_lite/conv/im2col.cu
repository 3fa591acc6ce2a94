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

// out(b, a, s) = in(a, b, s): swaps the two leading axes of an (a_dim, b_dim, inner) array, e.g.
// (num, channels, spatial) <-> (channels, num, spatial).
__global__ void swap_leading_axes(const int count, const Dtype* in, const int a_dim, const int b_dim,
                                  const int inner, Dtype* out) {
  CUDA_KERNEL_LOOP(index, count) {
    const int s = index % inner;
    const int a = (index / inner) % a_dim;
    const int b = index / (inner * a_dim);
    out[index] = in[(a * b_dim + b) * inner + s];
  }
}

// dst (planes, dst_stride)[:, :plane] = src (planes, src_stride)[:, :plane]: planes of `plane` values
// between buffers whose planes start `src_stride` / `dst_stride` values apart (a 1x1 convolution's
// planes padded to an aligned leading dimension for cuBLAS, and back). Other values of dst stay.
__global__ void copy_planes(const int count, const Dtype* src, const int src_stride, const int plane,
                            const int dst_stride, Dtype* dst) {
  CUDA_KERNEL_LOOP(i, count) {
    const int p = i / plane, j = i - p * plane;
    dst[(long long)p * dst_stride + j] = src[(long long)p * src_stride + j];
  }
}

// A strided 1x1 convolution's input, subsampled: y (N*C, oh, ow) = x (N*C, h, w)[:, ::sh, ::sw].
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
template <int BYTES> struct UpsampleVec;
template <> struct UpsampleVec<16> { typedef uint4 T; };
template <> struct UpsampleVec<8> { typedef uint2 T; };
template <> struct UpsampleVec<4> { typedef unsigned T; };

template <int BYTES>
__device__ __forceinline__ void upsample_planes_vec(const int vcount, const Dtype* y, const int h, const int w,
                                                    const int oh, const int ow, const int sh, const int sw, Dtype* x) {
  const int V = BYTES >= (int)sizeof(Dtype) ? BYTES / (int)sizeof(Dtype) : 1;  // (double: never launched below 16)
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
    *reinterpret_cast<typename UpsampleVec<BYTES>::T*>(x + i) = *reinterpret_cast<const typename UpsampleVec<BYTES>::T*>(out);
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
