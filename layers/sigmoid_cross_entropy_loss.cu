// SigmoidCrossEntropyLoss, element-wise on scores x and targets t of the same count.
// Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

// loss[i] = max(x, 0) - x*t + log(1 + exp(-|x|)), valid[i] = 1; both 0 where int(t) is ignored.
__global__ void sigmoid_ce_forward(const int n, const Dtype* x, const Dtype* target, const int has_ignore,
                                   const int ignore_label, Dtype* loss, Dtype* valid) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore && static_cast<int>(target[i]) == ignore_label) {
      loss[i] = 0;
      valid[i] = 0;
    } else {
      const Dtype v = x[i];
      loss[i] = max(v, Dtype(0)) - v * target[i] + log1p(exp(-fabs(v)));
      valid[i] = 1;
    }
  }
}

// dx[i] = (sigmoid(x) - t) * top_diff[0] / norm[0]; 0 where ignored.
__global__ void sigmoid_ce_backward(const int n, const Dtype* x, const Dtype* target, const int has_ignore,
                                    const int ignore_label, const Dtype* top_diff, const Dtype* norm,
                                    Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore && static_cast<int>(target[i]) == ignore_label) {
      dx[i] = 0;
    } else {
      const Dtype s = Dtype(1) / (Dtype(1) + exp(-x[i]));
      dx[i] = (s - target[i]) * (top_diff[0] / norm[0]);
    }
  }
}
