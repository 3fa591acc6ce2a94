// LSTMUnit: one LSTM time step over N streams of hidden size D (BVLC's gate order i, f, o, g).
// X is (N, 4D) gate pre-activations, C_prev / C / H are (N, D), cont is (N,). Math in Mtype (to_m /
// from_m from the backend prelude).

__device__ __forceinline__ Mtype lstm_sigmoid(const Mtype x) {
  return Mtype(0.5) * tanh(Mtype(0.5) * x) + Mtype(0.5);
}

// One work item per (n, d).  f is zero where cont is 0 (a reset), else cont * sigmoid.
__global__ void lstm_unit_forward(const int n, const int D, const Dtype* C_prev, const Dtype* X,
                                  const Dtype* cont, Dtype* C, Dtype* H) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / D;
    const int d = idx - row * D;
    const Dtype* x = X + 4 * D * row;
    const Mtype i = lstm_sigmoid(to_m(x[d]));
    const Mtype f = to_m(cont[row]) == Mtype(0) ? Mtype(0) : to_m(cont[row]) * lstm_sigmoid(to_m(x[D + d]));
    const Mtype o = lstm_sigmoid(to_m(x[2 * D + d]));
    const Mtype g = tanh(to_m(x[3 * D + d]));
    const Mtype c = f * to_m(C_prev[idx]) + i * g;
    C[idx] = from_m(c);
    H[idx] = from_m(o * tanh(c));
  }
}

// Gradients for C_prev (when write_c_prev) and X (when write_x), from the diffs of C and H.
__global__ void lstm_unit_backward(const int n, const int D, const Dtype* C_prev, const Dtype* X,
                                   const Dtype* cont, const Dtype* C, const Dtype* C_diff,
                                   const Dtype* H_diff, const int write_c_prev, const int write_x,
                                   Dtype* C_prev_diff, Dtype* X_diff) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / D;
    const int d = idx - row * D;
    const Dtype* x = X + 4 * D * row;
    const Mtype i = lstm_sigmoid(to_m(x[d]));
    const Mtype f = to_m(cont[row]) == Mtype(0) ? Mtype(0) : to_m(cont[row]) * lstm_sigmoid(to_m(x[D + d]));
    const Mtype o = lstm_sigmoid(to_m(x[2 * D + d]));
    const Mtype g = tanh(to_m(x[3 * D + d]));
    const Mtype tanh_c = tanh(to_m(C[idx]));
    const Mtype c_term = to_m(C_diff[idx]) + to_m(H_diff[idx]) * o * (Mtype(1) - tanh_c * tanh_c);
    if (write_c_prev) {
      C_prev_diff[idx] = from_m(c_term * f);
    }
    if (write_x) {
      Dtype* dx = X_diff + 4 * D * row;
      dx[d] = from_m(c_term * g * i * (Mtype(1) - i));
      dx[D + d] = from_m(c_term * to_m(C_prev[idx]) * f * (Mtype(1) - f));
      dx[2 * D + d] = from_m(to_m(H_diff[idx]) * tanh_c * o * (Mtype(1) - o));
      dx[3 * D + d] = from_m(c_term * i * (Mtype(1) - g * g));
    }
  }
}
