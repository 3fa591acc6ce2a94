// MAX and AVE pooling over (planes, height, width) with Caffe's window clipping.
// Top window (ph, pw) covers rows [ph*stride_h - pad_h, +kernel_h) and the same for columns.
// MAX reads only the part inside the image; AVE sums that part and divides by the window area
// clipped to the padded image (height + pad_h, width + pad_w), as Caffe does.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; maxima, sums and
// quotients are in Mtype.
#include "vec.cuh"

#define POOL_LOWEST ((Mtype)-3.402823466e+38f)  // -FLT_MAX: the value of a window with no input

#define POOL_GEOMETRY_ARGS                                                                   \
  const int height, const int width, const int pooled_h, const int pooled_w,                 \
      const int kernel_h, const int kernel_w, const int stride_h, const int stride_w,        \
      const int pad_h, const int pad_w

// The window of top element index: its plane, position (ph, pw) and the bottom rows
// [hstart, hend) and columns [wstart, wend) it reads (clipped to the image).
struct PoolWindow {
  int plane, ph, pw, hstart, wstart, hend, wend;
};

__device__ PoolWindow pool_window(const int index, POOL_GEOMETRY_ARGS) {
  PoolWindow win;
  win.pw = index % pooled_w;
  win.ph = (index / pooled_w) % pooled_h;
  win.plane = index / (pooled_w * pooled_h);
  win.hstart = max(win.ph * stride_h - pad_h, 0);
  win.wstart = max(win.pw * stride_w - pad_w, 0);
  win.hend = min(win.ph * stride_h - pad_h + kernel_h, height);
  win.wend = min(win.pw * stride_w - pad_w + kernel_w, width);
  return win;
}

// One thread per top element: the maximum and its index h*width + w in the bottom plane (-1 if
// the window holds no input). The first maximum in row-major order wins.
__global__ void max_pool_forward(const int count, const Dtype* bottom, POOL_GEOMETRY_ARGS,
                                 Dtype* top, int* mask) {
  CUDA_KERNEL_LOOP(index, count) {
    const PoolWindow win = pool_window(index, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                                       stride_h, stride_w, pad_h, pad_w);
    const Dtype* x = bottom + win.plane * height * width;
    Mtype best = POOL_LOWEST;
    int arg = -1;
    for (int h = win.hstart; h < win.hend; ++h) {
      for (int w = win.wstart; w < win.wend; ++w) {
        if (to_m(x[h * width + w]) > best) {
          best = to_m(x[h * width + w]);
          arg = h * width + w;
        }
      }
    }
    top[index] = from_m(best);
    mask[index] = arg;
  }
}

// Caffe's AVE divisor: the window area clipped to the padded image (positive when the window
// holds input; ave_pool_forward writes 0 for a window that holds none instead of dividing).
__device__ int ave_pool_size(const int ph, const int pw, POOL_GEOMETRY_ARGS) {
  const int hstart = ph * stride_h - pad_h;
  const int wstart = pw * stride_w - pad_w;
  const int hend = min(hstart + kernel_h, height + pad_h);
  const int wend = min(wstart + kernel_w, width + pad_w);
  return (hend - hstart) * (wend - wstart);
}

__global__ void ave_pool_forward(const int count, const Dtype* bottom, POOL_GEOMETRY_ARGS, Dtype* top) {
  CUDA_KERNEL_LOOP(index, count) {
    const PoolWindow win = pool_window(index, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                                       stride_h, stride_w, pad_h, pad_w);
    const Dtype* x = bottom + win.plane * height * width;
    Mtype sum = 0;
    for (int h = win.hstart; h < win.hend; ++h) {
      for (int w = win.wstart; w < win.wend; ++w) {
        sum += to_m(x[h * width + w]);
      }
    }
    const int size = ave_pool_size(win.ph, win.pw, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                                   stride_h, stride_w, pad_h, pad_w);
    top[index] = from_m((win.hstart < win.hend && win.wstart < win.wend) ? sum / size : Mtype(0));
  }
}

// Backward: a gather, no atomics. One thread per bottom position (h, w) and group of
// POOL_BACKWARD_PLANES consecutive planes: work item (group * height + h) * width + w, so a warp
// writes consecutive w of one row (coalesced). The range of top windows covering (h, w) is the
// same in every plane, so its integer divisions are done once per thread; the innermost loop over
// the group's planes makes independent loads (ILP). Launched with the item count only.
#define POOL_BACKWARD_PLANES 4

extern "C++" {
template <bool MAX>
__device__ void pool_backward(const int count, const int planes, const Dtype* top_diff, const int* mask,
                              POOL_GEOMETRY_ARGS, Dtype* bottom_diff) {
  const int top_plane = pooled_h * pooled_w, bottom_plane = height * width;
  CUDA_KERNEL_LOOP(index, count) {
    const int row = index / width;
    const int w = index - row * width;
    const int group = row / height;
    const int h = row - group * height;
    const int plane0 = group * POOL_BACKWARD_PLANES;
    const int nplanes = min(planes - plane0, POOL_BACKWARD_PLANES);
    // top windows whose (unclipped) span holds the row / column, as in Caffe's MaxPoolBackward
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_w);
    const int target = h * width + w;
    const int top0 = plane0 * top_plane;
    Mtype grad[POOL_BACKWARD_PLANES];
#pragma unroll
    for (int k = 0; k < POOL_BACKWARD_PLANES; ++k) grad[k] = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int t = top0 + ph * pooled_w + pw;
        if (MAX) {
#pragma unroll
          for (int k = 0; k < POOL_BACKWARD_PLANES; ++k) {
            if (k < nplanes && mask[t + k * top_plane] == target) grad[k] += to_m(top_diff[t + k * top_plane]);
          }
        } else {
          const Mtype size = ave_pool_size(ph, pw, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                                           stride_h, stride_w, pad_h, pad_w);
#pragma unroll
          for (int k = 0; k < POOL_BACKWARD_PLANES; ++k) {
            if (k < nplanes) grad[k] += to_m(top_diff[t + k * top_plane]) / size;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < POOL_BACKWARD_PLANES; ++k) {
      if (k < nplanes) bottom_diff[(plane0 + k) * bottom_plane + target] = from_m(grad[k]);
    }
  }
}
}  // extern "C++"

// count = ceil(planes / POOL_BACKWARD_PLANES) * height * width. Sums the diffs of the top windows
// that contain the element and chose it (mask).
__global__ void max_pool_backward(const int count, const int planes, const Dtype* top_diff, const int* mask,
                                  POOL_GEOMETRY_ARGS, Dtype* bottom_diff) {
  pool_backward<true>(count, planes, top_diff, mask, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                      stride_h, stride_w, pad_h, pad_w, bottom_diff);
}

// count as for max_pool_backward. Sums top_diff / pool_size over the windows that contain the element.
__global__ void ave_pool_backward(const int count, const int planes, const Dtype* top_diff, POOL_GEOMETRY_ARGS,
                                  Dtype* bottom_diff) {
  pool_backward<false>(count, planes, top_diff, nullptr, height, width, pooled_h, pooled_w, kernel_h,
                       kernel_w, stride_h, stride_w, pad_h, pad_w, bottom_diff);
}

// Blocked backward for equal strides S and at most WD windows per axis meeting a block
// (WD >= ceil(kernel / S)): one thread per (plane, block row bh, block column bw). Block (bh, bw)
// owns the bottom rows [bh*S - pad_h, +S) and columns [bw*S - pad_w, +S) inside the image, so every
// bottom pixel has exactly one owner; the windows meeting the block are ph in [bh-WD+1, bh] and
// pw in [bw-WD+1, bw] (clipped to the top plane). Each window's diff (and MAX's argmax) is loaded
// once for the S*S pixels it may feed; every pixel sums the windows that chose it (MAX) or contain
// it (AVE, divided by the window's size) in Caffe's order, ph then pw ascending, so the result is
// the gather's, bit for bit (AVE's quotients via pool_ave_div). count = planes * blocks_h * blocks_w.
// AVE's x / size, rounded as the division: for a window of the full area kernel_h * kernel_w (all
// but the clipped edge windows) by a multiply with inv_area = RN(1 / area) and Markstein's
// residual correction (two FMAs), which yields the correctly rounded quotient when neither
// underflow nor overflow occurs (checked exhaustively for every float significand and divisors
// 1..64 on the host); tiny, huge and non-finite x, and the other sizes, divide. In Mtype.
__device__ __forceinline__ Mtype pool_ave_div(const Mtype x, const int size, const int area, const Mtype inv_area) {
  const Mtype lo = sizeof(Mtype) == 4 ? Mtype(1e-25) : Mtype(1e-280);
  const Mtype hi = sizeof(Mtype) == 4 ? Mtype(1e30) : Mtype(1e300);
  const Mtype a = fabs(x);
  if (size != area || !(a >= lo && a <= hi)) return x / (Mtype)size;
  const Mtype q = x * inv_area;
  const Mtype r = fma(-q, (Mtype)area, x);
  return fma(r, inv_area, q);
}

extern "C++" {
template <bool MAX, int S, int WD>
__device__ void pool_backward_blocked(const int count, const Dtype* top_diff, const int* mask,
                                      POOL_GEOMETRY_ARGS, const int blocks_h, const int blocks_w,
                                      const Mtype inv_area, Dtype* bottom_diff) {
  const int top_plane = pooled_h * pooled_w;
  CUDA_KERNEL_LOOP(index, count) {
    const int bw = index % blocks_w;
    const int row = index / blocks_w;
    const int bh = row % blocks_h;
    const int plane = row / blocks_h;
    const int h0 = bh * S - pad_h, w0 = bw * S - pad_w;
    // AVE: the clipped extent of the windows' columns (Caffe's divisor is rows x columns)
    int cols[WD];
#pragma unroll
    for (int b = 0; b < WD; ++b) {
      const int left = (bw - WD + 1 + b) * S - pad_w;
      cols[b] = min(left + kernel_w, width + pad_w) - left;
    }
    Mtype grad[S][S];
#pragma unroll
    for (int i = 0; i < S; ++i)
#pragma unroll
      for (int j = 0; j < S; ++j) grad[i][j] = 0;
#pragma unroll
    for (int a = 0; a < WD; ++a) {
      const int ph = bh - WD + 1 + a;
      if (ph < 0 || ph >= pooled_h) continue;
      const int top = ph * S - pad_h;  // the unclipped window's first row
      const int rows = min(top + kernel_h, height + pad_h) - top;
#pragma unroll
      for (int b = 0; b < WD; ++b) {
        const int pw = bw - WD + 1 + b;
        if (pw < 0 || pw >= pooled_w) continue;
        const int t = plane * top_plane + ph * pooled_w + pw;
        if (MAX) {
          // a pixel outside the image may alias another's index: it is never written
          const int arg = mask[t];
          const Mtype d = to_m(top_diff[t]);
#pragma unroll
          for (int i = 0; i < S; ++i)
#pragma unroll
            for (int j = 0; j < S; ++j)
              if (arg == (h0 + i) * width + (w0 + j)) grad[i][j] += d;
        } else {
          // ave_pool_size's value; window (ph, pw) covers pixel (h0 + i, w0 + j) iff
          // 0 <= h0 + i - top = (WD - 1 - a) * S + i < kernel_h (and the same for columns): the
          // same for every block, so the tests are uniform and need no pixel coordinates
          const Mtype d = pool_ave_div(to_m(top_diff[t]), rows * cols[b], kernel_h * kernel_w, inv_area);
#pragma unroll
          for (int i = 0; i < S; ++i)
#pragma unroll
            for (int j = 0; j < S; ++j)
              if ((WD - 1 - a) * S + i < kernel_h && (WD - 1 - b) * S + j < kernel_w) grad[i][j] += d;
        }
      }
    }
    Dtype* dx = bottom_diff + plane * height * width;
#pragma unroll
    for (int i = 0; i < S; ++i)
#pragma unroll
      for (int j = 0; j < S; ++j)
        if (h0 + i >= 0 && h0 + i < height && w0 + j >= 0 && w0 + j < width)
          dx[(h0 + i) * width + w0 + j] = from_m(grad[i][j]);
  }
}
}  // extern "C++"

// AVE's blocked backward kept at <= 40 registers (6 blocks of 256 threads an SM; 48 otherwise, for
// the quotients' division fallback): H200, 32x64x112x112 3x3/2 pad 1, 0.083 -> 0.069 ms.
#ifdef __CUDACC__
#define POOL_AVE_BOUNDS __launch_bounds__(256, 6)
#else
#define POOL_AVE_BOUNDS
#endif
#define POOL_BACKWARD_BLOCKED(S, WD)                                                               \
  __global__ void max_pool_backward_s##S##_w##WD(const int count, const Dtype* top_diff, const int* mask,  \
                                                 POOL_GEOMETRY_ARGS, const int blocks_h,           \
                                                 const int blocks_w, Dtype* bottom_diff) {          \
    pool_backward_blocked<true, S, WD>(count, top_diff, mask, height, width, pooled_h, pooled_w,   \
                                       kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,       \
                                       blocks_h, blocks_w, Mtype(0), bottom_diff);                 \
  }                                                                                                \
  __global__ void POOL_AVE_BOUNDS ave_pool_backward_s##S##_w##WD(const int count, const Dtype* top_diff,           \
                                                 POOL_GEOMETRY_ARGS, const int blocks_h,           \
                                                 const int blocks_w, const Mtype inv_area,         \
                                                 Dtype* bottom_diff) {                             \
    pool_backward_blocked<false, S, WD>(count, top_diff, nullptr, height, width, pooled_h, pooled_w, \
                                        kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,      \
                                        blocks_h, blocks_w, Mtype(inv_area), bottom_diff);         \
  }

POOL_BACKWARD_BLOCKED(2, 1)  // 2x2 stride 2 (VGG, LeNet)
POOL_BACKWARD_BLOCKED(2, 2)  // 3x3 stride 2 (ResNet, GoogLeNet, SqueezeNet, AlexNet)
POOL_BACKWARD_BLOCKED(1, 3)  // 3x3 stride 1 (GoogLeNet's inception pools)

// AVE's blocked backward with 4-wide stores, for width % 4 == 0 and bottom_diff aligned to 4
// elements (the row starts are then aligned too): one thread per (plane, strip of R block rows,
// column quad q). The strip holds block rows bh0 .. bh0 + R - 1 (bh0 = strip * R; block row bh is
// the bottom rows [bh * S - pad_h, +S), as in pool_backward_blocked), the quad the columns
// [4q, 4q + 4). The windows meeting them: ph in [bh0 - WD + 1, bh0 + R - 1] and pw from pw0 (the
// first whose span reaches column 4q, the gather's pwstart) up to NW of them (NW >=
// ceil((kernel_w + 3) / S): every window meeting 4 columns), clipped to the top plane. Each
// window's quotient (pool_ave_div) is computed once; every pixel adds the windows containing it in
// (ph, pw) ascending order, so the result is the gather's, bit for bit. Rows outside the image are
// not stored. count = planes * strips * (width / 4).
extern "C++" {
template <int S, int WD, int NW, int R>
__device__ void ave_pool_backward_quad(const int count, const Dtype* top_diff, POOL_GEOMETRY_ARGS,
                                       const int strips, const Mtype inv_area, Dtype* bottom_diff) {
  const int quads = width >> 2, area = kernel_h * kernel_w;
  CUDA_KERNEL_LOOP(index, count) {
    const int q = index % quads;
    const int row = index / quads;
    const int strip = row % strips;
    const int plane = row / strips;
    const int bh0 = strip * R;
    const int h0 = bh0 * S - pad_h, c0 = 4 * q;
    const int pw0 = c0 + pad_w < kernel_w ? 0 : (c0 + pad_w - kernel_w) / S + 1;
    const Dtype* dy = top_diff + plane * pooled_h * pooled_w;
    Mtype grad[R * S][4];
#pragma unroll
    for (int y = 0; y < R * S; ++y)
#pragma unroll
      for (int j = 0; j < 4; ++j) grad[y][j] = 0;
#pragma unroll
    for (int a = 0; a < WD + R - 1; ++a) {
      const int ph = bh0 - WD + 1 + a;
      if (ph < 0 || ph >= pooled_h) continue;
      const int top = ph * S - pad_h;
      const int rows = min(top + kernel_h, height + pad_h) - top;
#pragma unroll
      for (int b = 0; b < NW; ++b) {
        const int pw = pw0 + b;
        const int left = pw * S - pad_w;
        if (pw >= pooled_w || left > c0 + 3) continue;
        const int cols = min(left + kernel_w, width + pad_w) - left;
        const Mtype d = pool_ave_div(to_m(dy[ph * pooled_w + pw]), rows * cols, area, inv_area);
#pragma unroll
        for (int y = 0; y < R * S; ++y) {
          const int oy = (WD - 1 - a) * S + y;  // pixel row h0 + y in the window: h0 + y - top
          if (oy < 0 || oy >= kernel_h) continue;
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (c0 + j >= left && c0 + j < left + kernel_w) grad[y][j] += d;
        }
      }
    }
    Dtype* dx = bottom_diff + plane * height * width + c0;
#pragma unroll
    for (int y = 0; y < R * S; ++y) {
      if (h0 + y < 0 || h0 + y >= height) continue;
      Vec<4> v;
#pragma unroll
      for (int j = 0; j < 4; ++j) v.v[j] = from_m(grad[y][j]);
      vstore<4>(dx + (h0 + y) * width, 0, v);
    }
  }
}
}  // extern "C++"

#define AVE_POOL_BACKWARD_QUAD(S, WD, NW, R)                                                        \
  __global__ void ave_pool_backward_q_s##S##_w##WD##_n##NW##_r##R(                                  \
      const int count, const Dtype* top_diff, POOL_GEOMETRY_ARGS, const int strips,                 \
      const Mtype inv_area, Dtype* bottom_diff) {                                                   \
    ave_pool_backward_quad<S, WD, NW, R>(count, top_diff, height, width, pooled_h, pooled_w,        \
                                         kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,      \
                                         strips, Mtype(inv_area), bottom_diff);                     \
  }

// R timed on an H200 (2026-11-26, AVE backward, R = 1 / 2): 2x2/2 at 32x256x56x56 34.9 / 40.5 us;
// 3x3/2 pad 1 at 32x64x112x112 59.0 / 54.1 us (73.7 before, pool_backward_blocked); 3x3/1 pad 1 at
// 32x192x28x28 39.0 / 36.1 us (70.4 before).
AVE_POOL_BACKWARD_QUAD(2, 1, 3, 1)  // 2x2 stride 2
AVE_POOL_BACKWARD_QUAD(2, 2, 3, 2)  // 3x3 stride 2, two block rows (4 bottom rows) a thread
AVE_POOL_BACKWARD_QUAD(1, 3, 6, 2)  // 3x3 stride 1, two rows a thread

// The MAX mask as a Dtype top blob (Caffe's optional second top).
__global__ void pool_mask_to_dtype(const int count, const int* mask, Dtype* out) {
  CUDA_KERNEL_LOOP(index, count) {
    out[index] = (Dtype)mask[index];
  }
}
