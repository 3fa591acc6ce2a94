// Device helpers shared by the loss kernels (included by loss_layer.cu and the losses' .cu files):
// the block reduction of the losses that fuse their per-item math with the first reduction stage,
// and the class-label check. Blocks are LOSS_REDUCE_THREADS wide
// (loss_layer.py: REDUCE_THREADS). Dtype, Mtype and to_m come from the backend prelude.
#ifndef LOSS_LAYER_CUH
#define LOSS_LAYER_CUH

#define LOSS_REDUCE_THREADS 256

// Sum of v over the block, valid in thread 0; every thread of the block must call it. The sum is
// in Mtype (float for the half types), so is the shared memory smem.
__device__ Mtype loss_block_sum(Mtype v, Mtype* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int step = LOSS_REDUCE_THREADS / 2; step > 0; step >>= 1) {
    if (threadIdx.x < step) smem[threadIdx.x] += smem[threadIdx.x + step];
    __syncthreads();
  }
  const Mtype sum = smem[0];
  __syncthreads();  // smem may be reused by the caller's next reduction
  return sum;
}

// A label value as an int in *l when it is a finite number within int range (returns true); else
// *l = -1 and false (a NaN or infinite label: never a class, never the ignore label).
__device__ bool loss_label_int(const Dtype label, int* l) {
  const Mtype v = to_m(label);
  const bool ok = isfinite(v) && v > Mtype(-2147483648.0) && v < Mtype(2147483647.0);
  *l = ok ? static_cast<int>(v) : -1;
  return ok;
}

// Caffe's label check at position p of a class-label loss: the label truncated to int when it
// counts and lies in [0, channels), with valid[p] = 1 (the caller writes loss[p]); otherwise -1,
// with loss[p] = valid[p] = 0 for an ignored label, or a NaN loss[p], valid[p] = 1 and the bad-label
// flag status[1] = 1, status[2] = label (LossLayer.gpu_status) for one outside [0, channels) or not
// a number.
__device__ int loss_class_label(const int p, const Dtype* label, const int channels, const int has_ignore,
                                const int ignore_label, Dtype* loss, Dtype* valid, Dtype* status) {
  int l;
  const bool ok = loss_label_int(label[p], &l);
  if (ok && has_ignore && l == ignore_label) {
    loss[p] = 0;
    valid[p] = 0;
    return -1;
  }
  valid[p] = 1;
  if (!ok || l < 0 || l >= channels) {
    loss[p] = Dtype(__int_as_float(0x7fffffff));
    status[1] = 1;
    status[2] = label[p];
    return -1;
  }
  return l;
}

// Element i = (o, c, s) of the (outer, channels, inner) gradient of a class-label loss: its channel
// c, the label l at position (o, s) truncated to int (not range-checked) and whether it is ignored.
struct LossGradItem {
  int c, l;
  bool ignored;
};

__device__ LossGradItem loss_grad_item(const int i, const Dtype* label, const int channels, const int inner,
                                       const int has_ignore, const int ignore_label) {
  const int s = i % inner;
  const int o = i / (inner * channels);
  LossGradItem item;
  item.c = (i / inner) % channels;
  const bool ok = loss_label_int(label[o * inner + s], &item.l);
  item.ignored = ok && has_ignore && item.l == ignore_label;
  return item;
}

#endif  // LOSS_LAYER_CUH
