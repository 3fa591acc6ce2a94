// CTPN's Lstm: one time step over N streams of H hidden units; gates in the order i, f, o, g.
// cl (the continuation of a stream at this step) is clip[row] with a clip bottom, else t > 0. Math in Mtype
// (to_m / from_m from the backend prelude).

__device__ __forceinline__ Mtype ctpn_sigmoid(const Mtype x) {
  return Mtype(0.5) * tanh(Mtype(0.5) * x) + Mtype(0.5);
}

// gate (N, 4H) holds W_i x + b on entry and the activated gates on exit.
__global__ void ctpn_lstm_forward_step(const int n, const int H, const int has_clip, const Dtype* clip,
                                       const int t, const Dtype* h_to_gate, Dtype* gate,
                                       const Dtype* c_prev, Dtype* c, Dtype* h) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / H;
    const int d = idx - row * H;
    const Mtype cl = has_clip ? to_m(clip[row]) : Mtype(t > 0 ? 1 : 0);
    Dtype* g4 = gate + 4 * H * row;
    const Dtype* r4 = h_to_gate + 4 * H * row;
    const Mtype i = ctpn_sigmoid(to_m(g4[d]) + cl * to_m(r4[d]));
    const Mtype f = ctpn_sigmoid(to_m(g4[H + d]) + cl * to_m(r4[H + d]));
    const Mtype o = ctpn_sigmoid(to_m(g4[2 * H + d]) + cl * to_m(r4[2 * H + d]));
    const Mtype g = tanh(to_m(g4[3 * H + d]) + cl * to_m(r4[3 * H + d]));
    g4[d] = from_m(i);
    g4[H + d] = from_m(f);
    g4[2 * H + d] = from_m(o);
    g4[3 * H + d] = from_m(g);
    const Mtype cv = cl * f * to_m(c_prev[idx]) + i * g;
    c[idx] = from_m(cv);
    h[idx] = from_m(o * tanh(cv));
  }
}

__device__ __forceinline__ Dtype ctpn_bound(const Mtype v, const Mtype limit) {
  return from_m(limit > Mtype(0) ? fmin(fmax(v, -limit), limit) : v);
}

// dh = top_diff + dh_carry; dc = dc_carry + dh o (1 - tanh(c)^2); writes the gate-input diffs
// (bounded by limit when limit > 0) and dc_carry = cl f dc for the step before.
__global__ void ctpn_lstm_backward_step(const int n, const int H, const int has_clip, const Dtype* clip,
                                        const int t, const Dtype* gate, const Dtype* c_prev,
                                        const Dtype* c, const Dtype* top_diff, const Dtype* dh_carry,
                                        Dtype* dc_carry, const Mtype limit, Dtype* gate_diff) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int row = idx / H;
    const int d = idx - row * H;
    const Mtype cl = has_clip ? to_m(clip[row]) : Mtype(t > 0 ? 1 : 0);
    const Dtype* g4 = gate + 4 * H * row;
    const Mtype i = to_m(g4[d]);
    const Mtype f = to_m(g4[H + d]);
    const Mtype o = to_m(g4[2 * H + d]);
    const Mtype g = to_m(g4[3 * H + d]);
    const Mtype tanh_c = tanh(to_m(c[idx]));
    const Mtype dh = to_m(top_diff[idx]) + to_m(dh_carry[idx]);
    const Mtype dc = to_m(dc_carry[idx]) + dh * o * (Mtype(1) - tanh_c * tanh_c);
    dc_carry[idx] = from_m(cl * dc * f);
    Dtype* d4 = gate_diff + 4 * H * row;
    const Mtype lim = Mtype(limit);
    d4[d] = ctpn_bound(dc * g * i * (Mtype(1) - i), lim);
    d4[H + d] = ctpn_bound(cl * dc * to_m(c_prev[idx]) * f * (Mtype(1) - f), lim);
    d4[2 * H + d] = ctpn_bound(dh * tanh_c * o * (Mtype(1) - o), lim);
    d4[3 * H + d] = ctpn_bound(dc * i * (Mtype(1) - g * g), lim);
  }
}

// x (N, H) *= cl per row.
__global__ void ctpn_lstm_mask_rows(const int n, const int H, const int has_clip, const Dtype* clip,
                                    const int t, Dtype* x) {
  CUDA_KERNEL_LOOP(idx, n) {
    const Mtype cl = has_clip ? to_m(clip[idx / H]) : Mtype(t > 0 ? 1 : 0);
    x[idx] = from_m(to_m(x[idx]) * cl);
  }
}

// prev (T, N, H): cl_t * h_{t-1}, with h_{-1} = h0 (N, H); h is the output (T, N, H).
__global__ void ctpn_lstm_masked_prev(const int n, const int NH, const int H, const int has_clip,
                                      const Dtype* clip, const Dtype* h0, const Dtype* h, Dtype* prev) {
  CUDA_KERNEL_LOOP(idx, n) {
    const int t = idx / NH;
    const int rest = idx - t * NH;
    const Mtype cl = has_clip ? to_m(clip[t * (NH / H) + rest / H]) : Mtype(t > 0 ? 1 : 0);
    prev[idx] = from_m(cl * to_m(t > 0 ? h[idx - NH] : h0[rest]));
  }
}
