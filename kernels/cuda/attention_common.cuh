// Batch-invariant attention for MLX's CUDA backend: softmax(scale * q k^T + mask) v, with GQA,
// masks (none, causal lower-right aligned, bool, additive), attention sinks, sliding windows
// and ring (rotating-cache) key storage. This file: what attention.cu, attention_combine.cu and
// attention_f32.cu share.
//
// One algorithm for decode, chunked prefill and full prefill (needs common.cuh and
// attention_rows.cuh before it).
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
// Keys per split: 512 unless a build defines BI_ATT_SPLIT (bi_rl's BI_RL_ATTN_SPLIT: every
// kernel of a process takes the same size, so decode and prefill agree).
#ifndef BI_ATT_SPLIT
#define BI_ATT_SPLIT 512
#endif
constexpr int ATT_SPLIT = BI_ATT_SPLIT;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float NEG_INF = -cuda::std::numeric_limits<float>::infinity();

// The shape, the split fold, the final normalisation and the row's key range are
// attention_rows.cuh's (shared with the wgmma kernel); the mask element is read as T here.
using bia::AttnShape;
using bia::finalize_scalars;
using bia::finalize_value;
using bia::fold_factors;
using bia::fold_scalars;
using bia::fold_value;
using bia::mask_col;
using bia::mask_row;

template <typename T>
struct MaskAdd {
  __device__ __forceinline__ float operator()(const void* mask, long long off) const {
    return to_f32<T>(reinterpret_cast<const T*>(mask)[off]);
  }
};

template <typename T, int MASK>
__device__ __forceinline__ bool mask_ok(const void* mask, long long off, float& add) {
  return bia::mask_ok<MASK>(mask, off, add, MaskAdd<T>());
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

// First and last valid key of a row (attention_rows.cuh), found by the whole warp.
template <typename T, int MASK>
__device__ void row_range(const AttnShape& S, const void* mask, int b, int h, int i, int lane,
                          int& j0, int& jl) {
  bia::row_range<MASK>(S, mask, b, h, i, lane, j0, jl, MaskAdd<T>());
}
// The same for a warp's 16 rows (attention_rows.cuh's warp_row_ranges).
template <typename T, int MASK>
__device__ void warp_row_ranges(const AttnShape& S, const void* mask, int b, int hq0, int r0,
                                int rows_per, int lane, int* j0s, int* jls) {
  bia::warp_row_ranges<MASK>(S, mask, b, hq0, r0, rows_per, lane, j0s, jls, MaskAdd<T>());
}

}  // namespace bi
