// Split mode of attention.cu: fold the per-split partials in split order.
// (needs common.cuh and attention_common.cuh before it; the algorithm is described there)

namespace bi {

// Fold the split partials of each row in split order and normalise: one warp per row.
template <typename T, int D, bool SINKS>
__device__ void attention_combine(const float* part, int rows, int nsplit, int Hq, int Tq,
                                  const T* sinks, T* out) {
  constexpr int PER = (D + 31) / 32;
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  float mt = NEG_INF, lt = 0.0f, f[PER];
#pragma unroll
  for (int x = 0; x < PER; ++x) f[x] = 0.0f;
  for (int sp = 0; sp < nsplit; ++sp) {
    const float* p = part + (row * nsplit + sp) * (D + 2);
    const float m = p[0];
    if (m == NEG_INF) continue;
    const float l = p[1];
    if (mt == NEG_INF) {
      mt = m;
      lt = l;
#pragma unroll
      for (int x = 0; x < PER; ++x)
        if (lane + 32 * x < D) f[x] = p[2 + lane + 32 * x];
    } else {
      float ca, cb;
      fold_scalars(mt, lt, m, l, ca, cb);
#pragma unroll
      for (int x = 0; x < PER; ++x)
        if (lane + 32 * x < D) f[x] = fold_value(f[x], p[2 + lane + 32 * x], ca, cb);
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
