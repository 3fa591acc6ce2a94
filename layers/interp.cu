// Interp: aligned-corner bilinear resize of each (H, W) plane, reading the Hi x Wi window that
// starts at (off, off). Source indices and weights come from per-axis tables built on the host
// (axis_tables in interp.py, in the fork's single precision), so every kernel samples exactly as
// the CPU path does. Per axis (n_in -> n_out), with lo(o) the lower source index of output o and
// lam(o) its upper weight:
//   pairs[2 * n_out]  int   (lo(o), lo(o) + step(o)), step 0 at the last source index
//   starts[n_in + 1]  int   first output o with lo(o) >= a (lo is non-decreasing)
//   lam[n_out]        Dtype the upper weight
//   wp[n_out], wq[n_out] Dtype the output's weight on lo(o) and on lo(o) + 1 (the adjoint's)
//
// Each lane's part of the forward lies inside FOR_LANE, so that a host build can run a warp's lanes
// one after another (tests/layers/test_interp_kernels_on_host.py).

#ifndef FOR_LANE
#define FOR_LANE(lane) for (int lane = threadIdx.x & 31, lane_once_ = 1; lane_once_; lane_once_ = 0)
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
// window), no atomics, a fixed summation order. Two passes through a global intermediate T
// (planes x Hi x Wo, rows of exactly Wo elements):
//  1. T[a][w] = sum over the top rows h sampling bottom row a of their weight on a times dy[h][w].
//     The top rows with lo(h) = g form group g (rows starts[g] .. starts[g + 1] - 1); group g gives
//     sp(g) = sum wp(h) dy[h][w] to row g and sq(g) = sum wq(h) dy[h][w] to row g + 1, so
//     T[a][w] = sp(a) + sq(a - 1) (sq(-1) = 0; no sq terms when copying).
//  2. dx[a][b] = sum of wp_col(w) T[a][w] over the w with lo(w) = b, plus sum of wq_col(w) T[a][w]
//     over the w with lo(w) = b - 1 (two contiguous ranges of T's row).

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

// Pass 1 (rows): one thread per (plane, band k of `bands`, top column w), the band covering the
// window's rows k * Hi / bands .. (k + 1) * Hi / bands - 1, walking groups a0 - 1 .. a1 - 1
// (carry = sq(g - 1), T[g] = sq(g - 1) + sp(g)); consecutive threads take consecutive columns, so
// every top row is read coalesced, and once (a band's first group also by the band above, at about
// the same time). count = planes * bands * Wo.
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

// dx of bottom column bc (window coordinates) from row Trow of T: its sum over a contiguous range of
// the row, with the column weights (zeros outside the window are the caller's).
__device__ __forceinline__ Dtype interp_col_sum(const Dtype* Trow, const int bc, const int copy,
                                                const int* __restrict__ cstarts, const Dtype* __restrict__ cwp,
                                                const Dtype* __restrict__ cwq) {
  const int w0 = cstarts[bc], w1 = cstarts[bc + 1];
  if (copy) return Trow[w0];
  Dtype sp = 0, sq = 0;
  for (int w = w0; w < w1; ++w) sp += cwp[w] * Trow[w];
  if (bc > 0) {
    for (int w = cstarts[bc - 1]; w < w0; ++w) sq += cwq[w] * Trow[w];
  }
  return sp + sq;
}

// Pass 2 (columns): one thread per bottom element (coalesced stores), its sum over a contiguous
// range of T's row (zeros outside the window). count = planes * H * W.
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
    if (a >= 0 && a < Hi && bc >= 0 && bc < Wi) s = interp_col_sum(T + (p * Hi + a) * Wo, bc, copy, cstarts, cwp, cwq);
    dx[i] = s;
  }
}

// Both passes in one kernel for windows whose T plane (Hi x Wo) fits in shared memory: a block per
// plane (grid-stride over planes), pass 1 with one band (a thread per top column, T[g] = carry +
// sp(g) as in interp_backward_rows), a barrier, pass 2 (a thread per bottom element of the plane),
// so T never leaves the SM; same sums in the same order as the two-pass kernels with one band.
// Each thread's part of a phase lies inside FOR_THREAD, so that a host build can run the threads
// one after another.
#ifndef FOR_THREAD
#define FOR_THREAD(tid) for (int tid = threadIdx.x, thread_once_ = 1; thread_once_; thread_once_ = 0)
#endif
#define INTERP_FUSED_SMEM 2048  // most elements of T (Hi * Wo); FUSED_SMEM in interp.py

__global__ void interp_backward_fused(const int planes, const int H, const int W, const int off, const int Hi,
                                      const int Wi, const int Ho, const int Wo, const int copy,
                                      const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                      const Dtype* __restrict__ rwq, const int* __restrict__ cstarts,
                                      const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                      const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  __shared__ Dtype T[INTERP_FUSED_SMEM];
  for (long long p = blockIdx.x; p < planes; p += gridDim.x) {
    FOR_THREAD(tid) {
      for (int w = tid; w < Wo; w += blockDim.x) {
        const Dtype* col = dy + p * Ho * Wo + w;
        Dtype sp, sq, carry = 0;
        for (int g = 0; g < Hi; ++g) {
          interp_group_sums(col, Wo, g, copy, rstarts, rwp, rwq, sp, sq);
          T[g * Wo + w] = carry + sp;
          carry = sq;
        }
      }
    }
    __syncthreads();
    FOR_THREAD(tid) {
      for (int e = tid; e < H * W; e += blockDim.x) {
        const int bc = e % W - off, a = e / W - off;
        Dtype s = 0;
        if (a >= 0 && a < Hi && bc >= 0 && bc < Wi) s = interp_col_sum(T + a * Wo, bc, copy, cstarts, cwp, cwq);
        dx[p * H * W + e] = s;
      }
    }
    __syncthreads();  // T is rewritten for the next plane
  }
}
