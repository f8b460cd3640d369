// Batch-invariant GEMM for MLX's CUDA backend: out[m, n] = alpha * sum_k A[m, k] B[n, k] + beta * C[m, n].
//
// The reduction sequence of an output element depends on K alone, never on M, N or the tile
// configuration (needs common.cuh before it):
//   half types (bf16, f16): K is cut into 32-wide k-blocks, each fed to two m16n8k16 MMAs
//     (fp32 accumulate) with one fixed assignment of logical k to MMA slots (kslot below);
//     k-blocks are grouped into chunks of CKB; each chunk is an MMA chain starting from 0;
//     the chunks are summed left to right in fp32 (total = ((0 + c0) + c1) + ...). The skinny
//     kernel (small M) spreads a row's chunks over warps, the tiled kernel (large M) walks them
//     in one warp: both produce exactly that sequence. No split-K across blocks.
//   float32: no tensor cores (no TF32). Lane l of a warp accumulates, with fmaf in increasing
//     k, the k with (k / 4) % 32 == l; the 32 lane sums are added by a fixed xor butterfly.
// The epilogue is round(alpha * total + beta * c), computed once in fp32.
// Operand rows are read through their strides (a W.T view is read in place) and index
// products are 64-bit, so a 16384 x 151936 output does not overflow.

namespace bi {

constexpr int CKB = 8;  // k-blocks (of 32) per chunk: a chunk is 256 consecutive k

// Logical k of the 8 values a lane (t = lane % 4) holds for one k-block: k0 = 32 kb + 8 t + i.
// Values i = 4 s + q feed MMA step s; q = 0,1 go to slots 2t, 2t+1 and q = 2,3 to 2t+8, 2t+9.
// So a lane's 16-byte load of 8 consecutive k is exactly its A (or B) fragment for both steps.

struct DenseRows {
  // Rows of an operand in (row, k) terms: element (r, k) at p[r * s_row + k * s_k].
  const u16* p;
  long long s_row, s_k;
  int rows, K;
  bool vec;

  __device__ void init(const void* ptr, long long sr, long long sk, int rows_, int K_) {
    p = reinterpret_cast<const u16*>(ptr);
    s_row = sr;
    s_k = sk;
    rows = rows_;
    K = K_;
    vec = sk == 1 && (sr % 8) == 0 && aligned16(ptr) && (K_ % 8) == 0;
  }

  // The 8 values k0..k0+7 of row r (k0 % 8 == 0) as raw bits, zeros outside the matrix.
  __device__ __forceinline__ uint4 load8(int r, int k0) const {
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
    if (r >= rows || k0 >= K) return out;
    const u16* base = p + static_cast<long long>(r) * s_row;
    if (vec) return __ldg(reinterpret_cast<const uint4*>(base + k0));
    u32 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int k = k0 + i;
      v[i] = k < K ? static_cast<u32>(base[static_cast<long long>(k) * s_k]) : 0u;
    }
    out.x = v[0] | (v[1] << 16);
    out.y = v[2] | (v[3] << 16);
    out.z = v[4] | (v[5] << 16);
    out.w = v[6] | (v[7] << 16);
    return out;
  }

  // Same 8 values into shared memory: asynchronous on the fast path.
  __device__ __forceinline__ void copy8(u16* dst, int r, int k0) const {
    if (vec) {
      bool ok = r < rows && k0 < K;
      const u16* src = ok ? p + static_cast<long long>(r) * s_row + k0 : p;
      cp_async16(dst, src, ok);
    } else {
      *reinterpret_cast<uint4*>(dst) = load8(r, k0);
    }
  }
};

template <typename T, bool HAS_C>
struct Epilogue {
  const T* c;
  long long sc_m, sc_n;
  float alpha, beta;
  __device__ __forceinline__ float operator()(float total, int m, int n) const {
    float r = __fmul_rn(alpha, total);
    if constexpr (HAS_C) {
      r = fmaf(beta, to_f32<T>(c[static_cast<long long>(m) * sc_m + static_cast<long long>(n) * sc_n]), r);
    }
    return r;
  }
};

// Store the fragment pair (n, n+1) of row m.
template <typename T, class Epi>
__device__ __forceinline__ void store_pair(T* out, int M, int N, int m, int n, float v0, float v1,
                                           const Epi& epi) {
  if (m >= M || n >= N) return;
  T* row = out + static_cast<long long>(m) * N;
  float r0 = epi(v0, m, n);
  if (n + 1 < N) {
    float r1 = epi(v1, m, n + 1);
    if ((N & 1) == 0) {
      *reinterpret_cast<u32*>(row + n) = pack2<T>(r0, r1);
    } else {
      row[n] = from_f32<T>(r0);
      row[n + 1] = from_f32<T>(r1);
    }
  } else {
    row[n] = from_f32<T>(r0);
  }
}

// One k-block (two MMA steps) for an MT x NT grid of m16n8 tiles.
template <typename T, int MT, int NT>
__device__ __forceinline__ void mma_kblock(float (&acc)[MT][NT][4], const uint4 (&af)[MT][2],
                                           const uint4 (&bf)[NT]) {
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mma16816<T>(acc[i][j], af[i][0].x, af[i][1].x, af[i][0].y, af[i][1].y, bf[j].x, bf[j].y);
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      mma16816<T>(acc[i][j], af[i][0].z, af[i][1].z, af[i][0].w, af[i][1].w, bf[j].z, bf[j].w);
    }
  }
}

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

// float32: each warp owns an MT x NT block of outputs, its lanes split K (see the top).
// Blocks of 4 warps; warp tiles are numbered row-major over (M / MT) x (N / NT).
template <int MT, int NT, class Epi>
__device__ void gemm_f32(const float* A, long long sam, long long sak, const float* B,
                         long long sbn, long long sbk, int M, int N, int K, const Epi& epi,
                         float* out) {
  const int lane = threadIdx.x & 31;
  const long long wid = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long tiles_n = (N + NT - 1) / NT;
  const long long tm = wid / tiles_n, tn = wid % tiles_n;
  const int m0 = static_cast<int>(tm * MT), n0 = static_cast<int>(tn * NT);
  if (m0 >= M) return;
  const bool vec_a = sak == 1 && (sam % 4) == 0 && aligned16(A) && (K % 4) == 0;
  const bool vec_b = sbk == 1 && (sbn % 4) == 0 && aligned16(B) && (K % 4) == 0;
  float acc[MT][NT];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j] = 0.0f;

  for (int k0 = 4 * lane; k0 < K; k0 += 128) {
    float a[MT][4], b[NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int m = m0 + i;
      const float* row = A + static_cast<long long>(m) * sam;
      if (m < M && vec_a) {
        float4 v = __ldg(reinterpret_cast<const float4*>(row + k0));
        a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          a[i][q] = (m < M && k0 + q < K) ? row[static_cast<long long>(k0 + q) * sak] : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int n = n0 + j;
      const float* row = B + static_cast<long long>(n) * sbn;
      if (n < N && vec_b) {
        float4 v = __ldg(reinterpret_cast<const float4*>(row + k0));
        b[j][0] = v.x, b[j][1] = v.y, b[j][2] = v.z, b[j][3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          b[j][q] = (n < N && k0 + q < K) ? row[static_cast<long long>(k0 + q) * sbk] : 0.0f;
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j] = fmaf(a[i][q], b[j][q], acc[i][j]);
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float v = acc[i][j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      acc[i][j] = v;
    }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int m = m0 + i, n = n0 + j;
      if (lane == ((i * NT + j) & 31) && m < M && n < N)
        out[static_cast<long long>(m) * N + n] = epi(acc[i][j], m, n);
    }
}

}  // namespace bi
