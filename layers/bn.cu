// BN (yjxiong / PSPNet / SegNet): per-channel statistics over (N, S) with one block per channel
// (reads coalesced along S), per-channel coefficients y = a x + b, element passes one thread each.

// mean[c] and biased var[c] of x viewed as (N, C, S): two passes over the channel in one block.
__global__ void bn_channel_moments(const int C, const int N, const int S, const Dtype* x,
                                   Dtype* mean, Dtype* var) {
  __shared__ Dtype part[256];
  const int m = N * S;
  for (int c = blockIdx.x; c < C; c += gridDim.x) {
    Dtype acc = 0;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      acc += x[((long long)(j / S) * C + c) * S + j % S];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    const Dtype mu = part[0] / m;
    __syncthreads();
    acc = 0;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      const Dtype d = x[((long long)(j / S) * C + c) * S + j % S] - mu;
      acc += d * d;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      mean[c] = mu;
      var[c] = part[0] / m;
    }
    __syncthreads();
  }
}

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

// sum_dy[c] = sum dy, sum_dyx[c] = sum dy * x_hat (0 without x_hat), over (N, S).
__global__ void bn_channel_dy_sums(const int C, const int N, const int S, const Dtype* dy,
                                   const Dtype* x_hat, const int has_x_hat, Dtype* sum_dy,
                                   Dtype* sum_dyx) {
  __shared__ Dtype p1[256];
  __shared__ Dtype p2[256];
  const int m = N * S;
  for (int c = blockIdx.x; c < C; c += gridDim.x) {
    Dtype a1 = 0, a2 = 0;
    for (int j = threadIdx.x; j < m; j += blockDim.x) {
      const long long k = ((long long)(j / S) * C + c) * S + j % S;
      a1 += dy[k];
      if (has_x_hat) a2 += dy[k] * x_hat[k];
    }
    p1[threadIdx.x] = a1;
    p2[threadIdx.x] = a2;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) {
        p1[threadIdx.x] += p1[threadIdx.x + w];
        p2[threadIdx.x] += p2[threadIdx.x + w];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      sum_dy[c] = p1[0];
      sum_dyx[c] = p2[0];
    }
    __syncthreads();
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
