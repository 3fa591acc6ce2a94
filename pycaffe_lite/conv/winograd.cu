// Winograd F(2x2, 3x3) transforms for 3x3, stride-1, undilated convolution (Lavin & Gray 2015).
// A 2x2 output tile at (2*ty, 2*tx) reads the 4x4 input patch at (2*ty - pad_h, 2*tx - pad_w):
//     Y = A^T [ (G g G^T) .* (B^T d B) ] A
// with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
// A^T = [1 1 1 0; 0 1 -1 -1]. The 16 products .* become 16 GEMMs over channels, done by cuBLAS:
//     filter  U[xi][m][c]   (or U[xi][c][m] for the flipped, transposed filter of the data grad)
//     input   V[xi][c][t]   t = (n, ty, tx) tile index, T tiles in all
//     output  Mo[xi][m][t] = sum_c U[xi][m][c] V[xi][c][t]
// The weight gradient uses the adjoints: dMo = A dY A^T per tile, dU[xi] = dMo[xi] V[xi]^T,
// dW = G^T dU G; there the tiles are stored in blocks so that the long sum over tiles splits into
// one batched GEMM over (xi, block) plus a reduction over blocks. Dtype, Mtype, to_m, from_m and
// CUDA_KERNEL_LOOP come from the backend prelude: the transforms are computed in Mtype.
#include "epilogue.cuh"

// 1-D transforms of four values (in place in the caller's registers).
__device__ __forceinline__ void wino_bt4(Mtype& a, Mtype& b, Mtype& c, Mtype& d) {  // B^T
  const Mtype t0 = a - c, t1 = b + c, t2 = c - b, t3 = b - d;
  a = t0; b = t1; c = t2; d = t3;
}

__device__ __forceinline__ void wino_a4(const Mtype y0, const Mtype y1, Mtype* m) {  // A (adjoint of A^T)
  m[0] = y0; m[1] = y0 + y1; m[2] = y0 - y1; m[3] = -y1;
}

// U from the weights (num_output, channels, 3, 3). flip = 0: U[xi][m][c] from w[m][c];
// flip = 1: U[xi][c][m] from w[m][c] rotated by 180 degrees (the data-gradient filter).
__global__ void winograd_filter(const int count, const Dtype* w, const int num_output, const int channels,
                                const int flip, Dtype* u) {
  CUDA_KERNEL_LOOP(index, count) {  // index = m * channels + c
    const int m = index / channels, c = index - m * channels;
    const Dtype* g = w + index * 9;
    Mtype k[3][3];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) k[i][j] = to_m(flip ? g[(2 - i) * 3 + (2 - j)] : g[i * 3 + j]);
    Mtype t[4][3];  // G k
    for (int j = 0; j < 3; ++j) {
      t[0][j] = k[0][j];
      t[1][j] = Mtype(0.5) * (k[0][j] + k[1][j] + k[2][j]);
      t[2][j] = Mtype(0.5) * (k[0][j] - k[1][j] + k[2][j]);
      t[3][j] = k[2][j];
    }
    const int stride = num_output * channels;  // elements per xi plane
    const int at = flip ? c * num_output + m : m * channels + c;
    for (int i = 0; i < 4; ++i) {  // (G k) G^T
      u[(i * 4 + 0) * stride + at] = from_m(t[i][0]);
      u[(i * 4 + 1) * stride + at] = from_m(Mtype(0.5) * (t[i][0] + t[i][1] + t[i][2]));
      u[(i * 4 + 2) * stride + at] = from_m(Mtype(0.5) * (t[i][0] - t[i][1] + t[i][2]));
      u[(i * 4 + 3) * stride + at] = from_m(t[i][2]);
    }
  }
}

// dW[m][c] += G^T dU[.][m][c] G, dU: (16, num_output, channels).
__global__ void winograd_filter_grad(const int count, const Dtype* du, const int num_output,
                                     const int channels, Dtype* dw) {
  CUDA_KERNEL_LOOP(index, count) {  // index = m * channels + c
    const int stride = num_output * channels;
    Mtype v[4][4];
    for (int xi = 0; xi < 16; ++xi) v[xi / 4][xi % 4] = to_m(du[xi * stride + index]);
    Mtype t[3][4];  // G^T v
    for (int j = 0; j < 4; ++j) {
      t[0][j] = v[0][j] + Mtype(0.5) * (v[1][j] + v[2][j]);
      t[1][j] = Mtype(0.5) * (v[1][j] - v[2][j]);
      t[2][j] = Mtype(0.5) * (v[1][j] + v[2][j]) + v[3][j];
    }
    Dtype* g = dw + index * 9;
    for (int i = 0; i < 3; ++i) {  // (G^T v) G
      const Mtype e0 = t[i][0] + Mtype(0.5) * (t[i][1] + t[i][2]);
      g[i * 3 + 0] = from_m(to_m(g[i * 3 + 0]) + e0);
      const Mtype e1 = Mtype(0.5) * (t[i][1] - t[i][2]);
      g[i * 3 + 1] = from_m(to_m(g[i * 3 + 1]) + e1);
      const Mtype e2 = Mtype(0.5) * (t[i][1] + t[i][2]) + t[i][3];
      g[i * 3 + 2] = from_m(to_m(g[i * 3 + 2]) + e2);
    }
  }
}

// V[xi][c][t] = (B^T d B)[xi] for the 4x4 patch of image n, channel c at tile (ty, tx); the
// images are (num, channels, height, width); tiles_h x tiles_w tiles per image.
// Layout: tiles in blocks of `block`: V[xi][s][c][tt] with t = s * block + tt, count = channels *
// (number of blocks) * block elements per xi plane; tiles t >= num_tiles (the padding of the last
// block) are zero. block = num_tiles gives V[xi][c][t].
__global__ void winograd_input(const int count, const Dtype* x, const int channels, const int height,
                               const int width, const int pad_h, const int pad_w, const int tiles_h,
                               const int tiles_w, const int num_tiles, const int block, Dtype* v) {
  CUDA_KERNEL_LOOP(index, count) {  // index = (s * channels + c) * block + tt
    const int s = index / (channels * block), rem = index - s * channels * block;
    const int c = rem / block, t = s * block + rem - c * block;
    Dtype* out = v + index;
    if (t >= num_tiles) {
      for (int xi = 0; xi < 16; ++xi) out[(long long)xi * count] = Dtype(0);
      continue;
    }
    const int tx = t % tiles_w, ty = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    const Dtype* plane = x + ((long long)n * channels + c) * height * width;
    const int y0 = 2 * ty - pad_h, x0 = 2 * tx - pad_w;
    Mtype d[4][4];
    for (int i = 0; i < 4; ++i) {
      const int yy = y0 + i;
      const bool row_ok = yy >= 0 && yy < height;
      for (int j = 0; j < 4; ++j) {
        const int xx = x0 + j;
        d[i][j] = (row_ok && xx >= 0 && xx < width) ? to_m(plane[yy * width + xx]) : Mtype(0);
      }
    }
    for (int j = 0; j < 4; ++j) wino_bt4(d[0][j], d[1][j], d[2][j], d[3][j]);  // B^T d
    for (int i = 0; i < 4; ++i) wino_bt4(d[i][0], d[i][1], d[i][2], d[i][3]);  // (B^T d) B
    for (int xi = 0; xi < 16; ++xi) out[(long long)xi * count] = from_m(d[xi / 4][xi % 4]);
  }
}

// Y[n][m] tile (ty, tx) = A^T Mo[.][m][t] A, then the epilogue (conv_epilogue.cuh), cropped to
// height_out x width_out.
__global__ void winograd_output(const int count, const Dtype* mo, const int num_output, const int tiles_h,
                                const int tiles_w, const int num_tiles, const int height_out,
                                const int width_out, const Dtype* bias, const int epilogue, Dtype* y) {
  CUDA_KERNEL_LOOP(index, count) {  // index = m * num_tiles + t
    const int m = index / num_tiles, t = index - m * num_tiles;
    const int tx = t % tiles_w, ty = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    const long long plane_stride = (long long)num_output * num_tiles;
    Mtype v[4][4];
    for (int xi = 0; xi < 16; ++xi) v[xi / 4][xi % 4] = to_m(mo[xi * plane_stride + index]);
    Mtype r[2][4];  // A^T v
    for (int j = 0; j < 4; ++j) {
      r[0][j] = v[0][j] + v[1][j] + v[2][j];
      r[1][j] = v[1][j] - v[2][j] - v[3][j];
    }
    Dtype* plane = y + ((long long)n * num_output + m) * height_out * width_out;
    for (int i = 0; i < 2; ++i) {
      const int yy = 2 * ty + i;
      if (yy >= height_out) continue;
      const Dtype o0 = conv_epilogue(r[i][0] + r[i][1] + r[i][2], bias, m, epilogue);
      const Dtype o1 = conv_epilogue(r[i][1] - r[i][2] - r[i][3], bias, m, epilogue);
      const int x0 = 2 * tx;
      plane[yy * width_out + x0] = o0;
      if (x0 + 1 < width_out) plane[yy * width_out + x0 + 1] = o1;
    }
  }
}

// Adjoint of winograd_output: dMo[xi][s][m][tt] = (A dY A^T)[xi] for the 2x2 top-gradient tile
// (zero beyond height_out x width_out), tiles in blocks as in winograd_input.
__global__ void winograd_output_grad(const int count, const Dtype* dy, const int num_output, const int tiles_h,
                                     const int tiles_w, const int num_tiles, const int block,
                                     const int height_out, const int width_out, Dtype* dmo) {
  CUDA_KERNEL_LOOP(index, count) {  // index = (s * num_output + m) * block + tt
    const int s = index / (num_output * block), rem = index - s * num_output * block;
    const int m = rem / block, t = s * block + rem - m * block;
    Dtype* out = dmo + index;
    if (t >= num_tiles) {
      for (int xi = 0; xi < 16; ++xi) out[(long long)xi * count] = Dtype(0);
      continue;
    }
    const int tx = t % tiles_w, ty = (t / tiles_w) % tiles_h, n = t / (tiles_w * tiles_h);
    const Dtype* plane = dy + ((long long)n * num_output + m) * height_out * width_out;
    Mtype g[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int yy = 2 * ty + i, xx = 2 * tx + j;
        g[i][j] = (yy < height_out && xx < width_out) ? to_m(plane[yy * width_out + xx]) : Mtype(0);
      }
    Mtype c0[4], c1[4];  // A g: columns j = 0, 1 expanded to 4 rows
    wino_a4(g[0][0], g[1][0], c0);
    wino_a4(g[0][1], g[1][1], c1);
    for (int i = 0; i < 4; ++i) {  // (A g) A^T
      Mtype row[4];
      wino_a4(c0[i], c1[i], row);
      for (int j = 0; j < 4; ++j) out[(long long)(i * 4 + j) * count] = from_m(row[j]);
    }
  }
}
