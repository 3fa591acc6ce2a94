// HingeLoss on (num, dim) scores and num labels. Dtype and CUDA_KERNEL_LOOP come from the prelude.

// d[n, j] = max(0, 1 + s*x[n, j]) with s = -1 at j == label_n, +1 elsewhere; a row whose label
// lies outside [0, dim) becomes NaN instead of a silently wrong loss.
__global__ void hinge_forward(const int count, const Dtype* x, const Dtype* label, const int dim, Dtype* d) {
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    const int l = static_cast<int>(label[n]);
    if (l < 0 || l >= dim) {
      d[i] = Dtype(__int_as_float(0x7fffffff));
    } else {
      const Dtype v = (j == l) ? -x[i] : x[i];
      d[i] = max(Dtype(0), Dtype(1) + v);
    }
  }
}

// dx = s*sign(d)*w*inv_num (L1) or 2*s*d*w*inv_num (squared, L2); w = top_diff[0].
__global__ void hinge_backward(const int count, const Dtype* d, const Dtype* label, const int dim,
                               const int squared, const Dtype* top_diff, const Dtype inv_num, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    const Dtype v = (j == static_cast<int>(label[n])) ? -d[i] : d[i];
    const Dtype scale = top_diff[0] * inv_num;
    if (squared) {
      dx[i] = Dtype(2) * v * scale;
    } else {
      dx[i] = Dtype((Dtype(0) < v) - (v < Dtype(0))) * scale;
    }
  }
}
