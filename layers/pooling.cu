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

// One thread per bottom element: sums the diffs of the top windows that contain it and chose it.
__global__ void max_pool_backward(const int count, const Dtype* top_diff, const int* mask,
                                  POOL_GEOMETRY_ARGS, Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(index, count) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int plane = index / (width * height);
    // top windows whose (unclipped) span contains (h, w)
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_w);
    const int offset = plane * pooled_h * pooled_w;
    const int target = h * width + w;
    Dtype grad = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        if (mask[offset + ph * pooled_w + pw] == target) {
          grad += top_diff[offset + ph * pooled_w + pw];
        }
      }
    }
    bottom_diff[index] = grad;
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

// One thread per bottom element: sums top_diff / pool_size over the windows that contain it.
__global__ void ave_pool_backward(const int count, const Dtype* top_diff, POOL_GEOMETRY_ARGS,
                                  Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(index, count) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int plane = index / (width * height);
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_w);
    const Dtype* dy = top_diff + plane * pooled_h * pooled_w;
    Dtype grad = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        grad += dy[ph * pooled_w + pw] / ave_pool_size(ph, pw, height, width, pooled_h, pooled_w,
                                                       kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w);
      }
    }
    bottom_diff[index] = grad;
  }
}

// The MAX mask as a Dtype top blob (Caffe's optional second top).
__global__ void pool_mask_to_dtype(const int count, const int* mask, Dtype* out) {
  CUDA_KERNEL_LOOP(index, count) {
    out[index] = (Dtype)mask[index];
  }
}
