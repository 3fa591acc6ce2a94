// Filter: idx holds the selected item numbers (int32), dim the values per item.

__global__ void filter_gather(const int n, const int dim, const int* idx, const Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int j = i / dim;
    top[i] = bottom[idx[j] * dim + (i - j * dim)];
  }
}

// Backward: bottom_diff must be zeroed first; the selected items are distinct, so no collisions.
__global__ void filter_scatter(const int n, const int dim, const int* idx, const Dtype* top_diff,
                               Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int j = i / dim;
    bottom_diff[idx[j] * dim + (i - j * dim)] = top_diff[i];
  }
}
