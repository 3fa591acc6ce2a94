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
// Blends and sums are in Mtype (to_m / from_m from the backend prelude), so is T in shared memory
// (interp.py sizes it by the math type).
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
        const Mtype wl = to_m(clam[w]);
        if (copy) {
          for (int h = h0; h < h1; ++h) dst[(long long)h * Wo] = src[(long long)h * W + c0];
        } else {
          int ra = -1, rb = -1;  // source rows whose blends U, L hold
          Mtype U = 0, L = 0;
          for (int h = h0; h < h1; ++h) {
            const int ta = rpairs[2 * h], tb = rpairs[2 * h + 1];
            const Mtype hl = to_m(rlam[h]);
            if (ta != ra) {  // warp-uniform branches
              if (ta == rb) {
                U = L;
              } else {
                const Dtype* s = src + (long long)ta * W;
                U = (Mtype(1) - wl) * to_m(s[c0]) + wl * to_m(s[c1]);
              }
              ra = ta;
            }
            if (tb != rb) {
              if (tb == ra) {
                L = U;
              } else {
                const Dtype* s = src + (long long)tb * W;
                L = (Mtype(1) - wl) * to_m(s[c0]) + wl * to_m(s[c1]);
              }
              rb = tb;
            }
            dst[(long long)h * Wo] = from_m((Mtype(1) - hl) * U + hl * L);
          }
        }
      }
    }
  }
}

// Backward, a gather: dx = Ah^T dy Aw per plane, every bottom diff written once (zeros outside the
// window), no atomics, a fixed summation order. Through T = Ah^T dy (Hi x Wo per plane), which never
// leaves shared memory:
//  1. T[a][w] = sum over the top rows h sampling bottom row a of their weight on a times dy[h][w].
//     The top rows with lo(h) = g form group g (rows starts[g] .. starts[g + 1] - 1); group g gives
//     sp(g) = sum wp(h) dy[h][w] to row g and sq(g) = sum wq(h) dy[h][w] to row g + 1, so
//     T[a][w] = sp(a) + sq(a - 1) (sq(-1) = 0; no sq terms when copying).
//  2. dx[a][b] = sum of wp_col(w) T[a][w] over the w with lo(w) = b, plus sum of wq_col(w) T[a][w]
//     over the w with lo(w) = b - 1 (two contiguous ranges of T's row).

// Where T's element i of a stored row lies: one pad slot per 32, so stage-2 threads reading at a
// stride of the zoom hit distinct banks.
#define INTERP_SLOT(i) ((i) + ((i) >> 5))

#define INTERP_ROW_BATCH 8
#define INTERP_COLS 2  // COLS_PER_THREAD in interp.py

// Stage 1 of a tile for INTERP_COLS top columns 32 apart (col points at dy[0][w] of the plane, ncol of
// them valid; Tcol at the first column's slot of the tile's T row 0, `stride` between T rows): the
// top rows of groups g0 .. a1 - 1 stream in batches of INTERP_ROW_BATCH (every column's loads of a
// batch in flight together, whatever the groups' lengths); a row adds to the sums of its group lo(h),
// and a group is closed (T[g] = carry + sp(g) where g >= a0, carry = sq(g)) when the rows move past
// it. Sums in order of h; the row weights serve every column.
__device__ __forceinline__ void interp_tile_columns(const Dtype* col, const int ncol, const int Wo, const int g0,
                                                    const int a0, const int a1, const int copy,
                                                    const int* __restrict__ rpairs, const int* __restrict__ rstarts,
                                                    const Dtype* __restrict__ rwp, const Dtype* __restrict__ rwq,
                                                    Mtype* Tcol, const int stride) {
  Mtype sp[INTERP_COLS], sq[INTERP_COLS], carry[INTERP_COLS];
#pragma unroll
  for (int k = 0; k < INTERP_COLS; ++k) sp[k] = sq[k] = carry[k] = 0;
  int g = g0;
  auto close = [&]() {  // group g is complete
#pragma unroll
    for (int k = 0; k < INTERP_COLS; ++k) {
      if (g >= a0 && k < ncol) Tcol[(g - a0) * stride + INTERP_SLOT(32 * k)] = carry[k] + sp[k];
      carry[k] = sq[k];
      sp[k] = sq[k] = 0;
    }
    ++g;
  };
  const int h1 = rstarts[a1];
  for (int hb = rstarts[g0]; hb < h1; hb += INTERP_ROW_BATCH) {
    Mtype v[INTERP_COLS][INTERP_ROW_BATCH];
#pragma unroll
    for (int j = 0; j < INTERP_ROW_BATCH; ++j) {
#pragma unroll
      for (int k = 0; k < INTERP_COLS; ++k)
        v[k][j] = hb + j < h1 && k < ncol ? to_m(col[(long long)(hb + j) * Wo + 32 * k]) : Mtype(0);
    }
#pragma unroll
    for (int j = 0; j < INTERP_ROW_BATCH; ++j) {
      const int h = hb + j;
      if (h < h1) {
        while (g < rpairs[2 * h]) close();
        const Mtype wp = copy ? Mtype(1) : to_m(rwp[h]), wq = copy ? Mtype(0) : to_m(rwq[h]);
#pragma unroll
        for (int k = 0; k < INTERP_COLS; ++k) {
          sp[k] += wp * v[k][j];
          sq[k] += wq * v[k][j];
        }
      }
    }
  }
  while (g < a1) close();
}

// Stage 2 for bottom column bc of the window (0 <= bc < Wi): its part from the top columns
// [c_lo, c_hi), whose T values Trow holds (T[a][w] at INTERP_SLOT(w - c_lo)).
__device__ __forceinline__ Mtype interp_col_sum(const Mtype* Trow, const int c_lo, const int c_hi, const int bc,
                                                const int copy, const int* __restrict__ cstarts,
                                                const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq) {
  const int w0 = cstarts[bc], w1 = cstarts[bc + 1];
  if (copy) return (w0 >= c_lo && w0 < c_hi) ? Trow[INTERP_SLOT(w0 - c_lo)] : Mtype(0);
  Mtype sp = 0, sq = 0;
  for (int w = max(w0, c_lo); w < min(w1, c_hi); ++w) sp += to_m(cwp[w]) * Trow[INTERP_SLOT(w - c_lo)];
  if (bc > 0) {
    for (int w = max(cstarts[bc - 1], c_lo); w < min(w0, c_hi); ++w) sq += to_m(cwq[w]) * Trow[INTERP_SLOT(w - c_lo)];
  }
  return sp + sq;
}

// Each thread's part of a stage lies inside FOR_THREAD, stages are separated by __syncthreads(), so
// a host build can run a block's threads one after another.
#ifndef FOR_THREAD
#define FOR_THREAD(tid) for (int tid = threadIdx.x, thread_once_ = 1; thread_once_; thread_once_ = 0)
#endif
#ifndef INTERP_SHARED
#define INTERP_SHARED(name) extern __shared__ Mtype name[]
#endif

// One block per tile (grid-stride over tiles): plane p, bottom rows a0 .. a1 - 1 (a band of `rows`)
// and bottom columns b0 .. b1 - 1 (`bcols`). The tile needs T's rows a0 .. a1 - 1 at the top columns
// [w_lo, w_hi) sampling its columns (and the column left of b0: its wq terms), built in shared memory
// (`rows` x INTERP_SLOT(cw - 1) + 1 elements), then summed:
//  1. a thread per INTERP_COLS top columns (32 apart: a warp takes 32 * INTERP_COLS consecutive ones,
//     each load coalesced) sums groups g0 .. a1 - 1 (g0 = a0 - 1 when not copying: its sq terms
//     land in row a0) with interp_tile_columns; only a band's first group is read twice (also by
//     the band above, at about the same time).
//  2. a thread per bottom element of the tile (the first and last bands and column tiles also own
//     the cropped border, written 0).
// Column ranges wider than cw (extreme zooms) are taken in chunks of cw, stage 2 adding each chunk's
// part to dx (a thread owns the same elements in every chunk).
__global__ void interp_backward(const int planes, const int H, const int W, const int off, const int Hi, const int Wi,
                                const int Ho, const int Wo, const int copy, const int rows, const int bcols,
                                const int cw, const int* __restrict__ rpairs, const int* __restrict__ rstarts,
                                const Dtype* __restrict__ rwp, const Dtype* __restrict__ rwq,
                                const int* __restrict__ cstarts, const Dtype* __restrict__ cwp,
                                const Dtype* __restrict__ cwq, const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  INTERP_SHARED(T);
  const int stride = INTERP_SLOT(cw - 1) + 1;
  const int bands = (Hi + rows - 1) / rows, ctiles = (Wi + bcols - 1) / bcols;
  const long long tiles = (long long)planes * bands * ctiles;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int j = (int)(t % ctiles), k = (int)(t / ctiles % bands);
    const long long p = t / ((long long)ctiles * bands);
    const int a0 = k * rows, a1 = min(a0 + rows, Hi), b0 = j * bcols, b1 = min(b0 + bcols, Wi);
    const int g0 = (a0 > 0 && !copy) ? a0 - 1 : a0;
    const int w_lo = cstarts[(b0 > 0 && !copy) ? b0 - 1 : b0], w_hi = cstarts[b1];
    const int r0 = k == 0 ? 0 : off + a0, r1 = k == bands - 1 ? H : off + a1;
    const int c0 = j == 0 ? 0 : off + b0, c1 = j == ctiles - 1 ? W : off + b1;
    const int chunks = max(1, (w_hi - w_lo + cw - 1) / cw);
    for (int ch = 0; ch < chunks; ++ch) {
      const int c_lo = w_lo + ch * cw, c_hi = min(c_lo + cw, w_hi);
      const int slots = (c_hi - c_lo + 32 * INTERP_COLS - 1) / (32 * INTERP_COLS) * 32;
      FOR_THREAD(tid) {
        for (int i = tid; i < slots; i += blockDim.x) {
          const int w = c_lo + (i >> 5) * (32 * INTERP_COLS) + (i & 31);  // the first of its columns
          const int ncol = min(INTERP_COLS, (c_hi - w + 31) >> 5);
          if (ncol <= 0) continue;
          interp_tile_columns(dy + p * Ho * Wo + w, ncol, Wo, g0, a0, a1, copy, rpairs, rstarts, rwp, rwq,
                              T + INTERP_SLOT(w - c_lo), stride);
        }
      }
      __syncthreads();
      FOR_THREAD(tid) {
        for (int e = tid; e < (r1 - r0) * (c1 - c0); e += blockDim.x) {
          const int r = r0 + e / (c1 - c0), c = c0 + e % (c1 - c0);
          const int a = r - off, bc = c - off;
          Dtype* out = dx + (p * H + r) * W + c;
          if (a >= 0 && a < Hi && bc >= 0 && bc < Wi) {
            const Mtype s = interp_col_sum(T + (a - a0) * stride, c_lo, c_hi, bc, copy, cstarts, cwp, cwq);
            *out = from_m(ch ? to_m(*out) + s : s);
          } else if (ch == 0) {
            *out = 0;
          }
        }
      }
      __syncthreads();  // T is rewritten for the next chunk or tile
    }
  }
}
