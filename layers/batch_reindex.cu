// BatchReindex: top item j is bottom item permut[j]; inner values per item. Indices outside
// [0, num) (the CPU path refuses them) read as zero and take no gradient.

__global__ void batch_reindex_forward(const int n, const int inner, const int num, const Dtype* permut,
                                      const Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    const int j = i / inner;
    const int src = static_cast<int>(permut[j]);
    top[i] = (src >= 0 && src < num) ? bottom[src * inner + (i - j * inner)] : Dtype(0);
  }
}

// One thread per bottom value: the sum of the top diffs of every top item that copied it
// (a fixed order, so the result does not depend on scheduling).
__global__ void batch_reindex_backward(const int n, const int inner, const int m, const Dtype* permut,
                                       const Dtype* top_diff, Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    const int r = i / inner;
    const int k = i - r * inner;
    Mtype sum = 0;  // in Mtype (to_m / from_m from the backend prelude)
    for (int j = 0; j < m; ++j) {
      if (static_cast<int>(permut[j]) == r) {
        sum += to_m(top_diff[j * inner + k]);
      }
    }
    bottom_diff[i] = from_m(sum);
  }
}
