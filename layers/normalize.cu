// Normalize (SSD fork): L2 normalization with a learned scale.
// Element i of an (N, C, S) blob (S = spatial size, dim = C*S) has channel c = (i / S) % C and
// belongs to the norm group g = i / dim (across_spatial) or (i / dim) * S + i % S (per position).
#define NORMALIZE_THREADS 256

__device__ __forceinline__ int normalize_group(const int i, const int dim, const int spatial,
                                               const int across) {
  return across ? i / dim : (i / dim) * spatial + i % spatial;
}

__device__ __forceinline__ Dtype normalize_scale(const Dtype* scale, const int i, const int channels,
                                                 const int spatial, const int shared) {
  return shared ? scale[0] : scale[(i / spatial) % channels];
}

// across_spatial: one block per sample; norm[n] = sqrt(sum x^2 + eps).
__global__ void normalize_norm_across(const int dim, const Dtype eps, const Dtype* x, Dtype* norm) {
  __shared__ Dtype smem[NORMALIZE_THREADS];
  const Dtype* p = x + (size_t)blockIdx.x * dim;
  Dtype acc = 0;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    acc += p[j] * p[j];
  }
  smem[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) smem[threadIdx.x] += smem[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) norm[blockIdx.x] = sqrt(smem[0] + eps);
}

// per position: one thread per (sample, position); norm = sqrt(eps + sum_c x^2).
__global__ void normalize_norm_spatial(const int n, const int channels, const int spatial, const Dtype eps,
                                       const Dtype* x, Dtype* norm) {
  CUDA_KERNEL_LOOP(g, n) {
    const Dtype* p = x + (size_t)(g / spatial) * channels * spatial + g % spatial;
    Dtype acc = eps;
    for (int c = 0; c < channels; ++c) {
      acc += p[c * spatial] * p[c * spatial];
    }
    norm[g] = sqrt(acc);
  }
}

__global__ void normalize_forward(const int n, const int dim, const int channels, const int spatial,
                                  const int across, const int shared, const Dtype* x, const Dtype* norm,
                                  const Dtype* scale, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = x[i] / norm[normalize_group(i, dim, spatial, across)] *
           normalize_scale(scale, i, channels, spatial, shared);
  }
}

// across_spatial backward: one block per sample; t[n] = sum_j s_j dy_j x_j.
__global__ void normalize_dot_across(const int dim, const int channels, const int spatial, const int shared,
                                     const Dtype* x, const Dtype* dy, const Dtype* scale, Dtype* t) {
  __shared__ Dtype smem[NORMALIZE_THREADS];
  const size_t base = (size_t)blockIdx.x * dim;
  Dtype acc = 0;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    acc += normalize_scale(scale, j, channels, spatial, shared) * dy[base + j] * x[base + j];
  }
  smem[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) smem[threadIdx.x] += smem[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) t[blockIdx.x] = smem[0];
}

__global__ void normalize_dot_spatial(const int n, const int channels, const int spatial, const int shared,
                                      const Dtype* x, const Dtype* dy, const Dtype* scale, Dtype* t) {
  CUDA_KERNEL_LOOP(g, n) {
    const size_t base = (size_t)(g / spatial) * channels * spatial + g % spatial;
    Dtype acc = 0;
    for (int c = 0; c < channels; ++c) {
      const Dtype s = shared ? scale[0] : scale[c];
      acc += s * dy[base + c * spatial] * x[base + c * spatial];
    }
    t[g] = acc;
  }
}

// dx_i = s_i dy_i / norm - x_i t / norm^3 (exact derivative of y = s x / norm).
__global__ void normalize_backward(const int n, const int dim, const int channels, const int spatial,
                                   const int across, const int shared, const Dtype* x, const Dtype* dy,
                                   const Dtype* norm, const Dtype* t, const Dtype* scale, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int g = normalize_group(i, dim, spatial, across);
    const Dtype r = norm[g];
    dx[i] = normalize_scale(scale, i, channels, spatial, shared) * dy[i] / r - x[i] * t[g] / (r * r * r);
  }
}

// terms for the scale gradient: dy_i x_i / norm (reduced per channel, or in all, afterwards).
__global__ void normalize_scale_terms(const int n, const int dim, const int spatial, const int across,
                                      const Dtype* x, const Dtype* dy, const Dtype* norm, Dtype* terms) {
  CUDA_KERNEL_LOOP(i, n) {
    terms[i] = dy[i] * x[i] / norm[normalize_group(i, dim, spatial, across)];
  }
}
