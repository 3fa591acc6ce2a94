// The forward epilogue of the convolution engines (included by their .cu files). `epilogue` bit 0
// (CONV_EPI_BIAS) adds bias[m]; bit 1 (CONV_EPI_RELU) then applies ReLU with negative_slope 0
// exactly as ReLULayer computes it (v > 0 ? v : v * 0), for the fused Convolution -> ReLU chains.
#ifndef CONV_EPILOGUE_CUH
#define CONV_EPILOGUE_CUH

#define CONV_EPI_BIAS 1
#define CONV_EPI_RELU 2

__device__ __forceinline__ Dtype conv_epilogue(Dtype v, const Dtype* bias, const int m, const int epilogue) {
  if (epilogue & CONV_EPI_BIAS) v += bias[m];
  if ((epilogue & CONV_EPI_RELU) && !(v > 0)) v *= Dtype(0);
  return v;
}

#endif  // CONV_EPILOGUE_CUH
