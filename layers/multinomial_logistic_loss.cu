// MultinomialLogisticLoss on (num, dim) probabilities and num labels.
// Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from the backend prelude; logs in Mtype.
#include "loss_layer.cuh"

#define MLL_LOG_THRESHOLD 1e-20f

// loss[n] = -log(max(prob[n, label_n], 1e-20)). A label outside [0, dim) or not a number gives a NaN loss and sets
// the bad-label flag status[1] = 1, status[2] = label (LossLayer.gpu_status).
__global__ void mll_forward(const int num, const Dtype* prob, const Dtype* label, const int dim,
                            Dtype* loss, Dtype* status) {
  CUDA_KERNEL_LOOP(n, num) {
    int l;
    const bool ok = loss_label_int(label[n], &l);
    if (!ok || l < 0 || l >= dim) {
      loss[n] = Dtype(__int_as_float(0x7fffffff));
      status[1] = 1;
      status[2] = label[n];
    } else {
      loss[n] = from_m(-log(max(to_m(prob[n * dim + l]), Mtype(MLL_LOG_THRESHOLD))));
    }
  }
}

// dx[n, j] = -top_diff[0] / norm[0] / max(prob[n, j], 1e-20) where j == label_n, else 0.
__global__ void mll_backward(const int count, const Dtype* prob, const Dtype* label, const int dim,
                             const Dtype* top_diff, const Dtype* norm, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int n = i / dim;
    const int j = i - n * dim;
    int l;
    loss_label_int(label[n], &l);
    if (j == l) {
      dx[i] = from_m(-to_m(top_diff[0]) / to_m(norm[0]) / max(to_m(prob[i]), Mtype(MLL_LOG_THRESHOLD)));
    } else {
      dx[i] = 0;
    }
  }
}
