// Reduction backward over a (num, dim) view. op: 1 SUM, 2 ASUM, 3 SUMSQ, 4 MEAN
// (ReductionParameter.ReductionOp values).

__global__ void reduction_backward(const int n, const int dim, const int op, const Dtype coeff,
                                   const Dtype* x, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype g = coeff * dy[i / dim];
    const Dtype v = x[i];
    Dtype d;
    if (op == 2) {
      d = g * ((Dtype(0) < v) - (v < Dtype(0)));
    } else if (op == 3) {
      d = 2 * g * v;
    } else if (op == 4) {
      d = g / dim;
    } else {
      d = g;
    }
    dx[i] = d;
  }
}
