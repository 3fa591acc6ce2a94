// Eltwise MAX. The mask holds, per element, the index of the winning bottom (as a Dtype).

// Folds bottom b (index idx + 1) into the running max a. With idx == 0, a is bottom 0 and the
// mask starts here; afterwards a is the top itself (a == top is allowed: each thread reads its
// element before writing it).
__global__ void eltwise_max_forward(const int n, const Dtype* a, const Dtype* b, const int idx,
                                    Dtype* top, Dtype* mask) {
  CUDA_KERNEL_LOOP(i, n) {
    const Dtype va = a[i];
    const Dtype vb = b[i];
    if (idx == 0) {
      if (va > vb) {
        top[i] = va;
        mask[i] = 0;
      } else {
        top[i] = vb;
        mask[i] = 1;
      }
    } else if (vb > va) {
      top[i] = vb;
      mask[i] = (Dtype)(idx + 1);
    }
  }
}

__global__ void eltwise_max_backward(const int n, const Dtype* top_diff, const Dtype* mask,
                                     const int idx, Dtype* bottom_diff) {
  CUDA_KERNEL_LOOP(i, n) {
    bottom_diff[i] = ((int)mask[i] == idx) ? top_diff[i] : (Dtype)0;
  }
}
