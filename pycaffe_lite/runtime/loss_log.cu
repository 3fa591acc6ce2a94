// The executor's device-side loss log: each replayed training iteration adds its weighted loss
// (sum over the loss tops of data . loss weight) into log[counter % capacity], then advances the
// counter, so losses are read back in batches instead of one host sync per iteration. The sums are
// in Mtype (to_m / from_m from the backend prelude).

#define LOSS_LOG_THREADS 256

// One block: log[slot] (= 0 first) += sum_j data[j] * weight[j], slot = counter[0] % capacity.
__global__ void loss_log_add(const int n, const Dtype* data, const Dtype* weight, Dtype* log,
                             const int* counter, const int capacity, const int first) {
  __shared__ Mtype partial[LOSS_LOG_THREADS];
  Mtype sum = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += to_m(data[j]) * to_m(weight[j]);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int slot = counter[0] % capacity;
    log[slot] = from_m((first ? Mtype(0) : to_m(log[slot])) + partial[0]);
  }
}

__global__ void loss_log_advance(int* counter) { counter[0] += 1; }
