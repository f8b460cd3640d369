// Batch-invariant GEMM for MLX's CUDA backend: out[m, n] = alpha sum_k A[m, k] B[n, k] + beta C[m, n].
// This file: what the GEMM kernels (gemm_skinny.cu, gemm_tiled.cu, gemm_f32.cu) share.
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

}  // namespace bi
