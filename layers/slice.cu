// Slice/concat copy between a bottom (outer, dim, inner) and one top (outer, size, inner)
// that holds bottom[:, start:start+size, :]. One thread per top element.

__global__ void slice_copy(const int n, const int inner, const int dim, const int size,
                           const int start, const int forward, Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int block = size * inner;
    const int o = i / block;
    const int rem = i - o * block;
    const int b = (o * dim + start) * inner + rem;
    if (forward) {
      top[i] = bottom[b];
    } else {
      bottom[b] = top[i];
    }
  }
}
