// Tile: bottom (outer, inner) -> top (outer, tiles, inner).

__global__ void tile_forward(const int n, const int inner, const int tiles, const Dtype* x,
                             Dtype* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const int d = i % inner;
    const int o = i / (inner * tiles);
    y[i] = x[o * inner + d];
  }
}

// One thread per bottom element: dx[o, d] = sum_t dy[o, t, d].
__global__ void tile_backward(const int n, const int inner, const int tiles, const Dtype* dy,
                              Dtype* dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int d = i % inner;
    const int o = i / inner;
    const Dtype* src = dy + o * tiles * inner + d;
    Mtype acc = 0;  // the sum in Mtype (to_m / from_m from the backend prelude)
    for (int t = 0; t < tiles; ++t) {
      acc += to_m(src[t * inner]);
    }
    dx[i] = from_m(acc);
  }
}
