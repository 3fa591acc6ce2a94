// Accuracy on (outer, channels, inner) scores and (outer, inner) labels. Dtype, Mtype, to_m, from_m
// and CUDA_KERNEL_LOOP come from the backend prelude; comparisons and sums are in Mtype.

// Per position p = (o, s): valid[p] = 0 for ignored labels, else 1; correct[p] = 1 when fewer than
// top_k other classes score >= the true class, NaN for a label outside [0, channels) or not a
// number, and for a position with a NaN or infinite score (so the accuracy is NaN: no host read
// during forward).
__global__ void accuracy_forward(const int n, const Dtype* scores, const Dtype* label,
                                 const int channels, const int inner, const int has_ignore,
                                 const int ignore_label, const int top_k, Dtype* correct,
                                 Dtype* valid) {
  CUDA_KERNEL_LOOP(p, n) {
    const int o = p / inner, s = p - o * inner;
    const Mtype lf = to_m(label[p]);
    const bool label_ok = isfinite(lf) && lf > Mtype(-2147483648.0) && lf < Mtype(2147483647.0);
    const int l = label_ok ? static_cast<int>(lf) : -1;
    if (label_ok && has_ignore && l == ignore_label) {
      correct[p] = 0;
      valid[p] = 0;
    } else if (l < 0 || l >= channels) {
      correct[p] = Dtype(__int_as_float(0x7fffffff));
      valid[p] = 1;
    } else {
      const Dtype* row = scores + o * channels * inner + s;
      const Mtype t = to_m(row[l * inner]);
      int better = -1;  // the true class counts itself
      bool finite = true;
      for (int c = 0; c < channels; ++c) {
        const Mtype v = to_m(row[c * inner]);
        better += (v >= t);
        finite = finite && isfinite(v);
      }
      correct[p] = !finite ? Dtype(__int_as_float(0x7fffffff)) : better < top_k ? Dtype(1) : Dtype(0);
      valid[p] = 1;
    }
  }
}

// One block per output: out[blockIdx.x] = Σ correct / Σ valid over the positions whose label is
// blockIdx.x (when per_class >= 0) or over all positions (per_class < 0); 0 when nothing counts.
// Launch with ACCURACY_THREADS threads per block.
#define ACCURACY_THREADS 256
__global__ void accuracy_reduce(const int n, const Dtype* correct, const Dtype* valid,
                                const int per_class, const Dtype* label, Dtype* out) {
  __shared__ Mtype sa[ACCURACY_THREADS];
  __shared__ Mtype sn[ACCURACY_THREADS];
  const int cls = blockIdx.x;
  Mtype a = 0, m = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const Mtype lf = to_m(label[i]);  // (a NaN or huge label belongs to no class; its position counts in the total)
    const bool in_range = isfinite(lf) && lf > Mtype(-2147483648.0) && lf < Mtype(2147483647.0);
    if (per_class < 0 || (in_range && static_cast<int>(lf) == cls)) {
      a += to_m(correct[i]);
      m += to_m(valid[i]);
    }
  }
  sa[threadIdx.x] = a;
  sn[threadIdx.x] = m;
  __syncthreads();
  for (int step = ACCURACY_THREADS / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) {
      sa[threadIdx.x] += sa[threadIdx.x + step];
      sn[threadIdx.x] += sn[threadIdx.x + step];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[cls] = from_m(sn[0] > 0 ? sa[0] / sn[0] : Mtype(0));
}
