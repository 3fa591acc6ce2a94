// Reverse along one axis: the blob is (outer, axis_count, inner); entry (o, a, r) goes to
// (o, axis_count - 1 - a, r). Its own inverse, so backward runs it on the diffs.

__global__ void reverse_axis(const int n, const int axis_count, const int inner, const Dtype* from,
                             Dtype* to) {
  CUDA_KERNEL_LOOP(i, n) {
    const int a = (i / inner) % axis_count;
    to[i + inner * (axis_count - 2 * a - 1)] = from[i];
  }
}
