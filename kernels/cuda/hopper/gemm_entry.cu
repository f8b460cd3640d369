// Stand-alone entry point of the Hopper GEMM (gemm.cu) for mx.fast.precompiled_cuda_kernel,
// the launch path used where bi-rl cannot place its cubins in MLX's kernel cache. Arguments
// come in that API's order: inputs, outputs, then scalars. Operands are row-contiguous there
// (MLX copies any other view), so only C's two strides travel. The configuration is set by
// #define lines before this file: BIH_F16, BIH_BN, BIH_NWG, BIH_RT, BIH_KT, BIH_STAGES,
// BIH_HAS_C, BIH_DEEP and, where set, BIH_STAGED.

#ifndef BIH_STAGED
#define BIH_STAGED 0
#endif

#if BIH_HAS_C
extern "C" __global__ void bi_hopper_gemm(const bih::u16* a, const bih::u16* b, const bih::u16* c,
                                          bih::u16* out, int M, int N, int K, int ldc_m,
                                          int ldc_n, float alpha, float beta) {
#else
extern "C" __global__ void bi_hopper_gemm(const bih::u16* a, const bih::u16* b, bih::u16* out,
                                          int M, int N, int K, float alpha) {
  const bih::u16* c = nullptr;
  const int ldc_m = 0, ldc_n = 0;
  const float beta = 0.0f;
#endif
  const bih::Operand A{a, K, 1, M};
  const bih::Operand B{b, K, 1, N};
  bih::gemm<BIH_F16 != 0, BIH_BN, BIH_NWG, BIH_RT, BIH_KT, BIH_STAGES, BIH_HAS_C != 0,
            BIH_DEEP != 0, BIH_STAGED != 0>(
      A, B, c, ldc_m, ldc_n, out, M, N, K, alpha, beta);
}
