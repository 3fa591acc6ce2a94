// Interp: aligned-corner bilinear resize of each (H, W) plane, reading the Hi x Wi window that
// starts at (off, off). Source indices and weights come from per-axis tables built on the host
// (InterpLayer._tables, in the fork's single precision), so every kernel samples exactly as the CPU
// path does. Per axis (n_in -> n_out), with lo(o) the lower source index of output o and lam(o)
// its upper weight:
//   pairs[2 * n_out]  int   (lo(o), lo(o) + step(o)), step 0 at the last source index
//   starts[n_in + 1]  int   first output o with lo(o) >= a (lo is non-decreasing)
//   lam[n_out]        Dtype the upper weight
//   wp[n_out], wq[n_out] Dtype the output's weight on lo(o) and on lo(o) + 1 (the adjoint's)
//
// Each lane's (forward) or thread's (backward) part of a phase lies inside FOR_LANE / FOR_THREAD, so
// that a host build can run the lanes or threads one after another
// (tests/layers/test_interp_kernels_on_host.py).

#ifndef FOR_LANE
#define FOR_LANE(lane) for (int lane = threadIdx.x & 31, lane_once_ = 1; lane_once_; lane_once_ = 0)
#endif
#ifndef FOR_THREAD
#define FOR_THREAD(tid) for (int tid = threadIdx.x, thread_once_ = 1; thread_once_; thread_once_ = 0)
#endif
#ifndef INTERP_BOUNDS
#define INTERP_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#endif
#ifndef INTERP_SHARED
#define INTERP_SHARED(name) extern __shared__ Dtype name[]
#endif

#define INTERP_ROWS_PER_TASK 16  // forward: rows of one column per lane and task

// Forward. Task = (plane, band of INTERP_ROWS_PER_TASK top rows, 32 top columns); lane = one
// column. The lane's column taps are read once per task; the two source rows' column blends are
// kept across top rows and recomputed only when the band moves on to another source row, so a
// top element costs one coalesced store (plus the taps' reads every zoom rows).
// copy: Hi == Ho and Wi == Wo, the top is the window itself (the tables are then the identity).
__global__ void interp_forward(const int planes, const int H, const int W, const int off, const int Ho,
                               const int Wo, const int copy, const int* __restrict__ rpairs,
                               const Dtype* __restrict__ rlam, const int* __restrict__ cpairs,
                               const Dtype* __restrict__ clam, const Dtype* __restrict__ x,
                               Dtype* __restrict__ y) {
  const int bands = (Ho + INTERP_ROWS_PER_TASK - 1) / INTERP_ROWS_PER_TASK;
  const int col_tasks = (Wo + 31) / 32;
  const long long tasks = (long long)planes * bands * col_tasks;
  const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < tasks; t += nwarps) {
    const int ct = (int)(t % col_tasks);
    const long long pb = t / col_tasks;
    const int p = (int)(pb / bands);
    const int h0 = (int)(pb % bands) * INTERP_ROWS_PER_TASK;
    const int h1 = min(h0 + INTERP_ROWS_PER_TASK, Ho);
    FOR_LANE(lane) {
      const int w = ct * 32 + lane;
      if (w < Wo) {
        const Dtype* src = x + (long long)p * H * W + (long long)off * W + off;
        Dtype* dst = y + (long long)p * Ho * Wo + w;
        const int c0 = cpairs[2 * w], c1 = cpairs[2 * w + 1];
        const Dtype wl = clam[w];
        if (copy) {
          for (int h = h0; h < h1; ++h) dst[(long long)h * Wo] = src[(long long)h * W + c0];
        } else {
          int ra = -1, rb = -1;  // source rows whose blends U, L hold
          Dtype U = 0, L = 0;
          for (int h = h0; h < h1; ++h) {
            const int ta = rpairs[2 * h], tb = rpairs[2 * h + 1];
            const Dtype hl = rlam[h];
            if (ta != ra) {  // warp-uniform branches
              if (ta == rb) {
                U = L;
              } else {
                const Dtype* s = src + (long long)ta * W;
                U = (Dtype(1) - wl) * s[c0] + wl * s[c1];
              }
              ra = ta;
            }
            if (tb != rb) {
              if (tb == ra) {
                L = U;
              } else {
                const Dtype* s = src + (long long)tb * W;
                L = (Dtype(1) - wl) * s[c0] + wl * s[c1];
              }
              rb = tb;
            }
            dst[(long long)h * Wo] = (Dtype(1) - hl) * U + hl * L;
          }
        }
      }
    }
  }
}

// Backward, a gather: dx = Ah^T dy Aw per plane, every bottom diff written once (zeros outside the
// window), no atomics, a fixed summation order. Two stages through shared memory, per plane:
//  1. T[a][w] = sum over the top rows h sampling bottom row a of their weight on a times dy[h][w].
//     The top rows with lo(h) = g form group g (rows starts[g] .. starts[g + 1] - 1); group g gives
//     sp(g) = sum wp(h) dy[h][w] to row g and sq(g) = sum wq(h) dy[h][w] to row g + 1, so
//     T[a][w] = sp(a) + sq(a - 1) (sq(-1) = 0; no sq terms when copying).
//  2. dx[a][b] = sum of wp_col(w) T[a][w] over the w with lo(w) = b, plus sum of wq_col(w) T[a][w]
//     over the w with lo(w) = b - 1 (two contiguous ranges of T's row).
// T's rows are stored with ld >= Wo + Wo / 32 elements at index w + w / 32 (threads reading at a
// stride of 8 hit distinct banks). Each thread's part of a phase lies inside FOR_THREAD, phases are
// separated by __syncthreads(), so a host build can run a block's threads one after another.

// The sums of group g over one column (col points at dy[0][w] of the plane; ld the row stride), in
// order of h. The rows are loaded in batches of INTERP_GROUP_BATCH with predicated loads, so a
// group's loads are in flight together whatever its length.
#define INTERP_GROUP_BATCH 8
__device__ __forceinline__ void interp_group_sums(const Dtype* col, const int ld, const int g, const int copy,
                                                  const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                                  const Dtype* __restrict__ rwq, Dtype& sp, Dtype& sq) {
  const int h0 = rstarts[g], h1 = rstarts[g + 1];
  sp = 0;
  sq = 0;
  if (copy) {
    for (int h = h0; h < h1; ++h) sp += col[(long long)h * ld];
    return;
  }
  for (int hb = h0; hb < h1; hb += INTERP_GROUP_BATCH) {
    Dtype v[INTERP_GROUP_BATCH], p[INTERP_GROUP_BATCH], q[INTERP_GROUP_BATCH];
#pragma unroll
    for (int j = 0; j < INTERP_GROUP_BATCH; ++j) {
      const bool in = hb + j < h1;
      v[j] = in ? col[(long long)(hb + j) * ld] : Dtype(0);
      p[j] = in ? rwp[hb + j] : Dtype(0);
      q[j] = in ? rwq[hb + j] : Dtype(0);
    }
#pragma unroll
    for (int j = 0; j < INTERP_GROUP_BATCH; ++j) {
      if (hb + j < h1) {
        sp += p[j] * v[j];
        sq += q[j] * v[j];
      }
    }
  }
}

// Stage 2 for bottom column bc of the window (0 <= bc < Wi), from T's row Trow.
__device__ __forceinline__ Dtype interp_column_sum(const Dtype* Trow, const int bc, const int copy,
                                                   const int* __restrict__ cstarts, const Dtype* __restrict__ cwp,
                                                   const Dtype* __restrict__ cwq) {
  const int w0 = cstarts[bc], w1 = cstarts[bc + 1];
  Dtype sp = 0, sq = 0;  // two chains of additions
  if (copy) return Trow[w0 + (w0 >> 5)];
  for (int w = w0; w < w1; ++w) sp += cwp[w] * Trow[w + (w >> 5)];
  if (bc > 0) {
    for (int w = cstarts[bc - 1]; w < w0; ++w) sq += cwq[w] * Trow[w + (w >> 5)];
  }
  return sp + sq;
}

// Stage 2 for bottom rows R0 .. R1 - 1 of a plane (all W columns, flat and coalesced), the window's
// rows a0 .. a1 - 1 (relative to the window) having T's rows 0 .. a1 - a0 - 1; other rows are zeros.
__device__ __forceinline__ void interp_write_rows(const int tid, const int nthreads, const int R0, const int R1,
                                                  const int a0, const int a1, const int W, const int off,
                                                  const int Wi, const int ld, const int copy, const Dtype* T,
                                                  const int* __restrict__ cstarts, const Dtype* __restrict__ cwp,
                                                  const Dtype* __restrict__ cwq, Dtype* dxp) {
  const int n = (R1 - R0) * W;
  for (int i = tid; i < n; i += nthreads) {
    const int a = R0 + i / W - off, bc = i % W - off;
    Dtype s = 0;
    if (a >= a0 && a < a1 && bc >= 0 && bc < Wi) s = interp_column_sum(T + (a - a0) * ld, bc, copy, cstarts, cwp, cwq);
    dxp[(long long)R0 * W + i] = s;
  }
}

// 16 bytes of Dtype (Y starts the dynamic shared memory, aligned to 16).
#define INTERP_VEC (16 / (int)sizeof(Dtype))
struct alignas(16) interp_vec { Dtype v[INTERP_VEC]; };

// Small planes (the whole top plane and T fit in shared memory): one block per plane (grid-stride
// over planes). The plane's top diff is copied flat into shared memory (each element read once,
// coalesced whatever Wo), then stage 1 for all Hi x Wo sums, then stage 2 for the whole bottom plane.
// Shared memory: Ho * Wo + Hi * ld elements.
__global__ void interp_backward_plane(const int planes, const int H, const int W, const int off, const int Hi,
                                      const int Wi, const int Ho, const int Wo, const int copy, const int ld,
                                      const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                      const Dtype* __restrict__ rwq, const int* __restrict__ cstarts,
                                      const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                      const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  INTERP_SHARED(interp_smem);
  Dtype* Y = interp_smem;
  Dtype* T = interp_smem + Ho * Wo;
  const int nthreads = blockDim.x;
  const int ny = Ho * Wo;
  for (int p = blockIdx.x; p < planes; p += gridDim.x) {
    const Dtype* dyp = dy + (long long)p * ny;
    // 16-byte loads and stores when the plane allows (uniform over the block), two in flight
    const int nv = (ny % INTERP_VEC == 0 && reinterpret_cast<unsigned long long>(dyp) % 16 == 0) ? ny / INTERP_VEC : 0;
    FOR_THREAD(tid) {
      const interp_vec* src = reinterpret_cast<const interp_vec*>(dyp);
      interp_vec* dst = reinterpret_cast<interp_vec*>(Y);
      int j = tid;
      for (; j + nthreads < nv; j += 2 * nthreads) {
        const interp_vec v0 = src[j], v1 = src[j + nthreads];
        dst[j] = v0;
        dst[j + nthreads] = v1;
      }
      for (; j < nv; j += nthreads) dst[j] = src[j];
      int i = nv * INTERP_VEC + tid;
      for (; i + 3 * nthreads < ny; i += 4 * nthreads) {  // four loads in flight per thread
        const Dtype v0 = dyp[i], v1 = dyp[i + nthreads], v2 = dyp[i + 2 * nthreads], v3 = dyp[i + 3 * nthreads];
        Y[i] = v0;
        Y[i + nthreads] = v1;
        Y[i + 2 * nthreads] = v2;
        Y[i + 3 * nthreads] = v3;
      }
      for (; i < ny; i += nthreads) Y[i] = dyp[i];
    }
    __syncthreads();
    FOR_THREAD(tid) {
      for (int i = tid; i < Hi * Wo; i += nthreads) {
        const int a = i / Wo, w = i % Wo;
        Dtype sp, sq, sp1 = 0, sq1 = 0;
        interp_group_sums(Y + w, Wo, a, copy, rstarts, rwp, rwq, sp, sq);
        if (a > 0 && !copy) interp_group_sums(Y + w, Wo, a - 1, copy, rstarts, rwp, rwq, sp1, sq1);
        T[a * ld + w + (w >> 5)] = sp + sq1;
      }
    }
    __syncthreads();
    FOR_THREAD(tid) {
      interp_write_rows(tid, nthreads, 0, H, 0, Hi, W, off, Wi, ld, copy, T, cstarts, cwp, cwq,
                        dx + (long long)p * H * W);
    }
    // The next plane writes Y (read before the last barrier) and T after its first barrier.
  }
}

// Larger planes: one block per (plane, band of bottom rows a0 .. a1 - 1 of the window), band k of
// `bands` per plane covering rows k * Hi / bands .. (k + 1) * Hi / bands - 1 (grid-stride over
// planes * bands). Stage 1: thread = top column w (blockDim.x >= Wo rounded up to 32, or columns
// w, w + blockDim.x, ...), streaming the band's groups a0 - 1 .. a1 - 1 straight from global memory
// (each warp load 32 consecutive columns of one row), each top row read once per band; group a0 - 1
// is also read by the band above, so even bands walk their groups downwards (increasing g) and odd
// bands upwards: both bands at a boundary read its group at about the same time (L2 hits). Stage 2
// writes the band's bottom rows (band 0 also the rows above the window, the last band those below).
// Shared memory: ceil(Hi / bands) * ld elements. At most 768 threads (BAND_THREADS in interp.py);
// the bound (two such blocks an SM, <= 42 registers) keeps a group's batch of dy and weight loads in
// flight together while leaving room for three blocks of DeepLab's 544 threads (40 registers on
// sm_90 with nvcc 13, float; a few spills outside the inner loop).
__global__ void INTERP_BOUNDS(768, 2) interp_backward_band(const int planes, const int bands, const int H, const int W, const int off,
                                     const int Hi, const int Wi, const int Ho, const int Wo, const int copy,
                                     const int ld, const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                     const Dtype* __restrict__ rwq, const int* __restrict__ cstarts,
                                     const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                     const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  INTERP_SHARED(T);
  const int nthreads = blockDim.x;
  const long long tasks = (long long)planes * bands;
  for (long long t = blockIdx.x; t < tasks; t += gridDim.x) {
    const long long p = t / bands;
    const int k = (int)(t % bands);
    const int a0 = (int)((long long)k * Hi / bands), a1 = (int)((long long)(k + 1) * Hi / bands);
    const int g0 = (a0 > 0 && !copy) ? a0 - 1 : a0;  // first group read
    const Dtype* dyp = dy + p * Ho * Wo;
    FOR_THREAD(tid) {
      for (int w = tid; w < Wo; w += nthreads) {
        Dtype* Tw = T + w + (w >> 5);
        Dtype sp, sq, carry = 0;
        if (k & 1) {  // upwards: carry = sp(g + 1), T[g + 1] = sp(g + 1) + sq(g)
          for (int g = a1 - 1; g >= g0; --g) {
            interp_group_sums(dyp + w, Wo, g, copy, rstarts, rwp, rwq, sp, sq);
            if (g + 1 < a1) Tw[(g + 1 - a0) * ld] = carry + sq;
            carry = sp;
          }
          if (g0 == a0) Tw[0] = carry + Dtype(0);
        } else {  // downwards: carry = sq(g - 1), T[g] = sq(g - 1) + sp(g) (the same sum)
          for (int g = g0; g < a1; ++g) {
            interp_group_sums(dyp + w, Wo, g, copy, rstarts, rwp, rwq, sp, sq);
            if (g >= a0) Tw[(g - a0) * ld] = carry + sp;
            carry = sq;
          }
        }
      }
    }
    __syncthreads();
    FOR_THREAD(tid) {
      const int R0 = k == 0 ? 0 : a0 + off, R1 = k == bands - 1 ? H : a1 + off;
      interp_write_rows(tid, nthreads, R0, R1, a0, a1, W, off, Wi, ld, copy, T, cstarts, cwp, cwq,
                        dx + p * H * W);
    }
    __syncthreads();  // stage 2 reads T before the next task's stage 1 writes it
  }
}

// Two passes through a global intermediate T (planes x Hi x Wo, rows of exactly Wo elements), for
// planes too large for one block or too many to give each a block. Pass 1 (rows): one thread per
// (plane, band k of `bands`, top column w), the band covering the window's rows
// k * Hi / bands .. (k + 1) * Hi / bands - 1 as interp_backward_band's downward walk does (the same
// sums in the same order: the results are the band kernel's, bit for bit); consecutive threads take
// consecutive columns, so every top row is read coalesced, and once (a band's first group also by
// the band above, at about the same time). count = planes * bands * Wo.
__global__ void interp_backward_rows(const int count, const int bands, const int Hi, const int Ho, const int Wo,
                                     const int copy, const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                     const Dtype* __restrict__ rwq, const Dtype* __restrict__ dy,
                                     Dtype* __restrict__ T) {
  CUDA_KERNEL_LOOP(i, count) {
    const int w = i % Wo;
    const int pk = i / Wo;
    const int k = pk % bands;
    const long long p = pk / bands;
    const int a0 = (int)((long long)k * Hi / bands), a1 = (int)((long long)(k + 1) * Hi / bands);
    const int g0 = (a0 > 0 && !copy) ? a0 - 1 : a0;
    const Dtype* col = dy + p * Ho * Wo + w;
    Dtype* Tw = T + p * Hi * Wo + w;
    Dtype sp, sq, carry = 0;
    for (int g = g0; g < a1; ++g) {
      interp_group_sums(col, Wo, g, copy, rstarts, rwp, rwq, sp, sq);
      if (g >= a0) Tw[(long long)g * Wo] = carry + sp;
      carry = sq;
    }
  }
}

// Pass 2 (columns): one thread per bottom element (coalesced stores), its sum over a contiguous
// range of T's row as interp_column_sum (zeros outside the window). count = planes * H * W.
__global__ void interp_backward_cols(const int count, const int H, const int W, const int off, const int Hi,
                                     const int Wi, const int Wo, const int copy, const int* __restrict__ cstarts,
                                     const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                     const Dtype* __restrict__ T, Dtype* __restrict__ dx) {
  CUDA_KERNEL_LOOP(i, count) {
    const int bc = i % W - off;
    const int r = i / W;
    const int a = r % H - off;
    const long long p = r / H;
    Dtype s = 0;
    if (a >= 0 && a < Hi && bc >= 0 && bc < Wi) {
      const Dtype* Trow = T + (p * Hi + a) * Wo;
      const int w0 = cstarts[bc], w1 = cstarts[bc + 1];
      if (copy) {
        s = Trow[w0];
      } else {
        Dtype sp = 0, sq = 0;
        for (int w = w0; w < w1; ++w) sp += cwp[w] * Trow[w];
        if (bc > 0) {
          for (int w = cstarts[bc - 1]; w < w0; ++w) sq += cwq[w] * Trow[w];
        }
        s = sp + sq;
      }
    }
    dx[i] = s;
  }
}

// Backward for widths whose rows of T do not fit in shared memory: one thread per bottom element,
// the same sums read straight from dy (tables as above).
__global__ void interp_backward_direct(const int n, const int H, const int W, const int off, const int Hi,
                                       const int Wi, const int Ho, const int Wo, const int copy,
                                       const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                       const Dtype* __restrict__ rwq, const int* __restrict__ cstarts,
                                       const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                       const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  CUDA_KERNEL_LOOP(i, n) {
    const int bc = i % W - off;
    const int ac = (i / W) % H - off;
    const long long p = i / ((long long)W * H);
    Dtype s = 0;
    if (ac >= 0 && ac < Hi && bc >= 0 && bc < Wi) {
      const Dtype* dyp = dy + p * Ho * Wo;
      const int hp0 = rstarts[ac], hp1 = rstarts[ac + 1];
      const int hq0 = (ac > 0 && !copy) ? rstarts[ac - 1] : hp0;
      const int wp0 = cstarts[bc], wp1 = cstarts[bc + 1];
      const int wq0 = (bc > 0 && !copy) ? cstarts[bc - 1] : wp0;
      for (int w = wq0; w < wp1; ++w) {
        Dtype t = 0;
        for (int h = hq0; h < hp1; ++h) t += (h < hp0 ? rwq[h] : rwp[h]) * dyp[(long long)h * Wo + w];
        s += (w < wp0 ? cwq[w] : cwp[w]) * t;
      }
    }
    dx[i] = s;
  }
}
