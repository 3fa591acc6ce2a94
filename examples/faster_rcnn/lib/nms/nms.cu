// Pairwise suppression mask for NMS. boxes: (n, 4) x1 y1 x2 y2 sorted by descending score.
// mask[i * words + w] bit b is set when box j = w * 32 + b comes after i and IoU(i, j) > thresh
// (areas in the +1 pixel convention). One thread per (i, w) word; reads of box i are broadcast.
__global__ void nms_mask(const int items, const int n, const int words, const Dtype thresh,
                         const Dtype* boxes, unsigned int* mask) {
  CUDA_KERNEL_LOOP(t, items) {
    const int i = t / words;
    const int w = t % words;
    const Dtype* a = boxes + i * 4;
    const Dtype area_a = (a[2] - a[0] + 1) * (a[3] - a[1] + 1);
    unsigned int bits = 0;
    for (int b = 0; b < 32; ++b) {
      const int j = w * 32 + b;
      if (j >= n) break;
      if (j <= i) continue;
      const Dtype* c = boxes + j * 4;
      const Dtype iw = max(Dtype(0), min(a[2], c[2]) - max(a[0], c[0]) + 1);
      const Dtype ih = max(Dtype(0), min(a[3], c[3]) - max(a[1], c[1]) + 1);
      const Dtype inter = iw * ih;
      const Dtype area_c = (c[2] - c[0] + 1) * (c[3] - c[1] + 1);
      if (inter / (area_a + area_c - inter) > thresh) bits |= 1u << b;
    }
    mask[t] = bits;
  }
}
