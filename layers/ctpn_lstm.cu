// CTPN's Lstm: one time step over N streams of H hidden units; gates in the order i, f, o, g.
// cl (the continuation of a stream at this step) is clip[row] with a clip bottom, else t > 0.

__device__ __forceinline__ Dtype ctpn_sigmoid(const Dtype x) {
  return Dtype(0.5) * tanh(Dtype(0.5) * x) + Dtype(0.5);
}

// gate (N, 4H) holds W_i x + b on entry and the activated gates on exit.
__global__ void ctpn_lstm_forward_step(const int n, const int H, const int has_clip, const Dtype* clip,
                                       const int t, const Dtype* h_to_gate, Dtype* gate,
                                       const Dtype* c_prev, Dtype* c, Dtype* h) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / H;
    const int d = idx - row * H;
    const Dtype cl = has_clip ? clip[row] : Dtype(t > 0 ? 1 : 0);
    Dtype* g4 = gate + 4 * H * row;
    const Dtype* r4 = h_to_gate + 4 * H * row;
    const Dtype i = ctpn_sigmoid(g4[d] + cl * r4[d]);
    const Dtype f = ctpn_sigmoid(g4[H + d] + cl * r4[H + d]);
    const Dtype o = ctpn_sigmoid(g4[2 * H + d] + cl * r4[2 * H + d]);
    const Dtype g = tanh(g4[3 * H + d] + cl * r4[3 * H + d]);
    g4[d] = i;
    g4[H + d] = f;
    g4[2 * H + d] = o;
    g4[3 * H + d] = g;
    const Dtype cv = cl * f * c_prev[idx] + i * g;
    c[idx] = cv;
    h[idx] = o * tanh(cv);
  }
}

__device__ __forceinline__ Dtype ctpn_bound(const Dtype v, const Dtype limit) {
  return limit > Dtype(0) ? fmin(fmax(v, -limit), limit) : v;
}

// dh = top_diff + dh_carry; dc = dc_carry + dh o (1 - tanh(c)^2); writes the gate-input diffs
// (bounded by limit when limit > 0) and dc_carry = cl f dc for the step before.
__global__ void ctpn_lstm_backward_step(const int n, const int H, const int has_clip, const Dtype* clip,
                                        const int t, const Dtype* gate, const Dtype* c_prev,
                                        const Dtype* c, const Dtype* top_diff, const Dtype* dh_carry,
                                        Dtype* dc_carry, const Dtype limit, Dtype* gate_diff) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / H;
    const int d = idx - row * H;
    const Dtype cl = has_clip ? clip[row] : Dtype(t > 0 ? 1 : 0);
    const Dtype* g4 = gate + 4 * H * row;
    const Dtype i = g4[d];
    const Dtype f = g4[H + d];
    const Dtype o = g4[2 * H + d];
    const Dtype g = g4[3 * H + d];
    const Dtype tanh_c = tanh(c[idx]);
    const Dtype dh = top_diff[idx] + dh_carry[idx];
    const Dtype dc = dc_carry[idx] + dh * o * (Dtype(1) - tanh_c * tanh_c);
    dc_carry[idx] = cl * dc * f;
    Dtype* d4 = gate_diff + 4 * H * row;
    d4[d] = ctpn_bound(dc * g * i * (Dtype(1) - i), limit);
    d4[H + d] = ctpn_bound(cl * dc * c_prev[idx] * f * (Dtype(1) - f), limit);
    d4[2 * H + d] = ctpn_bound(dh * tanh_c * o * (Dtype(1) - o), limit);
    d4[3 * H + d] = ctpn_bound(dc * i * (Dtype(1) - g * g), limit);
  }
}

// x (N, H) *= cl per row.
__global__ void ctpn_lstm_mask_rows(const int n, const int H, const int has_clip, const Dtype* clip,
                                    const int t, Dtype* x) {
  CUDA_KERNEL_LOOP(idx, n) {
    const Dtype cl = has_clip ? clip[idx / H] : Dtype(t > 0 ? 1 : 0);
    x[idx] *= cl;
  }
}

// prev (T, N, H): cl_t * h_{t-1}, with h_{-1} = h0 (N, H); h is the output (T, N, H).
__global__ void ctpn_lstm_masked_prev(const int n, const int NH, const int H, const int has_clip,
                                      const Dtype* clip, const Dtype* h0, const Dtype* h, Dtype* prev) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int t = idx / NH;
    const int rest = idx - t * NH;
    const Dtype cl = has_clip ? clip[t * (NH / H) + rest / H] : Dtype(t > 0 ? 1 : 0);
    prev[idx] = cl * (t > 0 ? h[idx - NH] : h0[rest]);
  }
}
