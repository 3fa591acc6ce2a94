// blas.dot and blas.asum of the half types (cuBLAS's DotEx would round its result to the storage
// type; it has no mixed asum): one block of BLAS_REDUCE_THREADS threads sums in Mtype and writes
// the float result to out[0]. mode 0: sum of x[i] * y[i]; mode 1: sum of |x[i]| (y unread).
// Compiles for every Dtype (float and double use cuBLAS's S and D routines instead).
#define BLAS_REDUCE_THREADS 1024

__global__ void blas_reduce(const int n, const Dtype* x, const Dtype* y, const int mode, float* out) {
  __shared__ Mtype part[BLAS_REDUCE_THREADS];
  Mtype sum = Mtype(0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const Mtype v = to_m(x[i]);
    sum += mode == 0 ? v * to_m(y[i]) : fabs(v);
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = (float)part[0];
}
