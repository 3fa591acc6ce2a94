// SigmoidCrossEntropyLoss, element-wise on scores x and targets t of the same count.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; math in Mtype.

// loss[i] = max(x, 0) - x*t + log(1 + exp(-|x|)), valid[i] = 1; both 0 where int(t) is ignored.
__global__ void sigmoid_ce_forward(const int n, const Dtype* x, const Dtype* target, const int has_ignore,
                                   const int ignore_label, Dtype* loss, Dtype* valid) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore && static_cast<int>(to_m(target[i])) == ignore_label) {
      loss[i] = 0;
      valid[i] = 0;
    } else {
      const Mtype v = to_m(x[i]);
      loss[i] = from_m(max(v, Mtype(0)) - v * to_m(target[i]) + log1p(exp(-fabs(v))));
      valid[i] = 1;
    }
  }
}

// dx[i] = (sigmoid(x) - t) * top_diff[0] / norm[0]; 0 where ignored.
__global__ void sigmoid_ce_backward(const int n, const Dtype* x, const Dtype* target, const int has_ignore,
                                    const int ignore_label, const Dtype* top_diff, const Dtype* norm,
                                    Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    if (has_ignore && static_cast<int>(to_m(target[i])) == ignore_label) {
      dx[i] = 0;
    } else {
      const Mtype s = Mtype(1) / (Mtype(1) + exp(-to_m(x[i])));
      dx[i] = from_m((s - to_m(target[i])) * (to_m(top_diff[0]) / to_m(norm[0])));
    }
  }
}
