// Upsample / unpooling kernels (also used by the Unpooling layer).
// Max-unpooling: plane p of S input elements scatters into plane p of T output elements at the
// mask's flat indices (the output zeroed first); indices outside [0, T) are skipped.

__global__ void unpool_forward(const int n, const int S, const int T, const Dtype* x,
                               const Dtype* mask, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int k = static_cast<int>(mask[i]);
    if (k >= 0 && k < T) y[(long long)(i / S) * T + k] = x[i];
  }
}

__global__ void unpool_backward(const int n, const int S, const int T, const Dtype* dy,
                                const Dtype* mask, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int k = static_cast<int>(mask[i]);
    dx[i] = (k >= 0 && k < T) ? dy[(long long)(i / S) * T + k] : Dtype(0);
  }
}

// Nearest neighbour x (planes of H x W) -> y (planes of H*sh x W*sw): one thread per output.
__global__ void upsample_nearest_forward(const int n, const int H, const int W, const int sh,
                                         const int sw, const Dtype* x, Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int Wo = W * sw, Ho = H * sh;
    const int w = i % Wo;
    const int h = (i / Wo) % Ho;
    const int p = i / (Wo * Ho);
    y[i] = x[((long long)p * H + h / sh) * W + w / sw];
  }
}

// One thread per input: the sum of its sh x sw block.
__global__ void upsample_nearest_backward(const int n, const int H, const int W, const int sh,
                                          const int sw, const Dtype* dy, Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int h = (i / W) % H;
    const int p = i / (W * H);
    const int Wo = W * sw;
    const Dtype* src = dy + ((long long)p * H * sh + h * sh) * Wo + w * sw;
    Dtype acc = 0;
    for (int a = 0; a < sh; ++a) {
      for (int b = 0; b < sw; ++b) acc += src[a * Wo + b];
    }
    dx[i] = acc;
  }
}
