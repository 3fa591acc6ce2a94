// SoftmaxWithLoss on (outer, channels, inner) probabilities and (outer, inner) labels.
// Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

#define SOFTMAX_LOSS_FLT_MIN 1.17549435e-38f

// Per position p = (o, s): loss[p] = -log(max(prob[o, label, s], FLT_MIN)), valid[p] = 1; both 0
// for ignored positions. A label outside [0, channels) gives a NaN loss and sets the bad-label
// flag status[1] = 1, status[2] = label (LossLayer.gpu_status).
__global__ void softmax_loss_forward(const int n, const Dtype* prob, const Dtype* label,
                                     const int channels, const int inner, const int has_ignore,
                                     const int ignore_label, Dtype* loss, Dtype* valid, Dtype* status) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int l = static_cast<int>(label[p]);
    if (has_ignore && l == ignore_label) {
      loss[p] = 0;
      valid[p] = 0;
    } else if (l < 0 || l >= channels) {
      loss[p] = Dtype(__int_as_float(0x7fffffff));
      valid[p] = 1;
      status[1] = 1;
      status[2] = label[p];
    } else {
      const Dtype q = prob[(o * channels + l) * inner + s];
      loss[p] = -log(max(q, Dtype(SOFTMAX_LOSS_FLT_MIN)));
      valid[p] = 1;
    }
  }
}

// Per element (o, c, s): dx = (prob - [c == label]) * top_diff[0] / norm[0]; 0 where ignored.
__global__ void softmax_loss_backward(const int count, const Dtype* prob, const Dtype* label,
                                      const int channels, const int inner, const int has_ignore,
                                      const int ignore_label, const Dtype* top_diff,
                                      const Dtype* norm, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int s = i % inner;
    const int c = (i / inner) % channels;
    const int o = i / (inner * channels);
    const int l = static_cast<int>(label[o * inner + s]);
    if (has_ignore && l == ignore_label) {
      dx[i] = 0;
    } else {
      dx[i] = (prob[i] - (c == l ? Dtype(1) : Dtype(0))) * (top_diff[0] / norm[0]);
    }
  }
}
