// MAX and AVE pooling over (planes, height, width) with Caffe's window clipping.
// Top window (ph, pw) covers rows [ph*stride_h - pad_h, +kernel_h) and the same for columns.
// MAX reads only the part inside the image; AVE sums that part and divides by the window area
// clipped to the padded image (height + pad_h, width + pad_w), as Caffe does.
// Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

#define POOL_LOWEST ((Dtype)-3.402823466e+38f)  // -FLT_MAX: the value of a window with no input

#define POOL_GEOMETRY_ARGS                                                                   \
  const int height, const int width, const int pooled_h, const int pooled_w,                 \
      const int kernel_h, const int kernel_w, const int stride_h, const int stride_w,        \
      const int pad_h, const int pad_w

// One thread per top element: the maximum and its index h*width + w in the bottom plane (-1 if
// the window holds no input). The first maximum in row-major order wins.
__global__ void max_pool_forward(const int count, const Dtype* bottom, POOL_GEOMETRY_ARGS,
                                 Dtype* top, int* mask) {
  CUDA_KERNEL_LOOP(index, count) {
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / (pooled_w * pooled_h);
    const int hstart = max(ph * stride_h - pad_h, 0);
    const int wstart = max(pw * stride_w - pad_w, 0);
    const int hend = min(ph * stride_h - pad_h + kernel_h, height);
    const int wend = min(pw * stride_w - pad_w + kernel_w, width);
    const Dtype* x = bottom + plane * height * width;
    Dtype best = POOL_LOWEST;
    int arg = -1;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (x[h * width + w] > best) {
          best = x[h * width + w];
          arg = h * width + w;
        }
      }
    }
    top[index] = best;
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
    const int pw = index % pooled_w;
    const int ph = (index / pooled_w) % pooled_h;
    const int plane = index / (pooled_w * pooled_h);
    const int hstart = max(ph * stride_h - pad_h, 0);
    const int wstart = max(pw * stride_w - pad_w, 0);
    const int hend = min(ph * stride_h - pad_h + kernel_h, height);
    const int wend = min(pw * stride_w - pad_w + kernel_w, width);
    const Dtype* x = bottom + plane * height * width;
    Dtype sum = 0;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        sum += x[h * width + w];
      }
    }
    const int size = ave_pool_size(ph, pw, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                                   stride_h, stride_w, pad_h, pad_w);
    top[index] = (hstart < hend && wstart < wend) ? sum / size : Dtype(0);
  }
}

// Backward: a gather, one thread per bottom element (h, w) and plane; no atomics. Launched on
// grid (ceil(width / POOL_TILE_W), ceil(height / POOL_TILE_H), min(planes, 65535)) with block
// (POOL_TILE_W, POOL_TILE_H): the top-window ranges of the tile's rows and columns are computed once
// per block (the only integer divisions) and the block loops over planes, so writes are coalesced
// rows and the window reads hit the cache.
#define POOL_TILE_W 32
#define POOL_TILE_H 8

extern "C++" {
template <bool MAX>
__device__ void pool_backward(const int planes, const Dtype* top_diff, const int* mask,
                              POOL_GEOMETRY_ARGS, Dtype* bottom_diff) {
  __shared__ int ph_range[2][POOL_TILE_H], pw_range[2][POOL_TILE_W];
  const int w = blockIdx.x * POOL_TILE_W + threadIdx.x;
  const int h = blockIdx.y * POOL_TILE_H + threadIdx.y;
  // top windows whose (unclipped) span contains the row / column
  if (threadIdx.y == 0) {
    pw_range[0][threadIdx.x] = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    pw_range[1][threadIdx.x] = min((w + pad_w) / stride_w + 1, pooled_w);
  }
  if (threadIdx.x == 0) {
    ph_range[0][threadIdx.y] = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    ph_range[1][threadIdx.y] = min((h + pad_h) / stride_h + 1, pooled_h);
  }
  __syncthreads();
  if (h >= height || w >= width) return;
  const int phstart = ph_range[0][threadIdx.y], phend = ph_range[1][threadIdx.y];
  const int pwstart = pw_range[0][threadIdx.x], pwend = pw_range[1][threadIdx.x];
  const int target = h * width + w;
  for (int plane = blockIdx.z; plane < planes; plane += gridDim.z) {
    const int offset = plane * pooled_h * pooled_w;
    Dtype grad = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int t = offset + ph * pooled_w + pw;
        if (MAX) {
          if (mask[t] == target) grad += top_diff[t];
        } else {
          grad += top_diff[t] / ave_pool_size(ph, pw, height, width, pooled_h, pooled_w, kernel_h,
                                              kernel_w, stride_h, stride_w, pad_h, pad_w);
        }
      }
    }
    bottom_diff[plane * height * width + target] = grad;
  }
}
}  // extern "C++"

// Sums the diffs of the top windows that contain the element and chose it (mask).
__global__ void max_pool_backward(const int planes, const Dtype* top_diff, const int* mask,
                                  POOL_GEOMETRY_ARGS, Dtype* bottom_diff) {
  pool_backward<true>(planes, top_diff, mask, height, width, pooled_h, pooled_w, kernel_h, kernel_w,
                      stride_h, stride_w, pad_h, pad_w, bottom_diff);
}

// Sums top_diff / pool_size over the windows that contain the element.
__global__ void ave_pool_backward(const int planes, const Dtype* top_diff, POOL_GEOMETRY_ARGS,
                                  Dtype* bottom_diff) {
  pool_backward<false>(planes, top_diff, nullptr, height, width, pooled_h, pooled_w, kernel_h,
                       kernel_w, stride_h, stride_w, pad_h, pad_w, bottom_diff);
}

// The MAX mask as a Dtype top blob (Caffe's optional second top).
__global__ void pool_mask_to_dtype(const int count, const int* mask, Dtype* out) {
  CUDA_KERNEL_LOOP(index, count) {
    out[index] = (Dtype)mask[index];
  }
}
