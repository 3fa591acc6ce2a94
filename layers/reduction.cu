// Reduction backward over a (num, dim) view. op: 1 SUM, 2 ASUM, 3 SUMSQ, 4 MEAN
// (ReductionParameter.ReductionOp values). Math in Mtype (to_m / from_m from the backend prelude).

__global__ void reduction_backward(const int n, const int dim, const int op, const Mtype coeff,
                                   const Dtype* x, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype g = Mtype(coeff) * to_m(dy[i / dim]);
    const Mtype v = to_m(x[i]);
    Mtype d;
    if (op == 2) {
      d = g * ((Mtype(0) < v) - (v < Mtype(0)));
    } else if (op == 3) {
      d = 2 * g * v;
    } else if (op == 4) {
      d = g / dim;
    } else {
      d = g;
    }
    dx[i] = from_m(d);
  }
}
