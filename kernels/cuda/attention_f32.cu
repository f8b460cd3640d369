// Batch-invariant attention in float32.
// (needs common.cuh and attention_common.cuh before it; the algorithm is described there)

namespace bi {

// float32 (no tensor cores, fmaf only): one warp per query row. The same 64-key blocks from
// the row's first valid key and the same online softmax; a block's scores are computed by its
// lanes (dot products in increasing head-dim order) and P V visits its keys in order. One
// code path whatever the query length, so a row's bits depend on that row alone. Keys are
// visited in logical order; RING (ring storage from key_start[b]) only maps them to rows.
template <int D, int MASK, bool SINKS, bool RING>
__device__ void attention_f32(const float* q, const float* k, const float* v, const void* mask,
                              const float* sinks, const int* key_start, const AttnShape& S,
                              float scale, float* out) {
  constexpr int PER = (D + 31) / 32;
  __shared__ float qsh[4][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;
  const long long rows = static_cast<long long>(S.B) * S.Hq * S.Tq;
  if (row >= rows) return;
  const int i = static_cast<int>(row % S.Tq);
  const int h = static_cast<int>((row / S.Tq) % S.Hq);
  const int b = static_cast<int>(row / (static_cast<long long>(S.Tq) * S.Hq));
  const int kvh = h / S.R;
  float* o = out + row * D;
  int j0, jl;
  row_range<float, MASK>(S, mask, b, h, i, lane, j0, jl);
  const float scale_log2 = __fmul_rn(scale, LOG2E);
  const float* qrow = q + b * S.qs[0] + h * S.qs[1] + i * S.qs[2];
  for (int d = lane; d < D; d += 32) qsh[warp][d] = qrow[d * S.qs[3]];
  __syncwarp();
  const float* kb = k + b * S.ks[0] + kvh * S.ks[1];
  const float* vb = v + b * S.vs[0] + kvh * S.vs[1];
  const long long mrow = mask_row<MASK>(S, b, h, i), mcol = mask_col<MASK>(S);
  const int kst = RING ? ring_start(key_start, b, S.Tk) : 0;
  float m = NEG_INF, l = 0.0f, acc[PER];
#pragma unroll
  for (int x = 0; x < PER; ++x) acc[x] = 0.0f;
  for (int kb0 = j0; j0 != 0x7fffffff && kb0 <= jl; kb0 += ATT_KB) {
    float sc[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = kb0 + 32 * u + lane;
      bool ok = j <= jl;
      float add = 0.0f;
      if constexpr (MASK >= 2) {
        if (ok) ok = mask_ok<float, MASK>(mask, mrow + j * mcol, add);
      }
      sc[u] = NEG_INF;
      if (ok) {
        const float* kr = kb + (RING ? ring_index(j, kst, S.Tk) : j) * S.ks[2];
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qsh[warp][d], kr[d * S.ks[3]], dot);
        sc[u] = __fmul_rn(dot, scale_log2);
        if constexpr (MASK == 3) sc[u] = fmaf(add, LOG2E, sc[u]);
      }
    }
    float mx = fmaxf(sc[0], sc[1]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float mn = fmaxf(m, mx);
    const float mu = mn == NEG_INF ? 0.0f : mn;
    const float alpha = ex2(__fsub_rn(m, mu));
    m = mn;
    const float p0 = ex2(__fsub_rn(sc[0], mu)), p1 = ex2(__fsub_rn(sc[1], mu));
    float rs = __fadd_rn(p0, p1);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) rs = __fadd_rn(rs, __shfl_xor_sync(0xffffffffu, rs, off));
    l = fmaf(l, alpha, rs);
#pragma unroll
    for (int x = 0; x < PER; ++x) acc[x] = __fmul_rn(acc[x], alpha);
    const int last = min(ATT_KB - 1, jl - kb0);
    for (int jj = 0; jj <= last; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, jj < 32 ? p0 : p1, jj & 31);
      const float* vr = vb + (RING ? ring_index(kb0 + jj, kst, S.Tk) : kb0 + jj) * S.vs[2];
#pragma unroll
      for (int x = 0; x < PER; ++x) {
        const int d = lane + 32 * x;
        if (d < D) acc[x] = fmaf(pj, vr[d * S.vs[3]], acc[x]);
      }
    }
  }
  const float sink2 = SINKS ? __fmul_rn(sinks[h], LOG2E) : 0.0f;
  float c, ll;
  finalize_scalars(m, l, SINKS, sink2, c, ll);
#pragma unroll
  for (int x = 0; x < PER; ++x) {
    const int d = lane + 32 * x;
    if (d < D) o[d] = finalize_value(acc[x], c, ll);
  }
}

}  // namespace bi
