// What both attention kernel families compute alike: the mma.sync kernels (attention.cu,
// attention_combine.cu and attention_f32.cu, through attention_common.cuh) and the wgmma kernel
// (hopper/attention.cu). The shape MLX hands a kernel, the fold of split results and the final
// normalisation, and where a row's valid keys begin and end under its mask, causality and
// window: one definition, so a row gets the same bits from either family. Self-contained (no
// MLX type: the wgmma kernel is built with bi-rl's stand-in headers); a 16-bit mask element is
// read through the caller's add_at(mask, offset), which knows the element type.

namespace bia {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// 2^x on the special-function unit.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

struct AttnShape {
  int B, Hq, Tq, Hkv, Tk, R;
  int W;  // sliding window in keys, 0: none
  long long qs[4], ks[4], vs[4];
  int mshape[4];
  long long ms[4];
};

// Fold split result (m, l, acc) into the running (mt, lt, acct): the same expressions in the
// attention kernels and the combine kernel, so every mode gives the same bits. fold_factors
// gives the two factors from the running maximum before (mt) and after (mn = fmaxf(mt, m));
// fold_value scales the running value by ca and adds the split's scaled by cb (lt too).
__device__ __forceinline__ void fold_factors(float mt, float m, float mn, float& ca, float& cb) {
  ca = ex2(__fsub_rn(mt, mn));
  cb = ex2(__fsub_rn(m, mn));
}
__device__ __forceinline__ float fold_value(float acct, float acc, float ca, float cb) {
  return fmaf(acc, cb, __fmul_rn(acct, ca));
}
__device__ __forceinline__ void fold_scalars(float& mt, float& lt, float m, float l, float& ca,
                                             float& cb) {
  const float mn = fmaxf(mt, m);
  fold_factors(mt, m, mn, ca, cb);
  lt = fold_value(lt, l, ca, cb);
  mt = mn;
}

// Final normalisation with an optional sink logit (in base-2 units): out = acc * c / l.
__device__ __forceinline__ void finalize_scalars(float mt, float lt, bool has_sink, float sink2,
                                                 float& c, float& l) {
  c = 1.0f;
  l = lt;
  if (has_sink) {
    const float mn = fmaxf(mt, sink2);
    c = ex2(__fsub_rn(mt, mn));
    l = fmaf(lt, c, ex2(__fsub_rn(sink2, mn)));
  }
}
__device__ __forceinline__ float finalize_value(float acc, float c, float l) {
  return l > 0.0f ? __fdiv_rn(__fmul_rn(acc, c), l) : 0.0f;
}

// A mask element: MASK 2 a bool (valid or not), MASK 3 an additive value (add; -inf: not
// valid); otherwise every key is valid.
template <int MASK, class AddAt>
__device__ __forceinline__ bool mask_ok(const void* mask, long long off, float& add,
                                        AddAt add_at) {
  if constexpr (MASK == 2) {
    return reinterpret_cast<const bool*>(mask)[off];
  } else if constexpr (MASK == 3) {
    add = add_at(mask, off);
    return add != neg_inf();
  }
  return true;
}

template <int MASK>
__device__ __forceinline__ long long mask_row(const AttnShape& S, int b, int h, int i) {
  if constexpr (MASK >= 2) {
    return (S.mshape[0] > 1 ? b * S.ms[0] : 0) + (S.mshape[1] > 1 ? h * S.ms[1] : 0) +
           (S.mshape[2] > 1 ? i * S.ms[2] : 0);
  }
  return 0;
}
template <int MASK>
__device__ __forceinline__ long long mask_col(const AttnShape& S) {
  if constexpr (MASK >= 2) return S.mshape[3] > 1 ? S.ms[3] : 0;
  return 0;
}

// The least / greatest of a value over the 32 lanes of a warp (all lanes taking part), by a
// butterfly of shuffles: every lane ends with the result.
__device__ __forceinline__ int warp_min(int v) {
#pragma unroll
  for (int w = 16; w >= 1; w >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, w));
  return v;
}
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int w = 16; w >= 1; w >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, w));
  return v;
}

// Mask elements a lane reads before testing any of them, in row_range's scans: a round of the
// scan tests 32 RANGE_U keys for about one memory latency (one key a lane a round made a
// left-padded prefill block spend most of its time waiting on these reads).
constexpr int RANGE_U = 8;

// First and last valid key of a row, found by the whole warp; j0 = INT_MAX for an empty row.
// Candidates: [lo, hi] = the window (W > 0: keys max(0, p - W + 1) .. p of the row's position
// p = i + Tk - Tq) or every key; causality (MASK 1) caps hi at p; an array mask (MASK 2, 3) is
// scanned inside [lo, hi] only: forward from lo for the first valid key, then backward from hi
// for the last, reading only keys inside [lo, hi] (and, backward, not below j0). Integers
// only: which keys count does not depend on the order the reads complete in.
template <int MASK, class AddAt>
__device__ __forceinline__ void row_range(const AttnShape& S, const void* mask, int b, int h,
                                          int i, int lane, int& j0, int& jl, AddAt add_at) {
  j0 = 0x7fffffff;
  jl = -1;
  const int p = i + S.Tk - S.Tq;
  int lo = 0, hi = S.Tk - 1;
  if (S.W > 0) {
    lo = max(0, p - S.W + 1);
    hi = min(p, hi);
  } else if constexpr (MASK == 1) {
    hi = min(p, hi);
  }
  if (hi < lo) return;
  if constexpr (MASK < 2) {
    j0 = lo;
    jl = hi;
  } else {
    const long long row = mask_row<MASK>(S, b, h, i), col = mask_col<MASK>(S);
    float add;
    // A round: lane l tests keys base + 32 u + l, u < RANGE_U, all reads issued before any
    // is tested; its least valid key (the least u's) is min-reduced over the warp, which
    // gives the least valid key of the round. j0 comes from the reduction, the same in every
    // lane, so the loop stays uniform.
    for (int base = lo; base <= hi && j0 == 0x7fffffff; base += 32 * RANGE_U) {
      unsigned ok = 0u;
#pragma unroll
      for (int u = 0; u < RANGE_U; ++u) {
        const int j = base + 32 * u + lane;
        if (j <= hi && mask_ok<MASK>(mask, row + j * col, add, add_at)) ok |= 1u << u;
      }
      const int mine = ok != 0u ? base + 32 * (__ffs(ok) - 1) + lane : 0x7fffffff;
      j0 = warp_min(mine);
    }
    // The same backward: lane l tests keys base - 32 u - l; the greatest valid key is
    // max-reduced. A row with a first key has a last one.
    for (int base = hi; j0 != 0x7fffffff && base >= j0 && jl < 0; base -= 32 * RANGE_U) {
      unsigned ok = 0u;
#pragma unroll
      for (int u = 0; u < RANGE_U; ++u) {
        const int j = base - 32 * u - lane;
        if (j >= j0 && mask_ok<MASK>(mask, row + j * col, add, add_at)) ok |= 1u << u;
      }
      const int mine = ok != 0u ? base - 32 * (__ffs(ok) - 1) - lane : -1;
      jl = warp_max(mine);
    }
  }
}

// row_range for the 16 rows r0 .. r0 + 15 of a warp (row r: query r / S.R, head
// hq0 + r % S.R; rows from rows_per on are empty), lane 0 writing row r0 + rr's range to
// j0s[rr] and jls[rr]. Where an array mask (MASK 2, 3) has one row for every head (its head
// dimension is 1), the heads of a query share their range, so it is found once for each
// query: a row's range is a function of its query index, mask row and window, the same
// whichever row computes it. (Without an array mask a range is a few integer operations,
// computed for each row.)
template <int MASK, class AddAt>
__device__ __forceinline__ void warp_row_ranges(const AttnShape& S, const void* mask, int b,
                                                int hq0, int r0, int rows_per, int lane, int* j0s,
                                                int* jls, AddAt add_at) {
  const bool share = MASK >= 2 && S.mshape[1] <= 1;
  int pi = -1, pj0 = 0x7fffffff, pjl = -1;
  for (int rr = 0; rr < 16; ++rr) {
    const int r = r0 + rr;
    int j0 = 0x7fffffff, jl = -1;
    if (r < rows_per) {
      const int i = r / S.R;
      if (share && i == pi) {
        j0 = pj0;
        jl = pjl;
      } else {
        row_range<MASK>(S, mask, b, hq0 + r % S.R, i, lane, j0, jl, add_at);
        pi = i;
        pj0 = j0;
        pjl = jl;
      }
    }
    if (lane == 0) {
      j0s[rr] = j0;
      jls[rr] = jl;
    }
  }
}

}  // namespace bia
