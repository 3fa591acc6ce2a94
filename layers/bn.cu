// BN (yjxiong / PSPNet / SegNet): per-channel coefficients y = a x + b and the element passes, one
// thread per element. The per-channel sums come from math_functions (channel_moments, channel_dot).

// a = slope * inv_std, b = bias - mu * a with inv_std = 1 / sqrt(var + eps) when normalize, else
// (SegNet INFERENCE) a = slope, b = bias, mu = 0, inv_std = 1. With update the running values
// become momentum * run + (1 - momentum) * batch.
__global__ void bn_coeffs(const int C, const Dtype* mu, const Dtype* var, const Dtype* slope,
                          const Dtype* bias, const Dtype eps, const int normalize, const int update,
                          const Dtype momentum, Dtype* run_mean, Dtype* run_var, Dtype* a, Dtype* b,
                          Dtype* mean_out, Dtype* inv_std_out) {
  CUDA_KERNEL_LOOP(c, C) {
    const Dtype m = normalize ? mu[c] : Dtype(0);
    const Dtype r = normalize ? Dtype(1) / sqrt(var[c] + eps) : Dtype(1);
    if (update) {
      run_mean[c] = momentum * run_mean[c] + (Dtype(1) - momentum) * mu[c];
      run_var[c] = momentum * run_var[c] + (Dtype(1) - momentum) * var[c];
    }
    a[c] = slope[c] * r;
    b[c] = bias[c] - m * a[c];
    mean_out[c] = m;
    inv_std_out[c] = r;
  }
}

// y = a[c] x + b[c]; with keep, x_hat = (x - mean[c]) * inv_std[c]. x and y may alias.
__global__ void bn_affine(const int n, const int C, const int S, const Dtype* x, const Dtype* a,
                          const Dtype* b, const Dtype* mean, const Dtype* inv_std, const int keep,
                          Dtype* x_hat, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / S) % C;
    const Dtype v = x[i];
    if (keep) x_hat[i] = (v - mean[c]) * inv_std[c];
    y[i] = a[c] * v + b[c];
  }
}

// Batch statistics: dx = a[c] (dy - sum_dy[c] / m - x_hat sum_dyx[c] / m); dy and dx may alias.
__global__ void bn_backward_batch(const int n, const int C, const int S, const Dtype inv_m,
                                  const Dtype* dy, const Dtype* x_hat, const Dtype* a,
                                  const Dtype* sum_dy, const Dtype* sum_dyx, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int c = (i / S) % C;
    dx[i] = a[c] * (dy[i] - sum_dy[c] * inv_m - x_hat[i] * sum_dyx[c] * inv_m);
  }
}

__global__ void bn_backward_fixed(const int n, const int C, const int S, const Dtype* dy,
                                  const Dtype* a, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    dx[i] = a[(i / S) % C] * dy[i];
  }
}
