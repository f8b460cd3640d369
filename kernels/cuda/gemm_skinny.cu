// Batch-invariant GEMM, small M: chunks of K spread over the warps of a block, summed in chunk order.
// (needs common.cuh and gemm_common.cuh before it; the reduction order is described there)

namespace bi {

// Small M: a block of WK (= blockDim.x / 32, at most 8) warps owns rows [16 MT by], columns
// [8 NT bx]; warp w computes chunks w, w + WK, ... and warp 0 adds the chunk sums in chunk
// order through shared memory.
template <typename T, int MT, int NT, class ASrc, class BSrc, class Epi>
__device__ void gemm_skinny(const ASrc& A, const BSrc& B, int M, int N, int K, const Epi& epi,
                            T* out) {
  __shared__ float part[8][MT * NT * 4][32];
  const int WK = blockDim.x >> 5;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * (16 * MT), n0 = blockIdx.x * (8 * NT);
  const int nkb = (K + 31) / 32;
  const int nchunk = (nkb + CKB - 1) / CKB;
  float total[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) total[i][j][e] = 0.0f;

  for (int base = 0; base < nchunk; base += WK) {
    const int c = base + warp;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    if (c < nchunk) {
      const int kb0 = c * CKB;
      const int kbn = min(CKB, nkb - kb0);
      if (kbn == CKB) {
        // Loads of PF k-blocks are issued before their MMAs (memory-level parallelism).
        constexpr int PF = (NT + 2 * MT) <= 3 ? 8 : ((NT + 2 * MT) <= 6 ? 4 : 2);
#pragma unroll
        for (int u0 = 0; u0 < CKB; u0 += PF) {
          uint4 af[PF][MT][2], bf[PF][NT];
#pragma unroll
          for (int u = 0; u < PF; ++u) {
            const int k0 = (kb0 + u0 + u) * 32 + 8 * t;
#pragma unroll
            for (int j = 0; j < NT; ++j) bf[u][j] = B.load8(n0 + 8 * j + g, k0);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
              af[u][i][0] = A.load8(m0 + 16 * i + g, k0);
              af[u][i][1] = A.load8(m0 + 16 * i + 8 + g, k0);
            }
          }
#pragma unroll
          for (int u = 0; u < PF; ++u) mma_kblock<T, MT, NT>(acc, af[u], bf[u]);
        }
      } else {
        for (int u = 0; u < kbn; ++u) {
          const int k0 = (kb0 + u) * 32 + 8 * t;
          uint4 af[MT][2], bf[NT];
#pragma unroll
          for (int j = 0; j < NT; ++j) bf[j] = B.load8(n0 + 8 * j + g, k0);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            af[i][0] = A.load8(m0 + 16 * i + g, k0);
            af[i][1] = A.load8(m0 + 16 * i + 8 + g, k0);
          }
          mma_kblock<T, MT, NT>(acc, af, bf);
        }
      }
    }
    if (WK == 1) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) total[i][j][e] = __fadd_rn(total[i][j][e], acc[i][j][e]);
    } else {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[warp][(i * NT + j) * 4 + e][lane] = acc[i][j][e];
      __syncthreads();
      if (warp == 0) {
        const int nw = min(WK, nchunk - base);
        for (int w = 0; w < nw; ++w) {
#pragma unroll
          for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                total[i][j][e] = __fadd_rn(total[i][j][e], part[w][(i * NT + j) * 4 + e][lane]);
        }
      }
      __syncthreads();
    }
  }
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int m = m0 + 16 * i + g, n = n0 + 8 * j + 2 * t;
      store_pair<T>(out, M, N, m, n, total[i][j][0], total[i][j][1], epi);
      store_pair<T>(out, M, N, m + 8, n, total[i][j][2], total[i][j][3], epi);
    }
  }
}

}  // namespace bi
