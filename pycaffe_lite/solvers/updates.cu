// Fused solver updates, one kernel per rule (Dtype and CUDA_KERNEL_LOOP come from the prelude).
// The rate is read from device memory (rate_ptr[0], set by the solver each iteration) times the
// param's lr_mult, so the kernels can be replayed from a CUDA graph. Per element i, in place:
//   g = g[i] * scale + decay * (reg == 1 ? w[i] : reg == 2 ? sign(w[i]) : 0)   (1/iter_size, L2/L1)
//   update = rule(g, history...)       (history updated in place, as Caffe keeps it)
//   g[i] = update; w[i] -= update      (Caffe's diff holds the update, then Blob::Update)

__device__ __forceinline__ Dtype regularized_grad(const Dtype g, const Dtype w, const Dtype scale,
                                                  const Dtype decay, const int reg) {
  Dtype out = g * scale;
  if (reg == 1) {
    out += decay * w;
  } else if (reg == 2) {
    out += decay * (Dtype((Dtype(0) < w)) - Dtype((w < Dtype(0))));
  }
  return out;
}

// h = momentum * h + rate * g; update = h
__global__ void sgd_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                           const Dtype decay, const int reg, const Dtype momentum,
                           const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype hi = momentum * h[i] + rate * gi;
    h[i] = hi;
    g[i] = hi;
    w[i] -= hi;
  }
}

// h' = momentum * h + rate * g; update = (1 + momentum) * h' - momentum * h
__global__ void nesterov_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                                const Dtype decay, const int reg, const Dtype momentum,
                                const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype old_h = h[i];
    const Dtype new_h = momentum * old_h + rate * gi;
    h[i] = new_h;
    const Dtype u = (Dtype(1) + momentum) * new_h - momentum * old_h;
    g[i] = u;
    w[i] -= u;
  }
}

// h += g^2; update = rate * g / (sqrt(h) + delta)
__global__ void adagrad_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                               const Dtype decay, const int reg, const Dtype delta,
                               const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype hi = h[i] + gi * gi;
    h[i] = hi;
    const Dtype u = rate * (gi / (sqrt(hi) + delta));
    g[i] = u;
    w[i] -= u;
  }
}

// h = rms_decay * h + (1 - rms_decay) * g^2; update = rate * g / (sqrt(h) + delta)
__global__ void rmsprop_update(const int n, Dtype* w, Dtype* g, Dtype* h, const Dtype scale,
                               const Dtype decay, const int reg, const Dtype rms_decay,
                               const Dtype delta, const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype hi = rms_decay * h[i] + (Dtype(1) - rms_decay) * gi * gi;
    h[i] = hi;
    const Dtype u = rate * (gi / (sqrt(hi) + delta));
    g[i] = u;
    w[i] -= u;
  }
}

// h = m * h + (1 - m) * g^2; s = g * sqrt((h2 + delta) / (h + delta));
// h2 = m * h2 + (1 - m) * s^2; update = rate * s
__global__ void adadelta_update(const int n, Dtype* w, Dtype* g, Dtype* h, Dtype* h2,
                                const Dtype scale, const Dtype decay, const int reg,
                                const Dtype momentum, const Dtype delta, const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype hi = momentum * h[i] + (Dtype(1) - momentum) * gi * gi;
    h[i] = hi;
    const Dtype si = gi * sqrt((h2[i] + delta) / (hi + delta));
    h2[i] = momentum * h2[i] + (Dtype(1) - momentum) * si * si;
    const Dtype u = rate * si;
    g[i] = u;
    w[i] -= u;
  }
}

// m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g^2;
// update = corrected_rate * m / (sqrt(v) + eps_hat)
__global__ void adam_update(const int n, Dtype* w, Dtype* g, Dtype* m, Dtype* v,
                            const Dtype scale, const Dtype decay, const int reg, const Dtype beta1,
                            const Dtype beta2, const Dtype eps_hat, const Dtype* rate_ptr, const Dtype lr_mult) {
  const Dtype corrected_rate = rate_ptr[0] * lr_mult;
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype gi = regularized_grad(g[i], w[i], scale, decay, reg);
    const Dtype mi = beta1 * m[i] + (Dtype(1) - beta1) * gi;
    const Dtype vi = beta2 * v[i] + (Dtype(1) - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const Dtype u = corrected_rate * (mi / (sqrt(vi) + eps_hat));
    g[i] = u;
    w[i] -= u;
  }
}
