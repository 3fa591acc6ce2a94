// SoftmaxWithLoss on (outer, channels, inner) probabilities and (outer, inner) labels.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; math in Mtype.
#include "loss_layer.cuh"

#define SOFTMAX_LOSS_FLT_MIN 1.17549435e-38f

// Per position p = (o, s): loss[p] = -log(max(prob[o, label, s], FLT_MIN)), valid[p] = 1; both 0
// for ignored positions; a label outside [0, channels): see loss_class_label.
__global__ void softmax_loss_forward(const int n, const Dtype* prob, const Dtype* label,
                                     const int channels, const int inner, const int has_ignore,
                                     const int ignore_label, Dtype* loss, Dtype* valid, Dtype* status) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int l = loss_class_label(p, label, channels, has_ignore, ignore_label, loss, valid, status);
    if (l >= 0) {
      const Mtype q = to_m(prob[(o * channels + l) * inner + s]);
      loss[p] = from_m(-log(max(q, Mtype(SOFTMAX_LOSS_FLT_MIN))));
    }
  }
}

// Per element (o, c, s): dx = (prob - [c == label]) * top_diff[0] / norm[0]; 0 where ignored.
__global__ void softmax_loss_backward(const int count, const Dtype* prob, const Dtype* label,
                                      const int channels, const int inner, const int has_ignore,
                                      const int ignore_label, const Dtype* top_diff,
                                      const Dtype* norm, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const LossGradItem e = loss_grad_item(i, label, channels, inner, has_ignore, ignore_label);
    if (e.ignored) {
      dx[i] = 0;
    } else {
      dx[i] = from_m((to_m(prob[i]) - (e.c == e.l ? Mtype(1) : Mtype(0))) * (to_m(top_diff[0]) / to_m(norm[0])));
    }
  }
}
