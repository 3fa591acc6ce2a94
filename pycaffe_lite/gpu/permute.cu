// Axis permutations dst = src.transpose(order), planned on the host by permute.py (which states
// the plan: axes collapsed, size-1 axes dropped, kernel chosen). dst is always written in its own
// (contiguous) order; every element once, no accumulation. Two kernels:
//
// permute_gather_v{1,4}: one pass over dst units (W elements; a grid-stride loop, ITEMS units a
//   thread loaded before any is stored). Unit u's src offset comes from u written in the mixed
//   radix of up to 5 axes (innermost dst axis first; size 1 / stride 0 pads): the plan uses it when
//   the innermost dst axis is also innermost in src (contiguous runs, W = 4 when the run length
//   and the pointers allow) or when the transposed planes are too small to tile. Divisions by the
//   axis sizes are magic-number multiplies (fast_div), exact for 0 <= u < 2^31.
//
// permute_tiles: the innermost dst axis t (dst stride 1, src stride t_src) differs from the
//   innermost src axis i (src stride 1, dst stride i_dst). A block moves one 2^lgt x 2^lgi tile of
//   that (t, i) plane through shared memory: reads along i, writes along t, both coalesced. Block
//   blockIdx.x = batch * tiles + tile (tile = tt * tiles_i + ti); batch is written in the mixed
//   radix of up to 4 further axes (n*, with src strides s* and dst strides d*; size 1 pads). The
//   shared tile has rows of `pitch` elements (pitch = tile width + padding chosen by the plan so a
//   warp's column reads hit distinct banks).
#include "vec.cuh"

#define PERMUTE_THREADS 256
#define PERMUTE_GATHER_ITEMS 4
#define PERMUTE_TILE 2048                               // elements of a full tile
#define PERMUTE_TILE_ITEMS (PERMUTE_TILE / PERMUTE_THREADS)
#define PERMUTE_SMEM (PERMUTE_TILE + PERMUTE_TILE / 2)  // the plan keeps tile rows x pitch below this

extern "C++" {
// n / d for 0 <= n < 2^31 with shift = ceil(log2 d), magic = 2^32 (2^shift - d) / d + 1.
__device__ __forceinline__ int fast_div(const int n, const unsigned magic, const int shift) {
  return static_cast<int>((__umulhi(static_cast<unsigned>(n), magic) + static_cast<unsigned>(n)) >> shift);
}

// src offset of dst unit u: digit k of u in radix (n0, n1, ...) times stride s_k.
__device__ __forceinline__ int gather_offset(int u, const int n0, const unsigned m0, const int h0,
                                             const int s0, const int n1, const unsigned m1,
                                             const int h1, const int s1, const int n2,
                                             const unsigned m2, const int h2, const int s2,
                                             const int n3, const unsigned m3, const int h3,
                                             const int s3, const int s4) {
  int off = 0, q;
  q = fast_div(u, m0, h0);
  off += (u - q * n0) * s0;
  u = q;
  q = fast_div(u, m1, h1);
  off += (u - q * n1) * s1;
  u = q;
  q = fast_div(u, m2, h2);
  off += (u - q * n2) * s2;
  u = q;
  q = fast_div(u, m3, h3);
  off += (u - q * n3) * s3;
  return off + q * s4;  // the last axis needs no division: q < n4
}

template <int W>
__device__ void permute_gather(const int n, const Dtype* src, Dtype* dst, const int n0,
                               const unsigned m0, const int h0, const int s0, const int n1,
                               const unsigned m1, const int h1, const int s1, const int n2,
                               const unsigned m2, const int h2, const int s2, const int n3,
                               const unsigned m3, const int h3, const int s3, const int s4) {
  const int step = blockDim.x * gridDim.x;
  for (int first = blockIdx.x * blockDim.x + threadIdx.x; first < n;
       first += PERMUTE_GATHER_ITEMS * step) {
    Vec<W> v[PERMUTE_GATHER_ITEMS];
#pragma unroll
    for (int k = 0; k < PERMUTE_GATHER_ITEMS; ++k) {
      const int u = first + k * step;
      if (u < n)
        v[k] = vload<W>(src, gather_offset(u, n0, m0, h0, s0, n1, m1, h1, s1, n2, m2, h2, s2,
                                           n3, m3, h3, s3, s4));
    }
#pragma unroll
    for (int k = 0; k < PERMUTE_GATHER_ITEMS; ++k) {
      const int u = first + k * step;
      if (u < n) vstore<W>(dst, u, v[k]);
    }
  }
}

// Where block `block`'s tile starts: the (t, i) tile indices and the batch's src/dst offsets.
struct TileOrigin {
  int t0, i0, src, dst;
};

__device__ __forceinline__ TileOrigin tile_origin(int block, const int lgt, const int lgi,
                                                  const int tiles_i, const int tiles,
                                                  const int n0, const int s0, const int d0,
                                                  const int n1, const int s1, const int d1,
                                                  const int n2, const int s2, const int d2,
                                                  const int s3, const int d3) {
  int b = block / tiles;
  const int tl = block - b * tiles;
  const int tt = tl / tiles_i;
  TileOrigin o;
  o.t0 = tt << lgt;
  o.i0 = (tl - tt * tiles_i) << lgi;
  int q = b / n0;
  o.src = (b - q * n0) * s0;
  o.dst = (b - q * n0) * d0;
  b = q;
  q = b / n1;
  o.src += (b - q * n1) * s1;
  o.dst += (b - q * n1) * d1;
  b = q;
  q = b / n2;
  o.src += (b - q * n2) * s2 + q * s3;
  o.dst += (b - q * n2) * d2 + q * d3;
  return o;
}
}  // extern "C++"

#define GATHER(W)                                                                             \
  __global__ void __launch_bounds__(PERMUTE_THREADS) permute_gather_v##W(                     \
      const int n, const Dtype* src, Dtype* dst, const int n0, const unsigned m0,             \
      const int h0, const int s0, const int n1, const unsigned m1, const int h1, const int s1, \
      const int n2, const unsigned m2, const int h2, const int s2, const int n3,              \
      const unsigned m3, const int h3, const int s3, const int s4) {                          \
    permute_gather<W>(n, src, dst, n0, m0, h0, s0, n1, m1, h1, s1, n2, m2, h2, s2, n3, m3, h3, \
                      s3, s4);                                                                \
  }
GATHER(1)
GATHER(4)

__global__ void __launch_bounds__(PERMUTE_THREADS)
permute_tiles(const Dtype* src, Dtype* dst, const int nt, const int ni, const int t_src,
              const int i_dst, const int lgt, const int lgi, const int pitch, const int tiles_i,
              const int tiles, const int n0, const int s0, const int d0, const int n1,
              const int s1, const int d1, const int n2, const int s2, const int d2, const int s3,
              const int d3) {
  __shared__ Dtype tile[PERMUTE_SMEM];
  const TileOrigin o = tile_origin(blockIdx.x, lgt, lgi, tiles_i, tiles, n0, s0, d0, n1, s1, d1,
                                   n2, s2, d2, s3, d3);
  const int vt = min(nt - o.t0, 1 << lgt), vi = min(ni - o.i0, 1 << lgi);  // valid extents
  const int size = 1 << (lgt + lgi);
  src += o.src + o.t0 * t_src + o.i0;
  dst += o.dst + o.i0 * i_dst + o.t0;
  Dtype v[PERMUTE_TILE_ITEMS];
#pragma unroll
  for (int k = 0; k < PERMUTE_TILE_ITEMS; ++k) {  // read along i (src stride 1), all loads first
    const int l = threadIdx.x + k * PERMUTE_THREADS;
    const int i = l & ((1 << lgi) - 1), t = l >> lgi;
    if (l < size && i < vi && t < vt) v[k] = src[t * t_src + i];
  }
#pragma unroll
  for (int k = 0; k < PERMUTE_TILE_ITEMS; ++k) {
    const int l = threadIdx.x + k * PERMUTE_THREADS;
    const int i = l & ((1 << lgi) - 1), t = l >> lgi;
    if (l < size && i < vi && t < vt) tile[t * pitch + i] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < PERMUTE_TILE_ITEMS; ++k) {  // write along t (dst stride 1)
    const int l = threadIdx.x + k * PERMUTE_THREADS;
    const int t = l & ((1 << lgt) - 1), i = l >> lgt;
    if (l < size && i < vi && t < vt) dst[i * i_dst + t] = tile[t * pitch + i];
  }
}
