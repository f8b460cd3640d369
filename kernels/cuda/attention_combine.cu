// Split mode of attention.cu: fold the per-split partials in split order.
// (needs common.cuh and attention_common.cuh before it; the algorithm is described there)

namespace bi {

// Fold the split partials of each row in split order and normalise: one warp per row.
//
// The fold is sequential (split sp + 1 folds into the result of splits 0..sp), but the reads
// are not: the partials of AHEAD splits are read into registers before any of them is folded,
// so a row waits for one memory round trip per AHEAD splits rather than one per split (at one
// row a head, 512 splits over 131072 keys, the round trips were the kernel's time). Which
// values are read early changes nothing of what is folded or in which order, so the bits are
// those of folding each split as it is read; a split whose partial is empty (maximum -inf) is
// skipped as before, its other values read and never used.
template <typename T, int D, bool SINKS>
__device__ void attention_combine(const float* part, int rows, int nsplit, int Hq, int Tq,
                                  const T* sinks, T* out) {
  constexpr int PER = (D + 31) / 32;
  constexpr int AHEAD = 8;
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  float mt = NEG_INF, lt = 0.0f, f[PER];
#pragma unroll
  for (int x = 0; x < PER; ++x) f[x] = 0.0f;
  for (int sp0 = 0; sp0 < nsplit; sp0 += AHEAD) {
    float pm[AHEAD], pl[AHEAD], pv[AHEAD][PER];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      pm[u] = NEG_INF;
      pl[u] = 0.0f;
#pragma unroll
      for (int x = 0; x < PER; ++x) pv[u][x] = 0.0f;
      if (sp0 + u < nsplit) {
        const float* p = part + (row * nsplit + sp0 + u) * (D + 2);
        pm[u] = p[0];
        pl[u] = p[1];
#pragma unroll
        for (int x = 0; x < PER; ++x)
          if (lane + 32 * x < D) pv[u][x] = p[2 + lane + 32 * x];
      }
    }
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      const float m = pm[u];
      if (m == NEG_INF) continue;
      const float l = pl[u];
      if (mt == NEG_INF) {
        mt = m;
        lt = l;
#pragma unroll
        for (int x = 0; x < PER; ++x)
          if (lane + 32 * x < D) f[x] = pv[u][x];
      } else {
        float ca, cb;
        fold_scalars(mt, lt, m, l, ca, cb);
#pragma unroll
        for (int x = 0; x < PER; ++x)
          if (lane + 32 * x < D) f[x] = fold_value(f[x], pv[u][x], ca, cb);
      }
    }
  }
  const int h = static_cast<int>((row / Tq) % Hq);
  const float sink2 = SINKS ? __fmul_rn(to_f32<T>(sinks[h]), LOG2E) : 0.0f;
  float c, ll;
  finalize_scalars(mt, lt, SINKS, sink2, c, ll);
#pragma unroll
  for (int x = 0; x < PER; ++x)
    if (lane + 32 * x < D) out[row * D + lane + 32 * x] = from_f32<T>(finalize_value(f[x], c, ll));
}

}  // namespace bi
