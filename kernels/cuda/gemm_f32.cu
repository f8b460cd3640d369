// Batch-invariant GEMM, float32: fmaf only (no TF32), lanes split K, fixed butterfly.
// (needs common.cuh and gemm_common.cuh before it; the reduction order is described there)

namespace bi {

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
