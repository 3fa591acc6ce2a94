// Fused solver updates, one kernel per rule (Dtype, Mtype, to_m, from_m and CUDA_KERNEL_LOOP come from
// the prelude; the arithmetic is in Mtype, scalar arguments are converted with Mtype(...)).
// The rate is read from device memory (rate_ptr[0], set by the solver each iteration) times the
// param's lr_mult, so the kernels can be replayed from a CUDA graph; rate_ptr[1] nonzero skips the
// step (a non-finite gradient under an adaptive loss scale: weights and history stay as they are). Per element i, in place:
//   g = g[i] * scale + decay * (reg == 1 ? w[i] : reg == 2 ? sign(w[i]) : 0)   (1/iter_size, L2/L1)
//   update = rule(g, history...)       (history updated in place, as Caffe keeps it)
//   g[i] = update; w[i] -= update      (Caffe's diff holds the update, then Blob::Update)

__device__ __forceinline__ Mtype regularized_grad(const Mtype g, const Mtype w, const Mtype scale,
                                                  const Mtype decay, const int reg) {
  Mtype out = g * scale;
  if (reg == 1) {
    out += decay * w;
  } else if (reg == 2) {
    out += decay * (Mtype((Mtype(0) < w)) - Mtype((w < Mtype(0))));
  }
  return out;
}

// h = momentum * h + rate * g; update = h
__global__ void sgd_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                           const Dtype decay, const int reg, const Dtype momentum,
                           const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype hi = Mtype(momentum) * to_m(h[i]) + rate * gi;
    h[i] = from_m(hi);
    g[i] = from_m(hi);
    w[i] = from_m(to_m(w[i]) - hi);
  }
}

// h' = momentum * h + rate * g; update = (1 + momentum) * h' - momentum * h
__global__ void nesterov_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                                const Dtype decay, const int reg, const Dtype momentum,
                                const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype old_h = to_m(h[i]);
    const Mtype new_h = Mtype(momentum) * old_h + rate * gi;
    h[i] = from_m(new_h);
    const Mtype u = (Mtype(1) + Mtype(momentum)) * new_h - Mtype(momentum) * old_h;
    g[i] = from_m(u);
    w[i] = from_m(to_m(w[i]) - u);
  }
}

// h += g^2; update = rate * g / (sqrt(h) + delta)
__global__ void adagrad_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                               const Dtype decay, const int reg, const Dtype delta,
                               const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype hi = to_m(h[i]) + gi * gi;
    h[i] = from_m(hi);
    const Mtype u = rate * (gi / (sqrt(hi) + Mtype(delta)));
    g[i] = from_m(u);
    w[i] = from_m(to_m(w[i]) - u);
  }
}

// h = rms_decay * h + (1 - rms_decay) * g^2; update = rate * g / (sqrt(h) + delta)
__global__ void rmsprop_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                               const Dtype decay, const int reg, const Dtype rms_decay,
                               const Dtype delta, const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype hi = Mtype(rms_decay) * to_m(h[i]) + (Mtype(1) - Mtype(rms_decay)) * gi * gi;
    h[i] = from_m(hi);
    const Mtype u = rate * (gi / (sqrt(hi) + Mtype(delta)));
    g[i] = from_m(u);
    w[i] = from_m(to_m(w[i]) - u);
  }
}

// h = m * h + (1 - m) * g^2; s = g * sqrt((h2 + delta) / (h + delta));
// h2 = m * h2 + (1 - m) * s^2; update = rate * s
__global__ void adadelta_update(const int n, Dtype* w, Dtype* g, Dtype* h, Dtype* h2,
                                const Dtype scale, const Dtype decay, const int reg,
                                const Dtype momentum, const Dtype delta, const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype hi = Mtype(momentum) * to_m(h[i]) + (Mtype(1) - Mtype(momentum)) * gi * gi;
    h[i] = from_m(hi);
    const Mtype si = gi * sqrt((to_m(h2[i]) + Mtype(delta)) / (hi + Mtype(delta)));
    h2[i] = from_m(Mtype(momentum) * to_m(h2[i]) + (Mtype(1) - Mtype(momentum)) * si * si);
    const Mtype u = rate * si;
    g[i] = from_m(u);
    w[i] = from_m(to_m(w[i]) - u);
  }
}

// m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g^2;
// update = corrected_rate * m / (sqrt(v) + eps_hat)
__global__ void adam_update(const int n, Dtype* w, Dtype* g, Dtype* m, Dtype* v,
                            const Dtype scale, const Dtype decay, const int reg, const Dtype beta1,
                            const Dtype beta2, const Dtype eps_hat, const Dtype* rate_ptr, const Dtype lr_mult) {
  if (rate_ptr[1] != Dtype(0)) return;  // a step the adaptive loss scale skips
  const Mtype corrected_rate = to_m(rate_ptr[0]) * Mtype(lr_mult);
  CUDA_KERNEL_LOOP(i, n) {
    const Mtype gi = regularized_grad(to_m(g[i]), to_m(w[i]), Mtype(scale), Mtype(decay), reg);
    const Mtype mi = Mtype(beta1) * to_m(m[i]) + (Mtype(1) - Mtype(beta1)) * gi;
    const Mtype vi = Mtype(beta2) * to_m(v[i]) + (Mtype(1) - Mtype(beta2)) * gi * gi;
    m[i] = from_m(mi);
    v[i] = from_m(vi);
    const Mtype u = corrected_rate * (mi / (sqrt(vi) + Mtype(eps_hat)));
    g[i] = from_m(u);
    w[i] = from_m(to_m(w[i]) - u);
  }
}
