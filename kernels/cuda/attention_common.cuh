// Batch-invariant attention for MLX's CUDA backend: softmax(scale * q k^T + mask) v, with GQA,
// masks (none, causal lower-right aligned, bool, additive) and attention sinks. This file:
// what attention.cu, attention_combine.cu and attention_f32.cu share.
//
// One algorithm for decode, chunked prefill and full prefill (needs common.cuh before it).
// For each query row, with a = its first valid key and e = one past its last valid key:
//   * keys [a, e) are cut into blocks of ATT_KB keys starting at a, blocks into splits of
//     ATT_SPLIT keys (a fixed split SIZE, never a fixed number of splits);
//   * a block: scores by m16n8k16 MMAs over the head dim (fixed order), fp32 online softmax
//     (running max, exp2 on the SFU, row sums by a fixed quad butterfly), P V by MMAs with keys
//     in block order;
//   * each split restarts the online softmax; split results are folded left to right
//     (fold_* below), in one block (sequential mode) or by the combine kernel (split mode);
//   * masked keys and blocks past a row's last valid key are exact no-ops for that row.
// Nothing therefore depends on the batch, the number of query rows computed together, the
// rows sharing an MMA tile, left padding, cache capacity or keys appended after the row.
// Rows are (query i, head r of the kv group) pairs of one (batch, kv head), 16 per warp.

namespace bi {

constexpr int ATT_KB = 64;
constexpr int ATT_SPLIT = 256;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float NEG_INF = -cuda::std::numeric_limits<float>::infinity();

struct AttnShape {
  int B, Hq, Tq, Hkv, Tk, R;
  long long qs[4], ks[4], vs[4];
  int mshape[4];
  long long ms[4];
};

// Fold split result (m, l, acc) into the running (mt, lt, acct): the same expressions in the
// attention kernel and the combine kernel, so both modes give the same bits.
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

template <typename T, int MASK>
__device__ __forceinline__ bool mask_ok(const void* mask, long long off, float& add) {
  if constexpr (MASK == 2) {
    return reinterpret_cast<const bool*>(mask)[off];
  } else if constexpr (MASK == 3) {
    add = to_f32<T>(reinterpret_cast<const T*>(mask)[off]);
    return add != NEG_INF;
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
template <typename T, int MASK>
__device__ void row_range(const AttnShape& S, const void* mask, int b, int h, int i, int lane,
                          int& j0, int& jl) {
  j0 = 0x7fffffff;
  jl = -1;
  if constexpr (MASK == 0) {
    j0 = 0;
    jl = S.Tk - 1;
  } else if constexpr (MASK == 1) {
    const int last = i + S.Tk - S.Tq;
    if (last >= 0) {
      j0 = 0;
      jl = min(last, S.Tk - 1);
    }
  } else {
    const long long row = mask_row<MASK>(S, b, h, i), col = mask_col<MASK>(S);
    float add;
    for (int base = 0; base < S.Tk; base += 32) {
      const int j = base + lane;
      const bool v = j < S.Tk && mask_ok<T, MASK>(mask, row + j * col, add);
      const unsigned bal = __ballot_sync(0xffffffffu, v);
      if (bal) {
        j0 = base + __ffs(bal) - 1;
        break;
      }
    }
    if (j0 != 0x7fffffff) {
      for (int base = S.Tk - 1; base >= j0; base -= 32) {
        const int j = base - lane;
        const bool v = j >= j0 && mask_ok<T, MASK>(mask, row + j * col, add);
        const unsigned bal = __ballot_sync(0xffffffffu, v);
        if (bal) {
          jl = base - (__ffs(bal) - 1);
          break;
        }
      }
    }
  }
}

}  // namespace bi
