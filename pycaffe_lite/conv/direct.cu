// Direct convolution forward for small batches (group 1, square KxK kernel, stride S, no dilation):
// one launch, no column buffer, bias in the epilogue. Layouts: x (num, C, H, W), w (M, C, K, K),
// y (num, M, Ho, Wo). Block (16, 8) threads computes a 16x16 output tile of DC_TM output channels of
// one image: thread (tx, ty) the outputs (oh0 + ty + 8r, ow0 + tx), r = 0, 1, for the DC_TM channels
// (2 * DC_TM accumulators). Input channels are walked CK at a time: their input patch
// ((16-1)*S + K)^2 (zero outside the image) and the DC_TM x CK x K x K filter taps go to shared memory.
// Grid: (tiles along W * tiles along H, ceil(M / DC_TM), num). Dtype, Mtype, to_m come from the backend
// prelude; the tiles hold Dtype, the accumulators are Mtype.
#include "epilogue.cuh"

#define DC_TILE 16
#define DC_TM 8

extern "C++" {

template <int K, int S>
__device__ __forceinline__ void dc_forward_body(const Dtype* __restrict__ x, const Dtype* __restrict__ w,
                                                const Dtype* __restrict__ bias, const int epilogue,
                                                Dtype* __restrict__ y, const int channels, const int height,
                                                const int width, const int num_output, const int pad_h,
                                                const int pad_w, const int height_out, const int width_out) {
  constexpr int CK = K <= 3 ? 4 : 1;  // input channels per shared-memory stage
  constexpr int P = (DC_TILE - 1) * S + K;  // patch rows and columns
  constexpr int KK = K * K;
  __shared__ Dtype xs[CK][P][P];
  __shared__ Dtype ws[DC_TM][CK][KK];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * DC_TILE + tx;
  const int tiles_w = (width_out + DC_TILE - 1) / DC_TILE;
  const int oh0 = (blockIdx.x / tiles_w) * DC_TILE, ow0 = (blockIdx.x % tiles_w) * DC_TILE;
  const int m0 = blockIdx.y * DC_TM, n = blockIdx.z;
  const int h0 = oh0 * S - pad_h, w0 = ow0 * S - pad_w;  // image position of patch (0, 0)
  const Dtype* xn = x + n * channels * height * width;
  Mtype acc[2][DC_TM];
#pragma unroll
  for (int t = 0; t < DC_TM; ++t) acc[0][t] = acc[1][t] = 0;
  for (int c0 = 0; c0 < channels; c0 += CK) {
    for (int e = tid; e < CK * P * P; e += DC_TILE * 8) {
      const int cl = e / (P * P), r = e % (P * P), pr = r / P, pc = r % P;
      const int c = c0 + cl, ih = h0 + pr, iw = w0 + pc;
      xs[cl][pr][pc] = (c < channels && ih >= 0 && ih < height && iw >= 0 && iw < width)
                           ? xn[(c * height + ih) * width + iw] : Dtype(0);
    }
    for (int e = tid; e < DC_TM * CK * KK; e += DC_TILE * 8) {
      const int t = e / (CK * KK), r = e % (CK * KK), cl = r / KK, tap = r % KK;
      const int m = m0 + t, c = c0 + cl;
      ws[t][cl][tap] = (m < num_output && c < channels) ? w[(m * channels + c) * KK + tap] : Dtype(0);
    }
    __syncthreads();
#pragma unroll
    for (int cl = 0; cl < CK; ++cl) {
#pragma unroll
      for (int i = 0; i < K; ++i) {
#pragma unroll
        for (int j = 0; j < K; ++j) {
          const Mtype x0 = to_m(xs[cl][ty * S + i][tx * S + j]), x1 = to_m(xs[cl][(ty + 8) * S + i][tx * S + j]);
#pragma unroll
          for (int t = 0; t < DC_TM; ++t) {
            const Mtype wv = to_m(ws[t][cl][i * K + j]);
            acc[0][t] += wv * x0;
            acc[1][t] += wv * x1;
          }
        }
      }
    }
    __syncthreads();
  }
  const int ow = ow0 + tx;
#pragma unroll
  for (int t = 0; t < DC_TM; ++t) {
    const int m = m0 + t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int oh = oh0 + ty + 8 * r;
      if (m < num_output && oh < height_out && ow < width_out)
        y[((n * num_output + m) * height_out + oh) * width_out + ow] = conv_epilogue(acc[r][t], bias, m, epilogue);
    }
  }
}

}  // extern "C++"

#define DC_FORWARD(K, S)                                                                              \
  __global__ void __launch_bounds__(DC_TILE * 8) dc_forward_k##K##s##S(                              \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, Dtype* y, const int channels, \
      const int height, const int width, const int num_output, const int pad_h, const int pad_w,     \
      const int height_out, const int width_out) {                                                    \
    dc_forward_body<K, S>(x, w, bias, epilogue, y, channels, height, width, num_output, pad_h, pad_w, \
                          height_out, width_out);                                                     \
  }

DC_FORWARD(1, 1)
DC_FORWARD(1, 2)
DC_FORWARD(3, 1)
DC_FORWARD(3, 2)
DC_FORWARD(5, 1)
DC_FORWARD(5, 2)
DC_FORWARD(7, 1)
DC_FORWARD(7, 2)
