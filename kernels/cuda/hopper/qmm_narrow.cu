// Batch-invariant quantized GEMM on Hopper for few rows (decode): the bits of qmm.cu's wgmma
// kernels, computed with mma.sync, each lane dequantising its own weight fragments in registers.
// out[m, n] = sum_k x[m, k] w[n, k] for MLX's affine 2/3/4/5/6/8-bit weights, groups of 32, 64
// or 128 (the packing qmm.cu describes).
//
// Why an element's bits are those of qmm.cu, and cannot depend on the batch:
// - Each weight value that enters a product is s q + b rounded once to the half type, and 0
//   for k at or past K: qmm.cu's DequantPair, which QuantB::prepare calls too, a function of
//   (w, scales, biases, n, k) alone. Which lane makes it, and when, changes nothing.
// - The reduction is gemm_narrow.cu's: each output element is accumulated by one warp, in
//   registers, from +0, by one chain of mma.sync m16n8k16 over the k16 steps of K (rounded up
//   to 64, the missing k zero in both operands) in increasing order, each k in the slot it has
//   in the wgmma chain of gemm.cu's main loop, which qmm.cu runs. That the two chains give the
//   same fp32 bits is gemm_narrow.cu's argument (tools/mma_equiv.cu measures it on the device;
//   the GPU tests compare every configuration the dispatcher can pick, bit for bit).
// - Nothing else adds into an element (no split-K, no atomics); the epilogue is gemm.cu's
//   store_pair with alpha 1 and no C, as qmm.cu's. Rows that share a block (16 a block; rows
//   past M are not loaded and their outputs are discarded), the columns a warp computes and the
//   pipeline depth decide only which elements are computed together.
//
// Why it exists: qmm.cu dequantises each k-tile into shared memory with the whole block and a
// barrier before a wgmma (64 rows) can read it, so a one-row decode product waits on that round
// trip every k-tile. Here a lane turns the packed bytes it needs into its fragments directly.
//
// Layout: a block of WARPS warps computes 16 rows by BNB = 8 NT WARPS columns; warp w owns the
// n8 tiles NT w .. NT w + NT - 1. STAGES shared-memory stages each hold x's 16 x 64 k-tile
// (gemm.cu's TileLoader layout, read by ldmatrix as gemm_narrow.cu does) and, after it, the
// packed bytes of the block's BNB weight rows for that k-tile with their scales and biases
// (QuantB::load's layout with one k-tile a stage), filled by cp.async from all threads
// STAGES - 1 k-tiles ahead. A lane reads and dequantises its fragments of a k-tile into
// registers one k-tile ahead of that k-tile's MMAs, so that the reads and dequantisation of
// k-tile kt + 1 fill the latency of k-tile kt's chain of MMAs; the order of the chain is the
// same.
//
// Fragments: in mma.sync m16n8k16 lane l holds, of each k16 step's 16 x 8 weight tile, column
// n = l / 4 at k = 2 (l % 4) + {0, 1} (b0) and the same + 8 (b1). A k-tile's 64 values of a
// row are 8 groups of 8 consecutive k, BITS bytes each, so the lane takes values 2 (l % 4) and
// 2 (l % 4) + 1 of every group: group 2 s + h gives b(h) of step s. The four lanes of a column
// read the same bytes (a shared-memory broadcast).
//
// Needs common.cuh, gemm.cu, qmm.cu and gemm_narrow.cu before it.

namespace bih {

// The 8 BITS bytes (64 values) of one weight row's k-tile, as 32-bit words, from shared memory
// (16-byte aligned for even BITS, 8-byte aligned for odd).
template <int BITS>
__device__ __forceinline__ void lds_packed(u32 at, u32 (&w)[2 * BITS]) {
  if constexpr (BITS % 2 == 0) {
#pragma unroll
    for (int i = 0; i < BITS / 2; ++i)
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(w[4 * i]), "=r"(w[4 * i + 1]), "=r"(w[4 * i + 2]), "=r"(w[4 * i + 3])
                   : "r"(at + 16 * i));
  } else {
#pragma unroll
    for (int i = 0; i < BITS; ++i)
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                   : "=r"(w[2 * i]), "=r"(w[2 * i + 1])
                   : "r"(at + 8 * i));
  }
}

// Values sh / BITS and sh / BITS + 1 of group GI (8 values, BITS bytes) of a packed k-tile row,
// as the low 2 BITS bits (sh = 2 BITS (lane % 4), the lane's first value's bit in its group).
// At 4 bits the pair is byte lane % 4 of the group's word, which one PRMT moves down and
// clears above (sel = pair_select(lane)).
template <int BITS, int GI>
__device__ __forceinline__ u32 group_pair(const u32 (&w)[2 * BITS], int sh, u32 sel) {
  constexpr int POS = 8 * GI * BITS;  // the group's first bit in the row's stream
  constexpr int W0 = POS / 32, INTRA = POS % 32;
  constexpr u32 MASK = (1u << (2 * BITS)) - 1u;
  if constexpr (BITS == 4) {
    static_assert(INTRA == 0, "a group is a word");
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(w[W0]), "r"(0u), "r"(sel));
    return r;
  } else if constexpr (INTRA + 8 * BITS <= 32) {
    return (w[W0] >> (INTRA + sh)) & MASK;
  } else {
    u64 cat = w[W0];
    if constexpr (W0 + 1 < 2 * BITS) cat |= static_cast<u64>(w[W0 + 1]) << 32;
    return static_cast<u32>((cat >> INTRA) >> sh) & MASK;
  }
}

// group_pair's PRMT selector for lane l at 4 bits: byte l % 4 of the first word into byte 0,
// bytes of the zero second word (4) into the others.
__device__ __forceinline__ u32 pair_select(int lane) { return 0x4440u | (lane & 3); }

// One n8 tile's weight fragments of a k-tile for this lane: b[s][h] of k16 step s, half h,
// from the row's packed bytes w and its two groups' scales and biases, each in both halves of
// a word (lo: k 0-31 of the k-tile, hi: k 32-63), by qmm.cu's DequantPair. TAIL: the k-tile
// holds K's end, and groups at or past K give 0.
template <bool F16, int BITS, bool TAIL>
__device__ __forceinline__ void dequant_ktile(const u32 (&w)[2 * BITS], int sh, u32 sel, u32 s_lo,
                                              u32 s_hi, u32 b_lo, u32 b_hi, int k0, int K,
                                              const DequantPair<F16, BITS>& dq,
                                              u32 (&b)[BK / 16][2]) {
#define BIH_QN_GROUP(GI)                                                                      \
  b[(GI) / 2][(GI) % 2] =                                                                     \
      !TAIL || k0 + 8 * (GI) < K                                                              \
          ? dq(group_pair<BITS, GI>(w, sh, sel), (GI) < 4 ? s_lo : s_hi, (GI) < 4 ? b_lo : b_hi) \
          : 0u;
  BIH_QN_GROUP(0)
  BIH_QN_GROUP(1)
  BIH_QN_GROUP(2)
  BIH_QN_GROUP(3)
  BIH_QN_GROUP(4)
  BIH_QN_GROUP(5)
  BIH_QN_GROUP(6)
  BIH_QN_GROUP(7)
#undef BIH_QN_GROUP
}

// One n8 tile's fragments of a k-tile for this lane (dequant_ktile's b): its column's packed
// row at w_at and scale and bias words at sb in a stage (QuantB::load's layout: 4 scales at
// +0, 4 biases at +8, from the even element at or before the k-tile's first group, so that
// group's own element is at the parity of n * row + group); kps and kpb are k0 + ((n row) % 2
// << gshift) for the scales and for the biases, whose bits from gshift up give that parity.
// Every column's words are in the stage (a row past N holds what the checked copy wrote
// there); a column past N (in_n false) takes 0, as its outputs are discarded.
template <bool F16, int BITS, bool TAIL>
__device__ __forceinline__ void column_fragments(u32 w_at, u32 sb, int kps, int kpb, bool in_n,
                                                 int k0, int K, int gshift, int sh, u32 sel,
                                                 const DequantPair<F16, BITS>& dq,
                                                 u32 (&b)[BK / 16][2]) {
  u32 w[2 * BITS];
  lds_packed<BITS>(w_at, w);
  const int glo = k0 >> gshift, ghi = (k0 + 32) >> gshift;
  const u32 ps = (kps >> gshift) & 1, pb = (kpb >> gshift) & 1;
  u16 slo, shi, blo, bhi;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(slo) : "r"(sb + ps * 2));
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(shi) : "r"(sb + (ps + ghi - glo) * 2));
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(blo) : "r"(sb + 8 + pb * 2));
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(bhi) : "r"(sb + 8 + (pb + ghi - glo) * 2));
  const u32 s_lo = in_n ? dup_half(slo) : 0u, s_hi = in_n ? dup_half(shi) : 0u;
  const u32 b_lo = in_n ? dup_half(blo) : 0u, b_hi = in_n ? dup_half(bhi) : 0u;
  dequant_ktile<F16, BITS, TAIL>(w, sh, sel, s_lo, s_hi, b_lo, b_hi, k0, K, dq, b);
}

// The unchecked copy of one k-tile wholly inside K into a stage, by CT threads, for a block
// whose weight rows all lie inside N with every operand aligned for cp.async: x's 16 x 64 tile
// in TileLoader's layout (rows past M left unwritten: their outputs are discarded), then
// QuantB::load's layout of the block's packed rows and their scale and bias words. Copier t
// (0 .. CT - 1) takes chunks and words t, t + CT, ... Every per-thread quantity is carried from
// k-tile to k-tile (sources, stage addresses, what a scale word has left), not recomputed: a
// loop-invariant one, ptxas recomputes every k-tile from the thread index and the kernel
// arguments. The only check left is whether a scale or bias word runs past the end of its
// array (the last row's), where it is clipped as QuantB::load clips it.
template <int BITS, int BNB, int CT>
struct QnFastCopy {
  using QB = QuantB<BITS, BNB, 1, CT, false>;
  static constexpr int CH = QB::CH, CHUNKS = QB::CHUNKS, ROW_BYTES = QB::ROW_BYTES;
  static constexpr int A_BYTES = 16 * 128, W_BYTES = QB::W_BYTES;
  static constexpr int PX = (16 * 8 + CT - 1) / CT;        // x chunks a copier
  static constexpr int PW = (BNB * CHUNKS + CT - 1) / CT;  // weight chunks
  static constexpr int PS = (BNB * 4 + CT - 1) / CT;       // scale and bias words
  const u16* xsrc[PX];
  u32 xat[PX];  // in the stage of the next k-tile
  bool xon[PX];
  const unsigned char* wsrc[PW];
  u32 wat[PW];
  // QuantB::load stages for row n at k-tile kt the 4 elements from e = (R + g) & ~1, R = n row,
  // g = kt BK >> gshift: that is (R - R % 2) + ((kp >> gshift) & ~1) with kp = kt BK +
  // (R % 2 << gshift), an even base plus a term of kp alone. Carried: kp, the previous e, the
  // word's source at it and the elements left from there to the array's end (capped).
  const u16* ssrc[PS];
  int skp[PS], se[PS], sleft[PS];
  u32 sat[PS];
  int t;

  __device__ void init(const Operand& X, int m0, int M, const QuantOperand& W, int n0, int t_,
                       u32 stage) {
    t = t_;
#pragma unroll
    for (int i = 0; i < PX; ++i) {
      const int c = t + i * CT, r = c >> 3, cc = c & 7;
      xon[i] = c < 16 * 8 && m0 + r < M;
      xsrc[i] = X.p + static_cast<long long>(m0 + r) * X.s_row + 8 * cc;
      xat[i] = stage + narrow_chunk(r, cc);
    }
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      const int u = t + i * CT, r = u / CHUNKS, c = u % CHUNKS;
      wsrc[i] = W.w + static_cast<long long>(n0 + r) * W.w_row + c * CH;
      wat[i] = stage + A_BYTES + r * ROW_BYTES + c * CH;
    }
#pragma unroll
    for (int i = 0; i < PS; ++i) {
      const int u = t + i * CT, r = u >> 2, which = u & 3;
      const bool bias = which >= 2;
      const long long row = static_cast<long long>(n0 + r) * (bias ? W.b_row : W.s_row);
      const long long from = row - (row & 1) + 2 * (which & 1);
      skp[i] = static_cast<int>(row & 1) << W.gshift;
      se[i] = 0;
      ssrc[i] = (bias ? W.bi : W.sc) + from;
      const long long avail = (bias ? W.b_total : W.s_total) - from;
      sleft[i] = static_cast<int>(avail < (1ll << 30) ? avail : (1ll << 30));
      sat[i] = stage + A_BYTES + W_BYTES + r * 16 + which * 4;
    }
  }

  // The next k-tile (every k-tile before it copied or skipped), of groups gshift.
  __device__ __forceinline__ void issue(int gshift, const u16* any) {
#pragma unroll
    for (int i = 0; i < PX; ++i)
      if (xon[i]) cp_async16(xat[i], xsrc[i], 16);
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      if (t + i * CT >= BNB * CHUNKS) break;
      if constexpr (CH == 16) {
        cp_async16(wat[i], wsrc[i], 16);
      } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(wat[i]), "l"(wsrc[i])
                     : "memory");
      }
    }
#pragma unroll
    for (int i = 0; i < PS; ++i) {
      if (t + i * CT >= BNB * 4) break;
      const int e = (skp[i] >> gshift) & ~1, step = e - se[i];
      se[i] = e;
      ssrc[i] += step;
      sleft[i] -= step;
      const u32 nbytes = sleft[i] >= 2 ? 4u : (sleft[i] == 1 ? 2u : 0u);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sat[i]),
                   "l"(nbytes ? ssrc[i] : any), "r"(nbytes)
                   : "memory");
    }
  }

  // Past `tiles` k-tiles (the last copied here or by the checked copy), the next stage d
  // bytes on.
  __device__ __forceinline__ void advance(u32 d, int tiles = 1) {
#pragma unroll
    for (int i = 0; i < PX; ++i) {
      xsrc[i] += tiles * BK;
      xat[i] += d;
    }
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      wsrc[i] += tiles * ROW_BYTES;
      wat[i] += d;
    }
#pragma unroll
    for (int i = 0; i < PS; ++i) {
      skp[i] += tiles * BK;
      sat[i] += d;
    }
  }
};

// A lane's reads of its fragments, one k-tile after another from stage after stage: x's
// 16 x 16 block of each k16 step as four 8 x 8 matrices (gemm_narrow.cu's order), and for each
// of its n8 tiles the packed row and the scales and biases of its column n (QuantB::load's
// layout: 4 scales at +0, 4 biases at +8 of the row's 16 bytes, from the even element at or
// before the k-tile's first group, so that group's own element is at the parity of
// n * row + group). Every place is carried from k-tile to k-tile (QnFastCopy says why); kps
// and kpb are k0 + ((n row) % 2 << gshift) for the scales and for the biases, whose top bits
// shifted down by gshift give the parity of n row + group.
template <bool F16, int BITS, int NT, int STAGES, int STAGE_BYTES>
struct QnReader {
  static constexpr int STEPS = BK / 16;
  u32 a_at[STEPS];
  u32 w_at[NT], sb_at[NT];
  int kps[NT], kpb[NT];
  bool in_n[NT];
  int sh, k0;  // sh: the lane's first value's bit in a group
  u32 sel;     // group_pair's byte selector (4 and 8 bits)
  StageStep<STAGES, STAGE_BYTES> step;  // from the stage of the next k-tile read
  DequantPair<F16, BITS> dq;

  // sb_from_w: from a stage's packed rows to its scale and bias words
  __device__ void init(u32 base, int warp, int lane, int n0, int N, const QuantOperand& W,
                       int sb_from_w, int row_bytes, int a_bytes) {
    const int ar = lane & 15, ac = lane >> 4, g = lane >> 2;
    sh = 2 * BITS * (lane & 3);
    sel = pair_select(lane);
    step = {};
    k0 = 0;
    dq = DequantPair<F16, BITS>::make(W.gshift);
#pragma unroll
    for (int s = 0; s < STEPS; ++s) a_at[s] = base + narrow_chunk(ar, 2 * s + ac);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int col = 8 * (NT * warp + j) + g, n = n0 + col;
      w_at[j] = base + a_bytes + col * row_bytes;
      sb_at[j] = base + a_bytes + sb_from_w + col * 16;
      kps[j] = static_cast<int>((static_cast<u32>(n) * static_cast<u32>(W.s_row)) & 1u)
               << W.gshift;
      kpb[j] = static_cast<int>((static_cast<u32>(n) * static_cast<u32>(W.b_row)) & 1u)
               << W.gshift;
      in_n[j] = n < N;
    }
  }

  // The next k-tile's fragments: a[s] of step s, b[j][s][h] of n8 tile j, step s, half h.
  // TAIL: the k-tile holds K's end. Branch-free, so that ptxas can interleave it with the
  // previous k-tile's MMAs.
  template <bool TAIL>
  __device__ __forceinline__ void read(const QuantOperand& W, int K, u32 (&a)[STEPS][4],
                                       u32 (&b)[NT][STEPS][2]) {
#pragma unroll
    for (int s = 0; s < STEPS; ++s) ldsm_x4(a_at[s], a[s][0], a[s][1], a[s][2], a[s][3]);
#pragma unroll
    for (int j = 0; j < NT; ++j)
      column_fragments<F16, BITS, TAIL>(w_at[j], sb_at[j], kps[j], kpb[j], in_n[j], k0, K,
                                        W.gshift, sh, sel, dq, b[j]);
    const u32 d = step.next();
#pragma unroll
    for (int s = 0; s < STEPS; ++s) a_at[s] += d;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      w_at[j] += d;
      sb_at[j] += d;
      kps[j] += BK;
      kpb[j] += BK;
    }
    k0 += BK;
  }
};

// One k-tile's MMAs of a warp's NT chains, k16 steps in order: a[s] holds x's 16 x 16 block
// of step s, b[j][s] n8 tile j's fragments of it.
template <bool F16, int NT>
__device__ __forceinline__ void qn_mma(float (&acc)[NT][4], const u32 (&a)[BK / 16][4],
                                       const u32 (&b)[NT][BK / 16][2]) {
#pragma unroll
  for (int s = 0; s < BK / 16; ++s)
#pragma unroll
    for (int j = 0; j < NT; ++j)
      mma_m16n8k16<F16>(acc[j], a[s][0], a[s][1], a[s][2], a[s][3], b[j][s][0], b[j][s][1]);
}

// The fragments read ahead (a2, b2) become the next k-tile's (a, b).
template <int NT>
__device__ __forceinline__ void qn_take(u32 (&a)[BK / 16][4], u32 (&b)[NT][BK / 16][2],
                                        const u32 (&a2)[BK / 16][4],
                                        const u32 (&b2)[NT][BK / 16][2]) {
#pragma unroll
  for (int s = 0; s < BK / 16; ++s)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[s][e] = a2[s][e];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int s = 0; s < BK / 16; ++s) {
      b[j][s][0] = b2[j][s][0];
      b[j][s][1] = b2[j][s][1];
    }
}

template <int BITS, int NT, int WARPS>
struct QmmNarrow {
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int BNB = 8 * NT * WARPS;
  static constexpr int A_BYTES = 16 * 128;
  using QB = QuantB<BITS, BNB, 1, THREADS, false>;  // only its copies (load) are used
  static constexpr int STAGE_BYTES = A_BYTES + QB::STAGE_BYTES;
};

template <int BITS, int NT, int WARPS, int STAGES>
__host__ __device__ constexpr int qmm_narrow_smem() {
  return 1024 + STAGES * QmmNarrow<BITS, NT, WARPS>::STAGE_BYTES;
}

// tile: which 16-row x BNB-column tile of out this block computes (NarrowTile).
template <bool F16, int NT, int WARPS, int STAGES, int BITS>
__device__ __forceinline__ void qmm_narrow(const Operand& X, const QuantOperand& W, u16* out,
                                           int M, int N, int K, int tile = -1) {
  using L = QmmNarrow<BITS, NT, WARPS>;
  constexpr int THREADS = L::THREADS, BNB = L::BNB, A_BYTES = L::A_BYTES;
  constexpr int STAGE_BYTES = L::STAGE_BYTES;
  constexpr int ROW_BYTES = L::QB::ROW_BYTES;
  static_assert(STAGES >= 3, "stages: the loop reads one k-tile ahead of its MMAs");
  const NarrowTile<BNB> tl(N, K, tile);
  const u32 base = tl.base;
  const int m0 = tl.m0, n0 = tl.n0, nkt = tl.nkt, lane = tl.lane, warp = tl.warp;

  TileLoader<16, THREADS> la;
  la.init(X, m0, M);
  typename L::QB lb{W};
  lb.init(n0, N, 0u);

  // The copies, one k-tile after another into stage after stage. A k-tile wholly inside K of
  // a block whose weight rows lie inside N, every operand aligned, takes QnFastCopy; otherwise,
  // and for the k-tile holding K's end, TileLoader's and QuantB::load's checked copies, which
  // write the same values.
  QnFastCopy<BITS, BNB, THREADS> fc;
  fc.init(X, m0, M, W, n0, threadIdx.x, base);
  const bool fast = la.vec && lb.vec && n0 + BNB <= N;

  CopyCursor<STAGES, STAGE_BYTES> cc(base, nkt, fast ? K / BK : 0);
  auto load_next = [&]() {
    if (cc.full_left > 0) {
      fc.issue(W.gshift, W.sc);
    } else {
      la.load(cc.at, cc.k * BK, K, true);
      lb.load(cc.at + A_BYTES, cc.k, K);
    }
    fc.advance(cc.advance());
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  QnReader<F16, BITS, NT, STAGES, STAGE_BYTES> rd;
  rd.init(base, warp, lane, n0, N, W, BNB * ROW_BYTES, ROW_BYTES, A_BYTES);
  constexpr int STEPS = BK / 16;
  // the k-tile holding K's end when it is not a whole one (its groups past K read as 0)
  const int tail_kt = K % BK ? nkt - 1 : nkt;

#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) {
    if (cc.to_copy > 0) load_next();
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  u32 a[STEPS][4], b[NT][STEPS][2];  // the fragments of k-tile kt, read one iteration ahead
  if (tail_kt == 0)
    rd.template read<true>(W, K, a, b);
  else
    rd.template read<false>(W, K, a, b);

  // Each iteration reads k-tile kt + 1's fragments into registers while it runs k-tile kt's
  // MMAs from the ones read before: the chain (k-tiles in order, k16 steps in order) is
  // unchanged, only when its operands are read moves. So k-tile kt + 1 must have landed
  // (one group fewer pending than a copy-then-compute loop), and after the barrier every
  // thread is done with the stages of kt and before, so the copy of kt + STAGES - 1 refills
  // the stage of kt - 1.
#pragma unroll 1
  for (int kt = 0; kt + 1 < nkt; ++kt) {
    cp_async_wait<STAGES - 3>();
    __syncthreads();
    if (cc.to_copy > 0) load_next();
    cp_async_commit();
    u32 a2[STEPS][4], b2[NT][STEPS][2];
    if (kt + 1 == tail_kt) {
      rd.template read<true>(W, K, a2, b2);
      qn_mma<F16, NT>(acc, a, b);
    } else {
      rd.template read<false>(W, K, a2, b2);
      qn_mma<F16, NT>(acc, a, b);
    }
    qn_take<NT>(a, b, a2, b2);
  }
  qn_mma<F16, NT>(acc, a, b);
  cp_async_wait<0>();

  narrow_store<F16, false, NT>(acc, tl, M, N, nullptr, 0, 0, out, 1.0f, 0.0f);
}

}  // namespace bih
