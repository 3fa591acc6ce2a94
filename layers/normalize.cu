// Normalize (SSD fork): L2 normalization with a learned scale.
// Element i of an (N, C, S) blob (S = spatial size, dim = C*S) has channel c = (i / S) % C and
// belongs to the norm group g = i / dim (across_spatial) or (i / dim) * S + i % S (per position).
// Sums, norms and products are in Mtype (to_m / from_m from the backend prelude), so are the
// shared-memory sums.
#define NORMALIZE_THREADS 256

__device__ __forceinline__ int normalize_group(const int i, const int dim, const int spatial,
                                               const int across) {
  return across ? i / dim : (i / dim) * spatial + i % spatial;
}

__device__ __forceinline__ Mtype normalize_scale(const Dtype* scale, const int i, const int channels,
                                                 const int spatial, const int shared) {
  return to_m(shared ? scale[0] : scale[(i / spatial) % channels]);
}

// across_spatial: one block per sample; norm[n] = sqrt(sum x^2 + eps).
__global__ void normalize_norm_across(const int dim, const Mtype eps, const Dtype* x, Dtype* norm) {
  __shared__ Mtype smem[NORMALIZE_THREADS];
  const Dtype* p = x + (size_t)blockIdx.x * dim;
  Mtype acc = 0;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    acc += to_m(p[j]) * to_m(p[j]);
  }
  smem[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) smem[threadIdx.x] += smem[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) norm[blockIdx.x] = from_m(sqrt(smem[0] + Mtype(eps)));
}

__global__ void normalize_forward(const int n, const int dim, const int channels, const int spatial,
                                  const int across, const int shared, const Dtype* x, const Dtype* norm,
                                  const Dtype* scale, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    y[i] = from_m(to_m(x[i]) / to_m(norm[normalize_group(i, dim, spatial, across)]) *
                  normalize_scale(scale, i, channels, spatial, shared));
  }
}

// across_spatial backward: one block per sample; t[n] = sum_j s_j dy_j x_j.
__global__ void normalize_dot_across(const int dim, const int channels, const int spatial, const int shared,
                                     const Dtype* x, const Dtype* dy, const Dtype* scale, Dtype* t) {
  __shared__ Mtype smem[NORMALIZE_THREADS];
  const size_t base = (size_t)blockIdx.x * dim;
  Mtype acc = 0;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    acc += normalize_scale(scale, j, channels, spatial, shared) * to_m(dy[base + j]) * to_m(x[base + j]);
  }
  smem[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) smem[threadIdx.x] += smem[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) t[blockIdx.x] = from_m(smem[0]);
}

// dx_i = s_i dy_i / norm - x_i t / norm^3 (exact derivative of y = s x / norm).
__global__ void normalize_backward(const int n, const int dim, const int channels, const int spatial,
                                   const int across, const int shared, const Dtype* x, const Dtype* dy,
                                   const Dtype* norm, const Dtype* t, const Dtype* scale, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int g = normalize_group(i, dim, spatial, across);
    const Mtype r = to_m(norm[g]);
    dx[i] = from_m(normalize_scale(scale, i, channels, spatial, shared) * to_m(dy[i]) / r -
                   to_m(x[i]) * to_m(t[g]) / (r * r * r));
  }
}

// terms for the scale gradient: dy_i x_i / norm (reduced per channel, or in all, afterwards).
__global__ void normalize_scale_terms(const int n, const int dim, const int spatial, const int across,
                                      const Dtype* x, const Dtype* dy, const Dtype* norm, Dtype* terms) {
  CUDA_KERNEL_LOOP(i, n) {
    terms[i] = from_m(to_m(dy[i]) * to_m(x[i]) / to_m(norm[normalize_group(i, dim, spatial, across)]));
  }
}

// ---- per position (across_spatial false): one block per (sample, tile of blockDim.x positions) ----
// blockDim = (tx, ty), tx * ty == NORMALIZE_THREADS, both powers of two; block b covers sample
// b / tiles, positions (b % tiles) * tx + threadIdx.x; threadIdx.y strides the channels by ty, so a
// warp reads tx consecutive positions of 32 / tx channels. Every thread runs the same number of
// channel steps (ceil(C / ty)), so whole warps take part in each shuffle.

// Sum of v over threadIdx.y for each threadIdx.x (part: NORMALIZE_THREADS values); every thread of
// the column gets the result. Begins and ends with a barrier, so part may be reused at once.
__device__ __forceinline__ Mtype normalize_column_sum(Mtype v, Mtype* part) {
  const int x = threadIdx.x, tx = blockDim.x;
  __syncthreads();
  part[threadIdx.y * tx + x] = v;
  __syncthreads();
  for (int w = blockDim.y / 2; w > 0; w >>= 1) {
    if (threadIdx.y < w) part[threadIdx.y * tx + x] += part[(threadIdx.y + w) * tx + x];
    __syncthreads();
  }
  const Mtype out = part[x];
  __syncthreads();
  return out;
}

// norm[n, p] = sqrt(eps + sum_c x[n, c, p]^2), then y = x / norm * s_c in the same block.
__global__ void normalize_pixels_forward(const int channels, const int spatial, const int tiles,
                                         const int shared, const Mtype eps, const Dtype* x,
                                         const Dtype* scale, Dtype* norm, Dtype* y) {
  __shared__ Mtype part[NORMALIZE_THREADS];
  const int n = blockIdx.x / tiles;
  const int p = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  const bool live = p < spatial;
  const size_t base = (size_t)n * channels * spatial + p;
  Mtype acc = 0;
  if (live) {
#pragma unroll 4
    for (int c = threadIdx.y; c < channels; c += blockDim.y) {
      const Mtype v = to_m(x[base + (size_t)c * spatial]);
      acc += v * v;
    }
  }
  const Mtype r = sqrt(Mtype(eps) + normalize_column_sum(acc, part));
  if (!live) return;
  if (threadIdx.y == 0) norm[(size_t)n * spatial + p] = from_m(r);
#pragma unroll 4
  for (int c = threadIdx.y; c < channels; c += blockDim.y) {
    const size_t i = base + (size_t)c * spatial;
    y[i] = from_m(to_m(x[i]) / r * to_m(shared ? scale[0] : scale[c]));
  }
}

// Backward per position, one pass over x and dy for the dot product, one for dx:
//   do_dx:    t[n, p] = sum_c s_c dy x (kept in dots), dx = s_c dy / r - x t / r^3;
//   do_scale: partial[b, c] = sum over the block's positions of dy x / r (the scale gradient
//             before the sum over blocks; b = blockIdx.x), a xor butterfly over threadIdx.x.
__global__ void normalize_pixels_backward(const int channels, const int spatial, const int tiles,
                                          const int shared, const int do_dx, const int do_scale,
                                          const Dtype* x, const Dtype* dy, const Dtype* norm,
                                          const Dtype* scale, Dtype* dots, Dtype* partial, Dtype* dx) {
  __shared__ Mtype part[NORMALIZE_THREADS];
  const int n = blockIdx.x / tiles;
  const int p = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  const bool live = p < spatial;
  const size_t base = (size_t)n * channels * spatial + p;
  const size_t g = (size_t)n * spatial + p;
  const Mtype r = live ? to_m(norm[g]) : Mtype(1);
  Mtype t = 0;
  if (do_scale) {
    // Four channel steps at a time: their loads are issued together and their four butterflies
    // interleave (the loop is uniform over the block, so whole warps shuffle). t keeps the
    // channel order of the do_dx-only loop below.
    Dtype* prow = partial + (size_t)blockIdx.x * channels;
    const int ty = blockDim.y;
    for (int c0 = threadIdx.y; c0 - (int)threadIdx.y < channels; c0 += 4 * ty) {
      Mtype term[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = c0 + k * ty;
        Mtype d = 0;
        if (live && c < channels) {
          const size_t i = base + (size_t)c * spatial;
          d = to_m(dy[i]) * to_m(x[i]);
          t += to_m(shared ? scale[0] : scale[c]) * d;
        }
        term[k] = d / r;
      }
      for (int o = blockDim.x / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int k = 0; k < 4; ++k) term[k] += __shfl_xor_sync(0xffffffffu, term[k], o, blockDim.x);
      }
      if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (c0 + k * ty < channels) prow[c0 + k * ty] = from_m(term[k]);
        }
      }
    }
  } else if (do_dx && live) {
#pragma unroll 4
    for (int c = threadIdx.y; c < channels; c += blockDim.y) {
      const size_t i = base + (size_t)c * spatial;
      t += to_m(shared ? scale[0] : scale[c]) * to_m(dy[i]) * to_m(x[i]);
    }
  }
  if (!do_dx) return;
  t = normalize_column_sum(t, part);
  if (!live) return;
  if (threadIdx.y == 0) dots[g] = from_m(t);
  // Reciprocals instead of two divisions per element (a few ulps from the CPU's s dy / r - x t / r^3).
  const Mtype rinv = Mtype(1) / r;
  const Mtype tr3 = t / (r * r * r);
#pragma unroll 4
  for (int c = threadIdx.y; c < channels; c += blockDim.y) {
    const size_t i = base + (size_t)c * spatial;
    dx[i] = from_m(to_m(shared ? scale[0] : scale[c]) * to_m(dy[i]) * rinv - to_m(x[i]) * tr3);
  }
}
