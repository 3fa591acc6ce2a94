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

// permute_narrow_{t,i}: 2 or 3 collapsed axes (batch, i, t) in dst order where one side of the
// (t, i) plane has at most PERMUTE_NARROW elements (NCHW -> NHWC with few channels, and back).
// One warp moves 32 consecutive positions of the long side x all of the short side through its
// own shared slab (rows of `pitch` = short | 1 elements: distinct banks for a column); every
// thread reaches the __syncwarp (spare warps of the last block move nothing). The grid has a warp
// per 32 positions. warp w: batch
// b = w / wpp, positions (w % wpp) * 32 .. + 31 (fewer at the end of the plane).
//   _t: the short side is t (dst stride 1, i_dst = nt): lane l loads src[b][t][p0 + l] for every
//       t (coalesced rows), the warp stores its 32 * nt outputs as one contiguous dst run.
//   _i: the short side is i (src stride 1, t_src = ni): the warp loads its 32 * ni inputs as one
//       contiguous src run, lane l stores dst[b][i][p0 + l] for every i (coalesced rows).
#define PERMUTE_NARROW 32
#define PERMUTE_NARROW_WARPS 4  // most warps per block (NARROW_THREADS / 32 in permute.py)
#define PERMUTE_NARROW_BATCH 16  // loads a lane issues before it stores any

__global__ void __launch_bounds__(PERMUTE_NARROW_WARPS * 32)
permute_narrow_t(const int warps, const Dtype* __restrict__ src, Dtype* __restrict__ dst, const int ni,
                 const int nt, const int t_src, const int wpp, const int b_src, const int b_dst) {
  __shared__ Dtype slab[PERMUTE_NARROW_WARPS][32 * (PERMUTE_NARROW + 1)];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int w = blockIdx.x * (blockDim.x >> 5) + wib;
  const int b = w / wpp, p0 = (w - b * wpp) * 32;
  const int vp = w < warps ? min(32, ni - p0) : 0, pitch = nt | 1;  // vp = 0: a spare warp
  Dtype* s = slab[wib];
  if (lane < vp) {
    const Dtype* in = src + (long long)b * b_src + p0 + lane;
    for (int t0 = 0; t0 < nt; t0 += PERMUTE_NARROW_BATCH) {
      Dtype v[PERMUTE_NARROW_BATCH];
#pragma unroll
      for (int j = 0; j < PERMUTE_NARROW_BATCH; ++j)
        if (t0 + j < nt) v[j] = in[(long long)(t0 + j) * t_src];
#pragma unroll
      for (int j = 0; j < PERMUTE_NARROW_BATCH; ++j)
        if (t0 + j < nt) s[lane * pitch + t0 + j] = v[j];
    }
  }
  __syncwarp();
  Dtype* out = dst + (long long)b * b_dst + (long long)p0 * nt;
  const int m = vp * nt, dq = 32 / nt, dr = 32 % nt;
  int q = lane / nt, r = lane - q * nt;  // e = q * nt + r
  for (int e = lane; e < m; e += 32) {
    out[e] = s[q * pitch + r];
    q += dq;
    r += dr;
    if (r >= nt) {
      r -= nt;
      ++q;
    }
  }
}

__global__ void __launch_bounds__(PERMUTE_NARROW_WARPS * 32)
permute_narrow_i(const int warps, const Dtype* __restrict__ src, Dtype* __restrict__ dst, const int ni,
                 const int nt, const int i_dst, const int wpp, const int b_src, const int b_dst) {
  __shared__ Dtype slab[PERMUTE_NARROW_WARPS][32 * (PERMUTE_NARROW + 1)];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const int w = blockIdx.x * (blockDim.x >> 5) + wib;
  const int b = w / wpp, p0 = (w - b * wpp) * 32;
  const int vp = w < warps ? min(32, nt - p0) : 0, pitch = ni | 1;  // vp = 0: a spare warp
  Dtype* s = slab[wib];
  const Dtype* in = src + (long long)b * b_src + (long long)p0 * ni;
  const int m = vp * ni, dq = 32 / ni, dr = 32 % ni;
  int q = lane / ni, r = lane - q * ni;  // e = q * ni + r
  for (int e0 = 0; e0 < m; e0 += 32 * PERMUTE_NARROW_BATCH) {
    Dtype v[PERMUTE_NARROW_BATCH];
#pragma unroll
    for (int j = 0; j < PERMUTE_NARROW_BATCH; ++j) {
      const int e = e0 + j * 32 + lane;
      if (e < m) v[j] = in[e];
    }
#pragma unroll
    for (int j = 0; j < PERMUTE_NARROW_BATCH; ++j) {
      if (e0 + j * 32 + lane < m) s[q * pitch + r] = v[j];
      q += dq;
      r += dr;
      if (r >= ni) {
        r -= ni;
        ++q;
      }
    }
  }
  __syncwarp();
  if (lane < vp) {
    Dtype* out = dst + (long long)b * b_dst + p0 + lane;
    for (int i = 0; i < ni; ++i) out[(long long)i * i_dst] = s[lane * pitch + i];
  }
}

// permute_quads: the narrow plans' 128-bit form, for nt and ni multiples of 4, t_src, i_dst, b_src
// and b_dst multiples of 4 and pointers aligned to 4 elements (the plan's `vector` launches). A
// unit is a 4 x 4 block of the (t, i) plane: four Vec<4> loads along i (src rows t0 .. t0 + 3), a
// transpose in registers, four Vec<4> stores along t (dst rows i0 .. i0 + 3); no shared memory.
// Units are numbered (b, slow, fast) with the short side's quads fastest (t_fast: t is the short
// side), so a warp's loads and stores both cover whole rows of the short side:
//   unit u: fast = u % nfast, slow = u / nfast % nslow, b = u / (nfast * nslow).
#define PERMUTE_QUAD_THREADS 256  // the most threads a block (QUAD_THREADS in permute.py: the launch's)

__global__ void __launch_bounds__(PERMUTE_QUAD_THREADS)
permute_quads(const int n, const Dtype* __restrict__ src, Dtype* __restrict__ dst, const int nfast,
              const int nslow, const int t_fast, const int t_src, const int i_dst, const int b_src,
              const int b_dst) {
  CUDA_KERNEL_LOOP(u, n) {
    const int r = u / nfast, f = u - r * nfast;
    const int b = r / nslow, s = r - b * nslow;
    const int tq = t_fast ? f : s, iq = t_fast ? s : f;
    const Dtype* in = src + b * b_src + 4 * tq * t_src + 4 * iq;
    Dtype* out = dst + b * b_dst + 4 * iq * i_dst + 4 * tq;
    Vec<4> v[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = vload<4>(in + c * t_src, 0);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      Vec<4> w;
#pragma unroll
      for (int c = 0; c < 4; ++c) w.v[c] = v[c].v[k];
      vstore<4>(out + k * i_dst, 0, w);
    }
  }
}
