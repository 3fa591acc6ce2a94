// Implicit-GEMM 2-D convolution on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a; the
// tensorcore16-wgmma-* engines, wgmma.py). The contract of t16n_conv (tensorcore16_nhwc.cu): x NHWC
// (staged by the host), w (M, kh, kw, C), out NCHW at the out_* rows and columns, the bias + ReLU
// epilogue; the forward pass and the data gradient's stride phases run it, as they run t16n_conv.
// Compiled for sm_90a only (wgmma.py asks the backend for that architecture); elsewhere, and for
// float and double, the kernels trap and are never launched.
//
//   out[n][m][out_y0 + out_sy*oy][out_x0 + out_sx*ox] = epilogue(sum over (r, s, c) of
//     w[m][r][s][c] * x[n][oy*sh - ph + r][ox*sw - pw + s][c])
// The GEMM (M x N*Ho*Wo) = A (M x K) . B (K x N*Ho*Wo), K = (tap, c) tap-major.
//
// Block: 256 threads, two warpgroups, a BM x BN tile of out. BM 128: warpgroup g owns rows
// 64g..64g+63 and all BN columns (one m64nBNk16 wgmma per 16 channels); BM 64: all 64 rows and
// columns g*BN/2.. (m64n(BN/2)k16). The contraction runs in slices of T16W_BK (64) channels at one
// tap (a tap's last slice zero-filled past C). A stage holds A (BM rows) and B (BN columns), 64
// halves (128 bytes) a row, 16-byte chunk q of row r at chunk q ^ (r & 7): wgmma's 128-byte-swizzled
// K-major layout (8-row atoms of 1024 bytes; the stage ring starts 1024-aligned), read by the tensor
// cores through shared-memory descriptors (t16w_desc). Every chunk is one cp.async.cg (src-size 0
// outside the matrix). Of the STAGES stages, STAGES - 2 slices are loaded ahead while the tensor
// cores run; wgmma.wait_group 1 keeps one slice's products in flight, so the stage a load refills
// (slice s - 2's) is free after the block's barrier. fp32 accumulators; the epilogue rounds once,
// stages the tile in shared memory and writes NCHW rows (8 columns a store when vec_out).
//
// Accumulators of m64nNk16 (PTX ISA, "wgmma register fragments"): warp w of the warpgroup, lane
// 4g + t, holds d[4j + 2h + e] = D[16w + g + 8h][8j + 2t + e] for j < N/8 (m16n8's C layout per 8
// columns).
#include "mma16.cuh"  // T16Kind, t16_copy16, t16_commit, t16_wait
#include "epilogue.cuh"
#include "vec.cuh"
#include "t16_nhwc_tile.cuh"  // T16NhwcSlices, t16_store_nchw

#define T16W_THREADS 256
#define T16W_BK 64

extern "C++" {
// T16wMma<N, KIND, TR>::run(d, a, b): d (64 x N fp32, this thread's N/2) += A (64 x 16) . B (16 x N), both
// in shared memory behind the descriptors a and b, K-major (TR 0) or MN-major (TR 1); KIND 1 fp16, 2 bf16
// (T16Kind).
// The accumulator operands of m64nNk16 (N/2 registers): T16W_D<N> the constraints, T16W_O<N> the
// operand list of the instruction text.
#define T16W_D32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define T16W_D64 T16W_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
  "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
  "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
  "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
  "+f"(d[62]), "+f"(d[63])
#define T16W_D128 T16W_D64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
  "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
  "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), \
  "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), \
  "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
  "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
  "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
  "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), \
  "+f"(d[126]), "+f"(d[127])
#define T16W_O32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define T16W_O64 T16W_O32 ", "                                                                          \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
  "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define T16W_O128 T16W_O64 ", "                                                                         \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, " \
  "%83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
  "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
  "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// d (64 x N fp32) += A . B through the descriptors a and b; TY "f16" or "bf16"; R = N/2 registers; the
// operands MN-major (transposed) when TR is 1, K-major when 0
#define T16W_WGMMA(N, TY, R)                                                                         \
  asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" T16W_O##R "}, %" #R   \
               ", %" T16W_NEXT_##R ", 1, 1, 1, %" T16W_TR_##R ", %" T16W_TR_##R ";\n"                    \
               : T16W_D##R                                                                              \
               : "l"(a), "l"(b), "n"(TR))
#define T16W_NEXT_32 "33"
#define T16W_NEXT_64 "65"
#define T16W_NEXT_128 "129"
#define T16W_TR_32 "34"
#define T16W_TR_64 "66"
#define T16W_TR_128 "130"

template <int N, int KIND, int TR = 0> struct T16wMma {  // KIND 0 (float, double): never launched (traps)
  static __device__ __forceinline__ void run(float (&d)[N / 2], const unsigned long long a, const unsigned long long b) {
    if constexpr (KIND == 1 && N == 64) T16W_WGMMA(64, "f16", 32);
    if constexpr (KIND == 1 && N == 128) T16W_WGMMA(128, "f16", 64);
    if constexpr (KIND == 1 && N == 256) T16W_WGMMA(256, "f16", 128);
    if constexpr (KIND == 2 && N == 64) T16W_WGMMA(64, "bf16", 32);
    if constexpr (KIND == 2 && N == 128) T16W_WGMMA(128, "bf16", 64);
    if constexpr (KIND == 2 && N == 256) T16W_WGMMA(256, "bf16", 128);
  }
};

}  // extern "C++"

extern "C++" {
// The shared-memory matrix descriptor of a K-major tile at p (1024-aligned 8-row groups): start
// address >> 4 (bits 0-13), leading-dimension offset 1 (unused by swizzled K-major layouts, bits
// 16-29), stride between 8-row groups 1024 bytes >> 4 (bits 32-45), 128-byte swizzle (bits 62-63 = 1).
// The k16 steps within a 128-byte row add 32 bytes (2) to the start address.
__device__ __forceinline__ unsigned long long t16w_desc(const unsigned short* p) {
  const unsigned long long addr = (unsigned long long)__cvta_generic_to_shared(p);
  return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
// Offset (16-bit elements) of 16-byte chunk q (0..7) of row r in a stage tile of 128-byte rows.
__device__ __forceinline__ int t16w_at(const int r, const int q) { return r * T16W_BK + ((q ^ (r & 7)) << 3); }
struct T16wSwizzle {
  static __device__ __forceinline__ int at(const int r, const int q) { return t16w_at(r, q); }
};

// Keeps the compiler from moving accumulator reads or writes across a wgmma's issue and wait.
template <int R> __device__ __forceinline__ void t16w_fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int BM, int BN, int STAGES>
__device__ __forceinline__ void t16w_conv(const Dtype* __restrict__ x, const Dtype* __restrict__ w,
                                          const Dtype* __restrict__ bias, const int epilogue, Dtype* __restrict__ y,
                                          const int num, const int channels, const int height, const int width,
                                          const int num_output, const int kernel_h, const int kernel_w, const int pad_h,
                                          const int pad_w, const int stride_h, const int stride_w, const int height_out,
                                          const int width_out, const int out_h, const int out_w, const int out_sy,
                                          const int out_sx, const int out_y0, const int out_x0, const int vec_out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int KIND = T16Kind<Dtype>::value;
  static_assert(BM == 128 || BM == 64, "two warpgroups: 128 rows, or 64 rows and half the columns each");
  const int WGN = BM == 128 ? BN : BN / 2;  // columns of a warpgroup's wgmma
  const int REGS = WGN / 2;
  if (KIND == 0) __trap();
  const int CPR = T16W_BK / 8, RPP = T16W_THREADS / CPR;  // chunks a row; rows a pass of the block
  const int A_CH = BM / RPP, B_CH = BN / RPP;
  const int STAGE = (BM + BN) * T16W_BK;
  extern __shared__ __align__(1024) unsigned short t16w_raw[];
  unsigned short* smem = t16w_raw + ((1024 - ((unsigned)__cvta_generic_to_shared(t16w_raw) & 1023)) & 1023) / 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
  const int mtiles = (num_output + BM - 1) / BM;
  const int m0 = (blockIdx.x % mtiles) * BM, n0 = (blockIdx.x / mtiles) * BN;
  const int HW = height * width, P = height_out * width_out, ncols = num * P;
  const int K = kernel_h * kernel_w * channels;
  const int slices = (K + T16W_BK - 1) / T16W_BK;  // dense: a slice may span taps
  const int q = tid % CPR, rt = tid / CPR;

  T16NhwcSlices<T16W_BK, RPP, A_CH, B_CH, T16wSwizzle> slices_of(w, m0, n0, rt, q, num_output, K, ncols, P, HW,
                                                               channels, width_out, kernel_w, stride_h, stride_w, pad_h, pad_w);
  auto load = [&](const int stage) {
    unsigned short* As = smem + stage * STAGE;
    slices_of.load(As, As + BM * T16W_BK, x, w, rt, q, K, channels, height, width, kernel_w);
  };

  float acc[REGS];
#pragma unroll
  for (int i = 0; i < REGS; ++i) acc[i] = 0.f;
  const int a_row0 = BM == 128 ? 64 * wg : 0, b_row0 = BM == 128 ? 0 : WGN * wg;

#pragma unroll
  for (int st = 0; st < STAGES - 2; ++st) {
    if (st < slices) load(st);
    t16_commit();
  }
  for (int s = 0; s < slices; ++s) {
    t16_wait<STAGES - 3>();  // slice s has landed (this thread's copies) ...
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... visible to the tensor cores
    __syncthreads();  // everyone's; and every warpgroup's products of slice s - 2 are done
    if (s + STAGES - 2 < slices) load((s + STAGES - 2) % STAGES);
    t16_commit();
    const unsigned short* As = smem + (s % STAGES) * STAGE;
    const unsigned short* Bs = As + BM * T16W_BK;
    const unsigned long long da = t16w_desc(As + a_row0 * T16W_BK), db = t16w_desc(Bs + b_row0 * T16W_BK);
    t16w_fence_regs(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < T16W_BK / 16; ++kk) T16wMma<WGN, KIND>::run(acc, da + 2 * kk, db + 2 * kk);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    t16w_fence_regs(acc);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  t16w_fence_regs(acc);
  t16_wait<0>();
  __syncthreads();

  const int LDE = BN + 8;
  Dtype* Es = reinterpret_cast<Dtype*>(smem);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = a_row0 + 16 * wq + g + 8 * h, m = m0 + row;
    const bool m_ok = m < num_output;
#pragma unroll
    for (int j = 0; j < WGN / 8; ++j) {
      const int col = b_row0 + 8 * j + 2 * t;
      Es[row * LDE + col] = m_ok ? conv_epilogue(acc[4 * j + 2 * h], bias, m, epilogue) : Dtype(0);
      Es[row * LDE + col + 1] = m_ok ? conv_epilogue(acc[4 * j + 2 * h + 1], bias, m, epilogue) : Dtype(0);
    }
  }
  __syncthreads();
  t16_store_nchw<BM, BN, T16W_THREADS>(Es, LDE, y, tid, m0, n0, num_output, ncols, P, width_out, out_h, out_w,
                                       out_sy, out_sx, out_y0, out_x0, vec_out);
#else
  __trap();
#endif
}
}  // extern "C++"

// Arguments as t16n_conv's (tensorcore16_nhwc.cu). Grid: (ceil(num_output / BM) * ceil(num*Ho*Wo / BN),
// 1, 1), 256 threads, wgmma.shared_bytes(tile) of dynamic shared memory.
#define T16W_CONV(NAME, BM, BN, STAGES)                                                                        \
  __global__ void __launch_bounds__(T16W_THREADS, 1) NAME(                                                    \
      const Dtype* x, const Dtype* w, const Dtype* bias, const int epilogue, Dtype* y, const int num,         \
      const int channels, const int height, const int width, const int num_output, const int kernel_h,       \
      const int kernel_w, const int pad_h, const int pad_w, const int stride_h, const int stride_w,          \
      const int height_out, const int width_out, const int out_h, const int out_w, const int out_sy,         \
      const int out_sx, const int out_y0, const int out_x0, const int vec_out) {                             \
    t16w_conv<BM, BN, STAGES>(x, w, bias, epilogue, y, num, channels, height, width, num_output, kernel_h,      \
                              kernel_w, pad_h, pad_w, stride_h, stride_w, height_out, width_out, out_h, out_w, \
                              out_sy, out_sx, out_y0, out_x0, vec_out);                                      \
  }

T16W_CONV(t16w_conv_128x256, 128, 256, 4)  // STAGES: wgmma.STAGES
T16W_CONV(t16w_conv_128x128, 128, 128, 5)  // STAGES: wgmma.STAGES
T16W_CONV(t16w_conv_64x128, 64, 128, 4)  // STAGES: wgmma.STAGES
