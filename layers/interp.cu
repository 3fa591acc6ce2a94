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
// Work is split into warp tasks with each lane's part inside FOR_LANE, so that a host build can
// run the 32 lanes of a phase one after another (tests/layers/test_interp_kernels_on_host.py).

#ifndef FOR_LANE
#define FOR_LANE(lane) for (int lane = threadIdx.x & 31, lane_once_ = 1; lane_once_; lane_once_ = 0)
#endif
#ifndef INTERP_SHARED
#define INTERP_SHARED(name) extern __shared__ Dtype name[]
#endif

#define INTERP_ROWS_PER_TASK 16  // forward: rows of one column per lane and task
#define INTERP_BWD_COLS 4        // backward: columns per lane and pass of a bottom row's first phase

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
// window), no atomics. Task = (plane, bottom row a), one warp:
//  1. T[w] = sum over the top rows h sampling row a of their weight on a times dy[h][w] (lanes over
//     w, coalesced; the rows are those with lo(h) = a (weight wp) and lo(h) = a - 1 (weight wq),
//     two contiguous ranges); P[w] = wp_col(w) T[w] and Q[w] = wq_col(w) T[w] go to shared memory.
//  2. dx[a][b] = sum of P over the w with lo(w) = b plus sum of Q over the w with lo(w) = b - 1
//     (lanes over b, two contiguous ranges of shared memory, unweighted).
// Shared memory per warp: P and Q of padded length pad_len >= Wo + Wo / 32 (index w + w / 32:
// lanes reading at a stride of 8 hit distinct banks). copy: Hi == Ho and Wi == Wo (no wq terms).
__global__ void interp_backward(const int planes, const int H, const int W, const int off, const int Hi,
                                const int Wi, const int Ho, const int Wo, const int copy, const int pad_len,
                                const int* __restrict__ rstarts, const Dtype* __restrict__ rwp,
                                const Dtype* __restrict__ rwq, const int* __restrict__ cstarts,
                                const Dtype* __restrict__ cwp, const Dtype* __restrict__ cwq,
                                const Dtype* __restrict__ dy, Dtype* __restrict__ dx) {
  INTERP_SHARED(interp_smem);
  Dtype* P = interp_smem + (threadIdx.x >> 5) * 2 * pad_len;
  Dtype* Q = P + pad_len;
  const long long tasks = (long long)planes * H;
  const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < tasks; t += nwarps) {
    const int p = (int)(t / H);
    const int a = (int)(t % H);
    Dtype* dxrow = dx + t * W;
    const int ac = a - off;
    if (ac < 0 || ac >= Hi) {
      FOR_LANE(lane) {
        for (int b = lane; b < W; b += 32) dxrow[b] = 0;
      }
      continue;
    }
    const Dtype* dyp = dy + (long long)p * Ho * Wo;
    const int hp0 = rstarts[ac], hp1 = rstarts[ac + 1];
    const int hq0 = (ac > 0 && !copy) ? rstarts[ac - 1] : hp0;
    FOR_LANE(lane) {
      for (int wb = 0; wb < Wo; wb += 32 * INTERP_BWD_COLS) {
        Dtype acc[INTERP_BWD_COLS];
#pragma unroll
        for (int k = 0; k < INTERP_BWD_COLS; ++k) acc[k] = 0;
#pragma unroll 4
        for (int h = hq0; h < hp1; ++h) {
          const Dtype g = h < hp0 ? rwq[h] : rwp[h];
          const Dtype* r = dyp + (long long)h * Wo;
#pragma unroll
          for (int k = 0; k < INTERP_BWD_COLS; ++k) {
            const int w = wb + 32 * k + lane;
            if (w < Wo) acc[k] += g * r[w];
          }
        }
#pragma unroll
        for (int k = 0; k < INTERP_BWD_COLS; ++k) {
          const int w = wb + 32 * k + lane;
          if (w < Wo) {
            P[w + (w >> 5)] = cwp[w] * acc[k];
            Q[w + (w >> 5)] = cwq[w] * acc[k];
          }
        }
      }
    }
    __syncwarp();
    FOR_LANE(lane) {
      for (int b = lane; b < W; b += 32) {
        const int bc = b - off;
        Dtype sp = 0, sq = 0;  // two chains of additions
        if (bc >= 0 && bc < Wi) {
          const int w0 = cstarts[bc], w1 = cstarts[bc + 1];
          for (int w = w0; w < w1; ++w) sp += P[w + (w >> 5)];
          if (bc > 0 && !copy) {
            for (int w = cstarts[bc - 1]; w < w0; ++w) sq += Q[w + (w >> 5)];
          }
        }
        dxrow[b] = sp + sq;
      }
    }
    __syncwarp();  // phase 2 reads before the next task's phase 1 writes
  }
}

// Backward for widths whose P and Q rows do not fit in shared memory: one thread per bottom element,
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
