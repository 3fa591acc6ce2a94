// Permute (SSD fork): table = [top shape (naxes) | bottom stride of the axis each top axis reads (naxes)].
// Top element i at coordinates c_k reads bottom element sum_k c_k * table[naxes + k].
// forward != 0: top[i] = bottom[b(i)]; else bottom[b(i)] = top[i] (a bijection: no accumulation).

__global__ void permute_copy(const int n, const int naxes, const int* table, const int forward,
                             Dtype* bottom, Dtype* top) {
  CUDA_KERNEL_LOOP(i, n) {
    int rest = i;
    int b = 0;
    for (int k = naxes - 1; k >= 0; --k) {
      const int size = table[k];
      b += (rest % size) * table[naxes + k];
      rest /= size;
    }
    if (forward) {
      top[i] = bottom[b];
    } else {
      bottom[b] = top[i];
    }
  }
}
