// Split mode of attention.cu: fold the per-split partials in split order.
// (needs common.cuh and attention_common.cuh before it; the algorithm is described there)

namespace bi {

// The warps a row's combine takes: one for each 32 of its D values (combine_warps in
// attention.py launches as many).
template <int D>
__host__ __device__ constexpr int combine_warps() {
  return (D + 31) / 32;
}

// One batch of a row's split partials (base: the row's first), splits sp0 .. sp0 + AHEAD - 1:
// lane u holds split sp0 + u's m and l (-inf and 0 past the last split), and each lane value
// col of every split of the batch (0 past the last split, or where col is past D).
template <int D, int AHEAD>
struct CombineBatch {
  float m, l;
  float v[AHEAD];

  __device__ __forceinline__ void read(const float* base, int sp0, int nsplit, int lane,
                                       int col) {
    m = NEG_INF;
    l = 0.0f;
    if (lane < AHEAD && sp0 + lane < nsplit) {
      const float2 ml = *reinterpret_cast<const float2*>(base + (sp0 + lane) * (D + 2));
      m = ml.x;
      l = ml.y;
    }
#pragma unroll
    for (int u = 0; u < AHEAD; ++u)
      v[u] = sp0 + u < nsplit && col < D ? base[(sp0 + u) * (D + 2) + 2 + col] : 0.0f;
  }
};

// The sequential fold's running maximum after a split of maximum b, a before it (-inf: no
// valid split yet; b -inf: an empty split, skipped).
__device__ __forceinline__ float run_max(float a, float b) {
  return b == NEG_INF ? a : (a == NEG_INF ? b : fmaxf(a, b));
}

// Fold the split partials of each row in split order and normalise: combine_warps<D>() warps
// a row, warp w of a row computing its values 32 w .. 32 w + 31, one a lane.
//
// Why the bits are those of folding the splits one after another, whatever the batch: a row's
// result is fold_scalars / fold_value applied to its splits in split order, each valid split
// (maximum above -inf) folded into the running (mt, lt, acc), the first valid one taken as it
// is, the empty ones skipped; nothing else touches it, and its splits are fixed by its own
// keys. This kernel evaluates exactly those expressions with exactly those operands, and only
// computes some of them earlier, or on other lanes, or on every warp of the row alike:
// - A value's chain over the splits depends on the scalars (the running maximum and sum) and
//   on that value alone, so the row's values can be folded by different warps, each of them
//   computing the scalars itself from the same inputs by the same operations.
// - A fold's factors depend on the running maximum before the split and after it, not on the
//   running sums. The sequential fold's running maximum after split j is run_max over the
//   splits up to j: the empty ones skipped, the first valid one taken as it is (a NaN too),
//   then fmaxf. That operation gives the same value whatever the grouping (fmaxf is exact and
//   passes over a NaN), so the AHEAD splits of a batch have it at once from a warp scan, one
//   lane a split; each lane then computes its split's two factors with fold_factors from the
//   same two maxima the sequential fold uses. (Two zeros of different sign may come out of a
//   maximum either way, but a maximum only enters differences with a value equal to it, or
//   with a nonzero one, and the comparison with -inf, so no result moves.)
// - What stays sequential is the chain of fold_value over the splits, for lt and for the
//   lane's value: one FMUL and one FFMA a split, the factors taken from their lane.
// - The partials of the next AHEAD splits are read before the current ones are folded, so a
//   warp waits for one memory round trip per AHEAD splits, overlapped with the folding.
template <typename T, int D, bool SINKS>
__device__ void attention_combine(const float* part, int rows, int nsplit, int Hq, int Tq,
                                  const T* sinks, T* out) {
  constexpr int AHEAD = 32;  // splits a batch: one a lane for the scan
  const int lane = threadIdx.x & 31;
  const long long gw =
      static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long row = gw / combine_warps<D>();
  const int col = static_cast<int>(gw % combine_warps<D>()) * 32 + lane;
  if (row >= rows) return;
  const float* base = part + row * nsplit * static_cast<long long>(D + 2);

  float mt = NEG_INF, lt = 0.0f, f = 0.0f;
  CombineBatch<D, AHEAD> cur, nxt;
  cur.read(base, 0, nsplit, lane, col);
  for (int sp0 = 0; sp0 < nsplit; sp0 += AHEAD) {
    nxt.read(base, sp0 + AHEAD, nsplit, lane, col);  // past the last split it reads nothing
    // the running maximum after each split of the batch (inclusive scan), and before it
    float mx = cur.m;
#pragma unroll
    for (int off = 1; off < AHEAD; off <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, mx, off);
      if (lane >= off) mx = run_max(o, mx);
    }
    const float mn = run_max(mt, mx);
    float before = __shfl_up_sync(0xffffffffu, mn, 1);
    if (lane == 0) before = mt;
    float ca, cb;
    fold_factors(before, cur.m, mn, ca, cb);
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      const float m = __shfl_sync(0xffffffffu, cur.m, u);
      const float prev = __shfl_sync(0xffffffffu, before, u);
      const float l = __shfl_sync(0xffffffffu, cur.l, u);
      const float a = __shfl_sync(0xffffffffu, ca, u);
      const float b = __shfl_sync(0xffffffffu, cb, u);
      if (m == NEG_INF) continue;  // an empty split
      if (prev == NEG_INF) {       // the first valid split
        lt = l;
        f = cur.v[u];
      } else {
        lt = fold_value(lt, l, a, b);
        f = fold_value(f, cur.v[u], a, b);
      }
    }
    mt = __shfl_sync(0xffffffffu, mn, AHEAD - 1);
    cur = nxt;
  }
  const int h = static_cast<int>((row / Tq) % Hq);
  const float sink2 = SINKS ? __fmul_rn(to_f32<T>(sinks[h]), LOG2E) : 0.0f;
  float c, ll;
  finalize_scalars(mt, lt, SINKS, sink2, c, ll);
  if (col < D) out[row * D + col] = from_f32<T>(finalize_value(f, c, ll));
}

}  // namespace bi
