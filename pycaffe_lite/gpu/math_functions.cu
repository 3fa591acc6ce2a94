// Shared element-wise kernels (Caffe's math_functions.cu role). Dtype/CUDA_KERNEL_LOOP: prelude.

__global__ void set_kernel(const int n, const Dtype v, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = v; }
}
__global__ void add_scalar_kernel(const int n, const Dtype v, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] += v; }
}
__global__ void add_kernel(const int n, const Dtype* a, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] + b[i]; }
}
__global__ void sub_kernel(const int n, const Dtype* a, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] - b[i]; }
}
__global__ void mul_kernel(const int n, const Dtype* a, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] * b[i]; }
}
__global__ void div_kernel(const int n, const Dtype* a, const Dtype* b, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = a[i] / b[i]; }
}
__global__ void scale_kernel(const int n, const Dtype alpha, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = alpha * x[i]; }
}
__global__ void axpby_kernel(const int n, const Dtype alpha, const Dtype* x, const Dtype beta,
                             Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = alpha * x[i] + beta * y[i]; }
}
__global__ void powx_kernel(const int n, const Dtype* a, const Dtype alpha, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = pow(a[i], alpha); }
}
__global__ void exp_kernel(const int n, const Dtype* a, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = exp(a[i]); }
}
__global__ void log_kernel(const int n, const Dtype* a, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = log(a[i]); }
}
__global__ void abs_kernel(const int n, const Dtype* a, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = fabs(a[i]); }
}
__global__ void sqrt_kernel(const int n, const Dtype* a, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = sqrt(a[i]); }
}
__global__ void sign_kernel(const int n, const Dtype* a, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] = (Dtype(0) < a[i]) - (a[i] < Dtype(0)); }
}
// y(rows, cols) += bias[col]
__global__ void add_bias_kernel(const int n, const int cols, const Dtype* bias, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] += bias[i % cols]; }
}
// y(num, channels, spatial) += bias[channel]
__global__ void add_channel_bias_kernel(const int n, const int channels, const int spatial,
                                        const Dtype* bias, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) { y[i] += bias[(i / spatial) % channels]; }
}
// out[c] = beta * out[c] + sum over (num, spatial) of x(num, channels, spatial); one block per c.
__global__ void channel_sum_kernel(const int num, const int channels, const int spatial,
                                   const Dtype* x, const Dtype beta, Dtype* out) {
  extern __shared__ unsigned char smem_raw[];
  Dtype* buf = reinterpret_cast<Dtype*>(smem_raw);
  const int c = blockIdx.x;
  Dtype acc = 0;
  const int per = num * spatial;
  for (int j = threadIdx.x; j < per; j += blockDim.x) {
    const int nn = j / spatial, s = j - nn * spatial;
    acc += x[(nn * channels + c) * spatial + s];
  }
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) buf[threadIdx.x] += buf[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[c] = (beta == Dtype(0) ? Dtype(0) : beta * out[c]) + buf[0];
}
