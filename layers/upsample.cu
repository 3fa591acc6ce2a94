// Upsample kernels (max-unpooling by a mask is math_functions' plane_scatter / plane_gather).

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
