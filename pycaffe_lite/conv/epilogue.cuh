// The forward epilogue of the convolution engines (included by their .cu files). `epilogue` bit 0
// (CONV_EPI_BIAS) adds bias[m]; bit 1 (CONV_EPI_RELU) then applies ReLU with negative_slope 0
// exactly as ReLULayer computes it (v > 0 ? v : v * 0), for the fused Convolution -> ReLU chains.
#ifndef CONV_EPILOGUE_CUH
#define CONV_EPILOGUE_CUH

#define CONV_EPI_BIAS 1
#define CONV_EPI_RELU 2

// v is the engine's accumulator (Mtype: float for the half types); the result is stored as Dtype.
__device__ __forceinline__ Dtype conv_epilogue(Mtype v, const Dtype* bias, const int m, const int epilogue) {
  if (epilogue & CONV_EPI_BIAS) v += to_m(bias[m]);
  if ((epilogue & CONV_EPI_RELU) && !(v > 0)) v *= Mtype(0);
  return from_m(v);
}

#endif  // CONV_EPILOGUE_CUH
