// SoftmaxWithLoss on (outer, channels, inner) probabilities and (outer, inner) labels.
// Dtype and CUDA_KERNEL_LOOP come from the backend prelude.

#define SOFTMAX_LOSS_FLT_MIN 1.17549435e-38f

// Per position p = (o, s): loss[p] = -log(max(prob[o, label, s], FLT_MIN)), valid[p] = 1; both 0
// for ignored positions. A label outside [0, channels) gives a NaN loss instead of a bad read.
__global__ void softmax_loss_forward(const int n, const Dtype* prob, const Dtype* label,
                                     const int channels, const int inner, const int has_ignore,
                                     const int ignore_label, Dtype* loss, Dtype* valid) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const int l = static_cast<int>(label[p]);
    if (has_ignore && l == ignore_label) {
      loss[p] = 0;
      valid[p] = 0;
    } else if (l < 0 || l >= channels) {
      loss[p] = Dtype(__int_as_float(0x7fffffff));
      valid[p] = 1;
    } else {
      const Dtype q = prob[(o * channels + l) * inner + s];
      loss[p] = -log(max(q, Dtype(SOFTMAX_LOSS_FLT_MIN)));
      valid[p] = 1;
    }
  }
}

// One block: top[0] = sum(loss) / norm with norm = max(1, use_valid ? sum(valid) : fixed_norm);
// norm_out[0] = norm (read by the backward kernel). Shared memory: 2 * blockDim.x Dtypes.
__global__ void softmax_loss_reduce(const int n, const Dtype* loss, const Dtype* valid,
                                    const int use_valid, const Dtype fixed_norm, Dtype* top,
                                    Dtype* norm_out) {
  extern __shared__ unsigned char softmax_loss_smem[];
  Dtype* sl = reinterpret_cast<Dtype*>(softmax_loss_smem);
  Dtype* sc = sl + blockDim.x;
  Dtype al = 0, ac = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    al += loss[i];
    ac += valid[i];
  }
  sl[threadIdx.x] = al;
  sc[threadIdx.x] = ac;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) {
      sl[threadIdx.x] += sl[threadIdx.x + step];
      sc[threadIdx.x] += sc[threadIdx.x + step];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const Dtype norm = max(Dtype(1), use_valid ? sc[0] : fixed_norm);
    top[0] = sl[0] / norm;
    norm_out[0] = norm;
  }
}

// Per element (o, c, s): dx = (prob - [c == label]) * top_diff[0] / norm[0]; 0 where ignored.
__global__ void softmax_loss_backward(const int count, const Dtype* prob, const Dtype* label,
                                      const int channels, const int inner, const int has_ignore,
                                      const int ignore_label, const Dtype* top_diff,
                                      const Dtype* norm, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int s = i % inner;
    const int c = (i / inner) % channels;
    const int o = i / (inner * channels);
    const int l = static_cast<int>(label[o * inner + s]);
    if (has_ignore && l == ignore_label) {
      dx[i] = 0;
    } else {
      dx[i] = (prob[i] - (c == l ? Dtype(1) : Dtype(0))) * (top_diff[0] / norm[0]);
    }
  }
}
