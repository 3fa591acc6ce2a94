// LSTMUnit: one LSTM time step over N streams of hidden size D (BVLC's gate order i, f, o, g).
// X is (N, 4D) gate pre-activations, C_prev / C / H are (N, D), cont is (N,).

__device__ __forceinline__ Dtype lstm_sigmoid(const Dtype x) {
  return Dtype(0.5) * tanh(Dtype(0.5) * x) + Dtype(0.5);
}

// One work item per (n, d).  f is zero where cont is 0 (a reset), else cont * sigmoid.
__global__ void lstm_unit_forward(const int n, const int D, const Dtype* C_prev, const Dtype* X,
                                  const Dtype* cont, Dtype* C, Dtype* H) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / D;
    const int d = idx - row * D;
    const Dtype* x = X + 4 * D * row;
    const Dtype i = lstm_sigmoid(x[d]);
    const Dtype f = cont[row] == Dtype(0) ? Dtype(0) : cont[row] * lstm_sigmoid(x[D + d]);
    const Dtype o = lstm_sigmoid(x[2 * D + d]);
    const Dtype g = tanh(x[3 * D + d]);
    const Dtype c = f * C_prev[idx] + i * g;
    C[idx] = c;
    H[idx] = o * tanh(c);
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
    const Dtype i = lstm_sigmoid(x[d]);
    const Dtype f = cont[row] == Dtype(0) ? Dtype(0) : cont[row] * lstm_sigmoid(x[D + d]);
    const Dtype o = lstm_sigmoid(x[2 * D + d]);
    const Dtype g = tanh(x[3 * D + d]);
    const Dtype tanh_c = tanh(C[idx]);
    const Dtype c_term = C_diff[idx] + H_diff[idx] * o * (Dtype(1) - tanh_c * tanh_c);
    if (write_c_prev) {
      C_prev_diff[idx] = c_term * f;
    }
    if (write_x) {
      Dtype* dx = X_diff + 4 * D * row;
      dx[d] = c_term * g * i * (Dtype(1) - i);
      dx[D + d] = c_term * C_prev[idx] * f * (Dtype(1) - f);
      dx[2 * D + d] = H_diff[idx] * tanh_c * o * (Dtype(1) - o);
      dx[3 * D + d] = c_term * i * (Dtype(1) - g * g);
    }
  }
}
