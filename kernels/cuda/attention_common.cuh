// Batch-invariant attention for MLX's CUDA backend: softmax(scale * q k^T + mask) v, with GQA,
// masks (none, causal lower-right aligned, bool, additive), attention sinks, sliding windows
// and ring (rotating-cache) key storage. This file: what attention.cu, attention_combine.cu and
// attention_f32.cu share.
//
// One algorithm for decode, chunked prefill and full prefill (needs common.cuh before it).
// Keys are indexed in position ("logical") order j = 0 .. Tk - 1; in ring mode logical key j of
// batch row b is stored at (key_start[b] + j) mod Tk, and only the loads translate (masks,
// causality and windows speak of logical j). A query row i sits at logical position
// p = i + Tk - Tq (lower-right alignment); with a window W its keys are limited to
// [max(0, p - W + 1), p]. For each query row, with a = its first valid key and e = one past its
// last valid key (after mask, causality and window):
//   * keys [a, e) are cut into blocks of ATT_KB keys starting at a, blocks into splits of
//     ATT_SPLIT keys (a fixed split SIZE, never a fixed number of splits);
//   * a block: scores by m16n8k16 MMAs over the head dim (k16 steps in increasing order),
//     fp32 online softmax (running max, exp2 on the SFU, row sums by a fixed quad butterfly),
//     P V by MMAs with keys in block order;
//   * each split restarts the online softmax; split results are folded left to right
//     (fold_* below), in one block (sequential mode) or by the combine kernel (split mode);
//   * masked keys and blocks past a row's last valid key are exact no-ops for that row, and
//     keys before a or past the last valid key of every row of a pass are never read.
// Why the order cannot depend on the batch: every quantity that places a key in a block, a
// split or a fold (a, e, the block and split boundaries, the MMA k-step order) is a function of
// the row's own query index, mask row, window and logical keys, and the per-element arithmetic
// is the same instruction sequence in every configuration. Nothing depends on the batch, the
// number of query rows computed together, the rows sharing an MMA tile, left padding, cache
// capacity, where a ring's storage wraps, or keys appended after the row. A window only moves
// a to the window's first valid key, the same a a mask spelling the window gives, so the two
// give the same bits.
// Rows are (query i, head r of the kv group) pairs of one (batch, kv head), 16 per warp.

namespace bi {

constexpr int ATT_KB = 64;
constexpr int ATT_SPLIT = 256;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float NEG_INF = -cuda::std::numeric_limits<float>::infinity();

struct AttnShape {
  int B, Hq, Tq, Hkv, Tk, R;
  int W;  // sliding window in keys, 0: none
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

// Ring storage: batch row b's logical key j lives at (kst + j) mod Tk, kst = key_start[b]
// reduced into [0, Tk) (any int32 is accepted: the reads stay in bounds).
__device__ __forceinline__ int ring_start(const int* key_start, int b, int Tk) {
  const int r = key_start[b] % Tk;
  return r < 0 ? r + Tk : r;
}
__device__ __forceinline__ int ring_index(int j, int kst, int Tk) {
  const int s = j + kst;  // j, kst in [0, Tk): one subtraction wraps it
  return s >= Tk ? s - Tk : s;
}

// First and last valid key of a row, found by the whole warp; j0 = INT_MAX for an empty row.
// Candidates: [lo, hi] = the window (W > 0: keys max(0, p - W + 1) .. p of the row's position
// p = i + Tk - Tq) or every key; causality (MASK 1) caps hi at p; an array mask (MASK 2, 3) is
// scanned inside [lo, hi] only.
template <typename T, int MASK>
__device__ void row_range(const AttnShape& S, const void* mask, int b, int h, int i, int lane,
                          int& j0, int& jl) {
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
      const bool v = j <= hi && mask_ok<T, MASK>(mask, row + j * col, add);
      const unsigned bal = __ballot_sync(0xffffffffu, v);
      if (bal) {
        j0 = base + __ffs(bal) - 1;
        break;
      }
    }
    if (j0 != 0x7fffffff) {
      for (int base = hi; base >= j0; base -= 32) {
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
