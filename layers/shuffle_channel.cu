// ShuffleChannel: x viewed as (N, rows, cols, S) -> y (N, cols, rows, S). Forward passes
// (rows, cols) = (group, C / group); backward the swapped pair, which inverts the permutation.
__global__ void shuffle_channel(const int n, const int S, const int rows, const int cols,
                                const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int s = i % S;
    const int t = i / S;          // (num, col, row) index of y's channel
    const int r = t % rows;
    const int u = t / rows;
    const int c = u % cols;
    const int num = u / cols;
    y[i] = x[((num * rows + r) * cols + c) * S + s];
  }
}
