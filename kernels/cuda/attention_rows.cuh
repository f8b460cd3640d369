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
// attention kernels and the combine kernel, so every mode gives the same bits.
__device__ __forceinline__ void fold_scalars(float& mt, float& lt, float m, float l, float& ca,
                                             float& cb) {
  const float mn = fmaxf(mt, m);
  ca = ex2(__fsub_rn(mt, mn));
  cb = ex2(__fsub_rn(m, mn));
  lt = fmaf(l, cb, __fmul_rn(lt, ca));
  mt = mn;
}
__device__ __forceinline__ float fold_value(float acct, float acc, float ca, float cb) {
  return fmaf(acc, cb, __fmul_rn(acct, ca));
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

// First and last valid key of a row, found by the whole warp; j0 = INT_MAX for an empty row.
// Candidates: [lo, hi] = the window (W > 0: keys max(0, p - W + 1) .. p of the row's position
// p = i + Tk - Tq) or every key; causality (MASK 1) caps hi at p; an array mask (MASK 2, 3) is
// scanned inside [lo, hi] only.
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
    for (int base = lo; base <= hi; base += 32) {
      const int j = base + lane;
      const bool v = j <= hi && mask_ok<MASK>(mask, row + j * col, add, add_at);
      const unsigned bal = __ballot_sync(0xffffffffu, v);
      if (bal) {
        j0 = base + __ffs(bal) - 1;
        break;
      }
    }
    if (j0 != 0x7fffffff) {
      for (int base = hi; base >= j0; base -= 32) {
        const int j = base - lane;
        const bool v = j >= j0 && mask_ok<MASK>(mask, row + j * col, add, add_at);
        const unsigned bal = __ballot_sync(0xffffffffu, v);
        if (bal) {
          jl = base - (__ffs(bal) - 1);
          break;
        }
      }
    }
  }
}

}  // namespace bia
