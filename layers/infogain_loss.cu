// InfogainLoss on (outer, channels, inner) probabilities, (outer, inner) labels and a
// (channels, channels) infogain matrix H. Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from
// the prelude; the sums and logarithms are in Mtype.
#include "loss_layer.cuh"

#define INFOGAIN_LOG_THRESHOLD 1e-20f

// Per position p = (o, s) with label l: loss[p] = -sum_c H[l, c] * log(max(prob[o, c, s], 1e-20)),
// valid[p] = 1; both 0 where ignored; a label outside [0, channels): see loss_class_label.
__global__ void infogain_forward(const int n, const Dtype* prob, const Dtype* label, const Dtype* h,
                                 const int channels, const int inner, const int has_ignore,
                                 const int ignore_label, Dtype* loss, Dtype* valid, Dtype* status) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner;
    const int s = p - o * inner;
    const int l = loss_class_label(p, label, channels, has_ignore, ignore_label, loss, valid, status);
    if (l >= 0) {
      const Dtype* row = h + l * channels;
      const Dtype* q = prob + o * channels * inner + s;
      Mtype acc = 0;
      for (int c = 0; c < channels; ++c) {
        acc -= to_m(row[c]) * log(max(to_m(q[c * inner]), Mtype(INFOGAIN_LOG_THRESHOLD)));
      }
      loss[p] = from_m(acc);
    }
  }
}

// sums[r] = sum_c H[r, c], one thread per row.
__global__ void infogain_row_sums(const int channels, const Dtype* h, Dtype* sums) {
  CUDA_KERNEL_LOOP(r, channels) {
    Mtype acc = 0;
    for (int c = 0; c < channels; ++c) {
      acc += to_m(h[r * channels + c]);
    }
    sums[r] = from_m(acc);
  }
}

// Per element (o, c, s) with label l: dx = (prob * sums[l] - H[l, c]) * top_diff[0] / norm[0];
// 0 where ignored; NaN for a label outside [0, channels).
__global__ void infogain_backward(const int count, const Dtype* prob, const Dtype* label, const Dtype* h,
                                  const Dtype* sums, const int channels, const int inner,
                                  const int has_ignore, const int ignore_label, const Dtype* top_diff,
                                  const Dtype* norm, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const LossGradItem e = loss_grad_item(i, label, channels, inner, has_ignore, ignore_label);
    if (e.ignored) {
      dx[i] = 0;
    } else if (e.l < 0 || e.l >= channels) {
      dx[i] = Dtype(__int_as_float(0x7fffffff));
    } else {
      dx[i] = from_m((to_m(prob[i]) * to_m(sums[e.l]) - to_m(h[e.l * channels + e.c])) *
                     (to_m(top_diff[0]) / to_m(norm[0])));
    }
  }
}
