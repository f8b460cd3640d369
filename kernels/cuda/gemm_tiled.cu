// Batch-invariant GEMM, large M: cp.async-pipelined shared-memory tiles, one warp walks all of K.
// (needs common.cuh and gemm_common.cuh before it; the reduction order is described there)

namespace bi {

// Large M: BM x BN tiles, WM x WN warps, STAGES-deep cp.async pipeline of 32-wide k-blocks in
// shared memory (row-major [row][32], which the 16-byte fragment reads access conflict-free).
// Dynamic shared memory: STAGES * (BM + BN) * 64 bytes.
template <typename T, int BM, int BN, int WM, int WN, int STAGES, class ASrc, class BSrc, class Epi>
__device__ void gemm_tiled(const ASrc& A, const BSrc& B, int M, int N, int K, const Epi& epi,
                           T* out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* As = reinterpret_cast<u16*>(smem_raw);
  u16* Bs = As + STAGES * BM * 32;
  constexpr int NTHR = WM * WN * 32;
  constexpr int MT = BM / WM / 16, NT = BN / WN / 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / WN, wn = warp % WN;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int nkb = (K + 31) / 32;

  auto load_stage = [&](int stage, int kb) {
#pragma unroll
    for (int idx = tid; idx < BM * 4; idx += NTHR) {
      const int r = idx >> 2, c = idx & 3;
      A.copy8(As + (stage * BM + r) * 32 + 8 * c, m0 + r, kb * 32 + 8 * c);
    }
#pragma unroll
    for (int idx = tid; idx < BN * 4; idx += NTHR) {
      const int r = idx >> 2, c = idx & 3;
      B.copy8(Bs + (stage * BN + r) * 32 + 8 * c, n0 + r, kb * 32 + 8 * c);
    }
  };

  float acc[MT][NT][4], total[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = total[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkb) load_stage(s, s);
    cp_async_commit();
  }
  for (int kb = 0; kb < nkb; ++kb) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nxt = kb + STAGES - 1;
    if (nxt < nkb) load_stage(nxt % STAGES, nxt);
    cp_async_commit();
    const int st = kb % STAGES;
    uint4 af[MT][2], bf[NT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const u16* ra = As + (st * BM + wm * MT * 16 + 16 * i + g) * 32 + 8 * t;
      af[i][0] = *reinterpret_cast<const uint4*>(ra);
      af[i][1] = *reinterpret_cast<const uint4*>(ra + 8 * 32);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      bf[j] = *reinterpret_cast<const uint4*>(Bs + (st * BN + wn * NT * 8 + 8 * j + g) * 32 + 8 * t);
    }
    mma_kblock<T, MT, NT>(acc, af, bf);
    if ((kb % CKB) == CKB - 1 || kb == nkb - 1) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            total[i][j][e] = __fadd_rn(total[i][j][e], acc[i][j][e]);
            acc[i][j][e] = 0.0f;
          }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int m = m0 + wm * MT * 16 + 16 * i + g, n = n0 + wn * NT * 8 + 8 * j + 2 * t;
      store_pair<T>(out, M, N, m, n, total[i][j][0], total[i][j][1], epi);
      store_pair<T>(out, M, N, m + 8, n, total[i][j][2], total[i][j][3], epi);
    }
  }
}

}  // namespace bi
