// Concat: copy between a bottom (num_concats, bottom_axis, inner) and its slice
// [offset, offset + bottom_axis) of the top (num_concats, top_axis, inner).

__global__ void concat_forward(const int n, const int inner, const int top_axis,
                               const int bottom_axis, const int offset,
                               const Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int block = bottom_axis * inner;
    const int row = i / block;
    const int within = i % block;
    top[(row * top_axis + offset) * inner + within] = bottom[i];
  }
}

__global__ void concat_backward(const int n, const int inner, const int top_axis,
                                const int bottom_axis, const int offset,
                                Dtype* bottom_diff, const Dtype* top_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int block = bottom_axis * inner;
    const int row = i / block;
    const int within = i % block;
    bottom_diff[i] = top_diff[(row * top_axis + offset) * inner + within];
  }
}
