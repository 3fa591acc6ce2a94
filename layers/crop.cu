// Crop: table = [top shape (naxes) | bottom strides (naxes) | offsets (naxes)].
// For top element i the bottom element is sum_k (coord_k(i) + offset_k) * bottom_stride_k.
// forward != 0: top[i] = bottom[b(i)]; else bottom[b(i)] = top[i] (backward scatter).

__global__ void crop_copy(const int n, const int naxes, const int* table, const int forward,
                          Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    int rest = i;
    int b = 0;
    for (int k = naxes - 1; k >= 0; --k) {
      const int size = table[k];
      const int coord = rest % size;
      rest /= size;
      b += (coord + table[2 * naxes + k]) * table[naxes + k];
    }
    if (forward) {
      top[i] = bottom[b];
    } else {
      bottom[b] = top[i];
    }
  }
}
