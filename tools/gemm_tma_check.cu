// The Hopper GEMM fed by TMA (kernels/cuda/hopper/gemm_tma.cu) against the one fed by cp.async
// that the dispatcher picks past 64 rows (gemm.cu with 128 x 256 blocks, four stages loaded
// three ahead, the epilogue through shared memory: hopper.PREFILL_DEEP_STAGED), without MLX: a
// check that needs no MLX CUDA wheel on the machine, only nvcc and a Hopper GPU.
// Bits: the two outputs compared element for element (they must be equal: the same chains of
// wgmma over the same shared-memory bytes), on row, column and k tails (1, 127, 129 and 4,097
// rows; K 2,040 and 2,104; 264 and 2,056 columns), on A read through a row stride wider than K,
// on operands TMA cannot read (K 2,044; rows 2,052 elements apart: the kernel's own fallback to
// gemm.cu's loop) and on every timed shape; the reference's output starts as NaN bits that no product gives,
// so elements it left unwritten are counted too.
// Speed: the Qwen3-1.7B projections (K x N: 2048 x 4096 for q/k/v together, 2048 x 2048,
// 2048 x 12288 for gate/up together, 6144 x 2048) at 4,096 / 4,720 / 16,384 rows (4,720: eight
// rescored sequences of about 590 tokens) and its logits at 4,720 rows, then the 128 x 128
// blocks (MIDDLE and MIDDLE_TMA, tails and 1,024 / 2,048 rows), each timed with CUDA events, the two kernels alternating over nine rounds (median ms), and cuBLAS's GemmEx
// (bf16 in, fp32 compute) beside them where libcublas can be loaded.
// Build and run from the repository root on the GPU's machine:
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/gemm_tma_check \
//     tools/gemm_tma_check.cu -ldl && /tmp/gemm_tma_check
// (`/tmp/gemm_tma_check quick`: the untimed cases alone, for compute-sanitizer.)
// One JSON line a case; exit 0 when no element differs and none is unwritten, else 1.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "../kernels/cuda/hopper/common.cuh"
#include "../kernels/cuda/hopper/wgmma_ops.cuh"
#include "../kernels/cuda/hopper/tma.cuh"
#include "../kernels/cuda/hopper/gemm.cu"
#include "../kernels/cuda/hopper/gemm_tma.cu"

using bih::u16;

constexpr int NWG = 2, RT = 128, STAGES = 4;

// The cp.async kernel: gemm<bf16, BN, NWG 2, RT 128, KT 1, STAGES 4, no C, DEEP, STAGED>, 256
// threads; BN 256 staged is hopper.PREFILL_DEEP_STAGED, BN 128 unstaged hopper.MIDDLE. No
// launch bounds on either kernel: MLX's carry none, so ptxas allocates as it does for them.
template <int BN, bool STAGED>
__global__ void ref_gemm(const u16* a, long long lda, const u16* b, long long ldb, u16* out,
                         int M, int N, int K) {
  const bih::Operand A = bih::operand(a, lda, 1, M), B = bih::operand(b, ldb, 1, N);
  bih::gemm<false, BN, NWG, RT, 1, STAGES, false, true, STAGED>(A, B, nullptr, 0, 0, out, M, N,
                                                                K, 1.0f, 0.0f);
}

// The same product fed by TMA (PREFILL_TMA, MIDDLE_TMA): 256 multiplying threads and one
// copying warp.
template <int BN, bool STAGED>
__global__ void tma_gemm(const u16* a, long long lda, const u16* b, long long ldb, u16* out,
                         int M, int N, int K, unsigned char* maps) {
  const bih::Operand A = bih::operand(a, lda, 1, M), B = bih::operand(b, ldb, 1, N);
  bih::gemm_tma<false, BN, NWG, STAGES, false, STAGED>(A, B, nullptr, 0, 0, out, M, N, K, 1.0f,
                                                       0.0f, maps);
}

using Kern = void (*)(const u16*, long long, const u16*, long long, u16*, int, int, int);
using TmaKern = void (*)(const u16*, long long, const u16*, long long, u16*, int, int, int,
                         unsigned char*);

// One block shape: its two kernels and their shared memory (hopper.HopperConfig.shared_memory
// for the cp.async one, gemm_tma_smem for the TMA one).
struct Shape {
  int bn;
  Kern ref;
  TmaKern tma;
  int ref_smem, tma_smem;
};

template <int BN, bool STAGED>
Shape shape() {
  Shape s{BN, ref_gemm<BN, STAGED>, tma_gemm<BN, STAGED>, STAGES * (RT + BN) * 128 + 1024,
          bih::gemm_tma_smem<BN, NWG, STAGES>()};
  CK(cudaFuncSetAttribute(s.ref, cudaFuncAttributeMaxDynamicSharedMemorySize, s.ref_smem));
  CK(cudaFuncSetAttribute(s.tma, cudaFuncAttributeMaxDynamicSharedMemorySize, s.tma_smem));
  return s;
}

// cuBLAS, loaded at run time (no cuBLAS headers or link needed to build): GemmEx with bf16
// operands and output, fp32 compute, the default algorithm. Its values are its own (another
// reduction order); only its time is read.
struct Cublas {
  using Create = int (*)(void**);
  using GemmEx = int (*)(void*, int, int, int, int, int, const void*, const void*, int, int,
                         const void*, int, int, const void*, void*, int, int, int, int);
  void* handle = nullptr;
  GemmEx gemm = nullptr;
  Cublas() {
    const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                           "/usr/local/cuda/lib64/libcublas.so"};
    for (const char* n : names) {
      void* lib = dlopen(n, RTLD_NOW);
      if (!lib) continue;
      auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
      gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
      if (create && gemm && create(&handle) == 0) return;
      gemm = nullptr;
    }
  }
  // out (M, N) row-major = A (M, K) B (N, K)^T: in cuBLAS's column-major terms out^T = B A^T.
  bool run(const u16* a, const u16* b, u16* out, int M, int N, int K) const {
    const float one = 1.0f, zero = 0.0f;
    constexpr int OP_N = 0, OP_T = 1, R_16BF = 14, COMPUTE_32F = 68, ALGO_DEFAULT = -1;
    return gemm(handle, OP_T, OP_N, N, M, K, &one, b, R_16BF, K, a, R_16BF, K, &zero, out,
                R_16BF, N, COMPUTE_32F, ALGO_DEFAULT) == 0;
  }
};

struct Case {
  int M, K, N;
  long long lda;  // A's row stride (K unless wider)
  bool timed;
  int bn = 256;   // the block shape: 128 x 256 or 128 x 128
};

static int blocks(int M, int N, int bn) { return ((M + RT - 1) / RT) * ((N + bn - 1) / bn); }

int main(int argc, char** argv) {
  // "quick": the untimed cases alone (for compute-sanitizer, under which launches run many
  // times slower)
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  const Shape wide = shape<256, true>(), square = shape<128, false>();
  const Cublas cublas;
  std::vector<Case> cases = {
      {1, 2048, 2048, 2048, false},    {127, 2040, 264, 2040, false},
      {129, 2104, 2056, 2104, false},  {4097, 2048, 2048, 2048, false},
      {300, 2048, 1024, 2112, false},  // A through a row stride wider than K
      // operands TMA cannot read run gemm.cu's loop inside the same kernel: K not a multiple
      // of 8 (rows not 16-byte multiples apart), and A's rows 2,052 elements apart
      {300, 2044, 1024, 2044, false},  {300, 2048, 1024, 2052, false},
  };
  for (int M : {4096, 4720, 16384}) {
    if (quick) break;
    for (auto kn : {std::pair{2048, 4096}, {2048, 2048}, {2048, 12288}, {6144, 2048}})
      cases.push_back({M, kn.first, kn.second, kn.first, true});
  }
  if (!quick) cases.push_back({4720, 2048, 151936, 2048, true});
  // 128 x 128 blocks (MIDDLE, where 128 x 256 ones would leave multiprocessors idle): tails,
  // then the sizes where the dispatcher picks them (1,024-2,048 rows on 2,048 columns)
  cases.push_back({129, 2040, 264, 2040, false, 128});
  cases.push_back({300, 2044, 1024, 2044, false, 128});  // the fallback
  for (int M : {1024, 2048}) {
    if (quick) break;
    for (int K : {2048, 6144}) cases.push_back({M, K, 2048, K, true, 128});
  }

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  bool ok = true;
  for (const Case& c : cases) {
    const size_t na = static_cast<size_t>(c.M) * c.lda, nb = static_cast<size_t>(c.N) * c.K;
    const size_t no = static_cast<size_t>(c.M) * c.N;
    std::vector<u16> ha(na), hb(nb);
    for (auto& x : ha) x = bf16_bits(dist(rng));
    for (auto& x : hb) x = bf16_bits(dist(rng));
    u16 *da, *db, *dref, *dtma, *dcub;
    unsigned char* dmaps;
    CK(cudaMalloc(&da, na * 2));
    CK(cudaMalloc(&db, nb * 2));
    CK(cudaMalloc(&dref, no * 2));
    CK(cudaMalloc(&dtma, no * 2));
    CK(cudaMalloc(&dcub, no * 2));
    // (the kernel aligns the maps' start itself: it is handed one 8 bytes past an alignment)
    CK(cudaMalloc(&dmaps, 256 * static_cast<size_t>(blocks(c.M, c.N, c.bn)) + 128));
    CK(cudaMemcpy(da, ha.data(), na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb.data(), nb * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dref, 0xFF, no * 2));  // NaN bits
    CK(cudaMemset(dtma, 0xFF, no * 2));
    const int g = blocks(c.M, c.N, c.bn);
    const Shape& sh = c.bn == 256 ? wide : square;
    auto ref = [&] { sh.ref<<<g, 256, sh.ref_smem>>>(da, c.lda, db, c.K, dref, c.M, c.N, c.K); };
    auto tma = [&] {
      sh.tma<<<g, 288, sh.tma_smem>>>(da, c.lda, db, c.K, dtma, c.M, c.N, c.K, dmaps + 8);
    };
    ref();
    tma();
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      std::printf("{\"M\": %d, \"K\": %d, \"N\": %d, \"error\": \"%s\"}\n", c.M, c.K, c.N,
                  cudaGetErrorString(err));
      return 1;  // the context is gone after a fault
    }
    std::vector<u16> hr(no), ht(no);
    CK(cudaMemcpy(hr.data(), dref, no * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ht.data(), dtma, no * 2, cudaMemcpyDeviceToHost));
    long long differ = 0, unwritten = 0;
    for (size_t i = 0; i < no; ++i) {
      differ += hr[i] != ht[i];
      unwritten += hr[i] == 0xFFFFu;
    }
    ok = ok && differ == 0 && unwritten == 0;
    double ms[3] = {-1, -1, -1};
    if (c.timed) {
      const bool with_cublas = cublas.gemm && c.lda == c.K;
      std::vector<float> t[3];
      auto time = [&](int which) {
        CK(cudaEventRecord(e0));
        if (which == 0)
          ref();
        else if (which == 1)
          tma();
        else if (!cublas.run(da, db, dcub, c.M, c.N, c.K))
          return;
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float x;
        CK(cudaEventElapsedTime(&x, e0, e1));
        t[which].push_back(x);
      };
      for (int w = 0; w < 2; ++w)  // warm-up
        for (int which = 0; which < (with_cublas ? 3 : 2); ++which) time(which);
      for (auto& v : t) v.clear();
      for (int round = 0; round < 9; ++round)
        for (int i = 0; i < (with_cublas ? 3 : 2); ++i) time((round + i) % (with_cublas ? 3 : 2));
      for (int w = 0; w < 3; ++w) {
        if (t[w].empty()) continue;
        std::sort(t[w].begin(), t[w].end());
        ms[w] = t[w][t[w].size() / 2];
      }
      CK(cudaGetLastError());
    }
    std::printf(
        "{\"M\": %d, \"K\": %d, \"N\": %d, \"bn\": %d, \"lda\": %lld, \"blocks\": %d, "
        "\"differ\": %lld, "
        "\"unwritten\": %lld, \"ms_cp_async\": %.4f, \"ms_tma\": %.4f, \"ms_cublas\": %.4f, "
        "\"tma/cp_async\": %.3f, \"tma/cublas\": %.3f, \"cp_async/cublas\": %.3f}\n",
        c.M, c.K, c.N, c.bn, c.lda, g, differ, unwritten, ms[0], ms[1], ms[2],
        ms[0] > 0 ? ms[1] / ms[0] : -1.0, ms[2] > 0 ? ms[1] / ms[2] : -1.0,
        ms[2] > 0 ? ms[0] / ms[2] : -1.0);
    std::fflush(stdout);
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dref));
    CK(cudaFree(dtma));
    CK(cudaFree(dcub));
    CK(cudaFree(dmaps));
  }
  std::printf("{\"summary\": {\"bits_equal\": %s, \"cublas\": %s}}\n", ok ? "true" : "false",
              cublas.gemm ? "true" : "false");
  return ok ? 0 : 1;
}
