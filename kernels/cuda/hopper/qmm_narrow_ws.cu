// Batch-invariant quantized GEMM on Hopper for few rows (decode), warp-specialised: the chains
// of qmm_narrow.cu, with the copies and the dequantisation moved off the warps that run them.
// out[m, n] = sum_k x[m, k] w[n, k] for MLX's affine 2/3/4/5/6/8-bit weights, groups of 32, 64
// or 128 (the packing qmm.cu describes).
//
// Why an element's bits are those of qmm_narrow.cu (and so of qmm.cu), and cannot depend on
// the batch:
// - Each weight value that enters a product is qmm.cu's DequantPair of (w, scales, biases, n,
//   k), 0 for k at or past K and for columns past N: a helper lane computes, with
//   qmm_narrow.cu's column_fragments (what its QnReader runs), the very fragment words the
//   consuming lane would have computed there. Which lane makes a value,
//   and when, changes nothing.
// - Each output element is accumulated by one consumer warp, in registers, from +0, by one
//   chain of mma.sync m16n8k16 over the k16 steps of K (rounded up to 64, the missing k zero in
//   both operands) in increasing order, with the A fragments read by ldmatrix from the same
//   tile layout and the B fragments holding the same values in the same slots: the chain of
//   qmm_narrow.cu, whose equality with qmm.cu's wgmma chain that file explains.
// - Nothing else adds into an element (no split-K, no atomics); the epilogue is narrow_store
//   with alpha 1 and no C, as qmm_narrow.cu's. Rows that share a block (16 a block; rows past
//   M are not loaded and their outputs discarded), the columns a warp computes, how many
//   helpers there are and the pipeline depths decide only which elements are computed
//   together and when.
//
// Why it exists: in qmm_narrow.cu the warp that runs a chain also copies and dequantises its
// k-tiles, about 173 instructions a k-tile of which 4 are MMAs, and at decode sizes a
// multiprocessor holds one or two such warps, so a k-tile takes the time of that instruction
// stream. Here HW helper warps (on the multiprocessor's other schedulers) copy and dequantise;
// a consumer warp's k-tile is a wait, x's fragments by ldmatrix, its weight fragments by two
// 16-byte loads per n8 tile, and its MMAs.
//
// Layout: warps 0 .. CW - 1 are consumers, each running NT chains of 8 columns (BNB = 8 NT CW
// columns a block, 16 rows); warps CW .. CW + HW - 1 are helpers, helper h taking the k-tiles
// h, h + HW, h + 2 HW, ... in turn, so that each does one k-tile in HW and their instruction
// streams run side by side on the multiprocessor's schedulers. STAGES raw stages (k-tile kt in
// stage kt % STAGES, so each helper has its own), each x's 16 x 64 k-tile then the block's
// packed weight rows with their scales and biases (qmm_narrow.cu's stage layout), filled by
// the helper's cp.async (STAGES - DQS) / HW of its turns ahead; DQS slots of dequantised
// fragments (k-tile kt in slot kt % DQS), n8 tile j's half h (k16 steps 2 h and 2 h + 1) for
// lane l at j 1024 + h 512 + l 16 (four words: b0, b1 of the first step, then of the
// second), so that helpers store and consumers load 16 bytes a lane without bank conflicts.
// A slot is handed over by two mbarriers: `full` (the 32 lanes of its helper arrive once they
// have stored its fragments) and `empty` (every consumer thread arrives once it has read them
// and x's fragments from the k-tile's raw stage). A helper refills the raw stage of k-tile
// kt - DQS (its own) with k-tile kt + STAGES - DQS only after `empty` says the consumers are
// done with kt - DQS, and reads a raw stage after waiting for its lanes' copies and a
// __syncwarp.
//
// Needs common.cuh, gemm.cu, qmm.cu, gemm_narrow.cu and qmm_narrow.cu before it.

namespace bih {

// One warp's checked copy of x's 16 x 64 k-tile at k0 into `tile` (gemm.cu's TileLoader
// layout and values): rows past M left unwritten (their outputs are discarded), k at or past K
// zero, a chunk wholly inside K of a 16-byte aligned x by one cp.async, any other element by
// element.
__device__ __forceinline__ void ws_load_x(const Operand& X, int m0, int M, u32 tile, int k0,
                                          int K, int lane) {
  const bool vec = X.vec();
#pragma unroll 1
  for (int c = lane; c < 16 * 8; c += 32) {
    const int r = c >> 3, cc = c & 7, m = m0 + r, k = k0 + 8 * cc;
    if (m >= M) continue;
    const u16* src = X.p + static_cast<long long>(m) * X.s_row + static_cast<long long>(k) * X.s_k;
    const u32 dst = tile + narrow_chunk(r, cc);
    if (vec && k + 8 <= K) {
      cp_async16(dst, src, 16);
      continue;
    }
    u32 v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const u32 lo = k + 2 * e < K ? src[2 * e * X.s_k] : 0u;
      const u32 hi = k + 2 * e + 1 < K ? src[(2 * e + 1) * X.s_k] : 0u;
      v[e] = lo | (hi << 16);
    }
    st_shared16(dst, make_uint4(v[0], v[1], v[2], v[3]));
  }
}

// A helper lane's dequantisation of its warp's k-tiles (every HW-th one): for each of the
// block's TILES n8 tiles, the fragments of the consumer lane of the same index, written to the
// k-tile's slot. Every place is carried from one of the warp's k-tiles to its next (QnFastCopy
// says why); kps and kpb as qmm_narrow.cu's QnReader's.
template <bool F16, int BITS, int TILES, int HW, int STAGES, int STAGE_BYTES, int DQS,
          int SLOT_BYTES>
struct WsDequant {
  u32 w_at[TILES], sb_at[TILES], o_at;
  int kps[TILES], kpb[TILES];
  bool in_n[TILES];
  int sh, k0;
  u32 sel;
  StageStep<STAGES / HW, HW * STAGE_BYTES> raw;
  StageStep<DQS / HW, HW * SLOT_BYTES> slot;
  DequantPair<F16, BITS> dq;

  // stage, slots: the warp's first k-tile's raw stage and slot
  __device__ void init(u32 stage, u32 slots, int kt0, int lane, int n0, int N,
                       const QuantOperand& W, int sb_from_w, int row_bytes, int a_bytes) {
    const int g = lane >> 2;
    sh = 2 * BITS * (lane & 3);
    sel = pair_select(lane);
    raw = {};
    slot = {};
    k0 = kt0 * BK;
    dq = DequantPair<F16, BITS>::make(W.gshift);
    o_at = slots + lane * 16;
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const int col = 8 * j + g, n = n0 + col;
      w_at[j] = stage + a_bytes + col * row_bytes;
      sb_at[j] = stage + a_bytes + sb_from_w + col * 16;
      kps[j] = (static_cast<int>((static_cast<u32>(n) * static_cast<u32>(W.s_row)) & 1u)
                << W.gshift) + k0;
      kpb[j] = (static_cast<int>((static_cast<u32>(n) * static_cast<u32>(W.b_row)) & 1u)
                << W.gshift) + k0;
      in_n[j] = n < N;
    }
  }

  // The warp's next k-tile from its raw stage into its slot. TAIL: the k-tile holds K's end.
  template <bool TAIL>
  __device__ __forceinline__ void run(const QuantOperand& W, int K) {
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      u32 b[BK / 16][2];
      column_fragments<F16, BITS, TAIL>(w_at[j], sb_at[j], kps[j], kpb[j], in_n[j], k0, K,
                                        W.gshift, sh, sel, dq, b);
      st_shared16(o_at + j * 1024, make_uint4(b[0][0], b[0][1], b[1][0], b[1][1]));
      st_shared16(o_at + j * 1024 + 512, make_uint4(b[2][0], b[2][1], b[3][0], b[3][1]));
    }
    const u32 d = raw.next();
    o_at += slot.next();
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      w_at[j] += d;
      sb_at[j] += d;
      kps[j] += HW * BK;
      kpb[j] += HW * BK;
    }
    k0 += HW * BK;
  }
};

template <int BITS, int NT, int CW, int HW, int STAGES, int DQS>
struct QmmNarrowWs {
  static constexpr int BNB = 8 * NT * CW, TILES = NT * CW;
  static constexpr int A_BYTES = 16 * 128;
  using QB = QuantB<BITS, BNB, 1, 32, false>;  // one warp's copies (load)
  static constexpr int STAGE_BYTES = A_BYTES + QB::STAGE_BYTES;
  static constexpr int SLOT_BYTES = BNB * 128;  // TILES n8 tiles x 32 lanes x 32 bytes
  static_assert(STAGES % HW == 0 && DQS % HW == 0, "stages and slots: HW helpers' turns");
  // a helper copies its k-tiles (STAGES - DQS) / HW turns ahead of the one it dequantises
  static_assert(STAGES - DQS >= HW, "stages: copies at least one turn ahead of the slots");
};

template <int BITS, int NT, int CW, int HW, int STAGES, int DQS>
__host__ __device__ constexpr int qmm_narrow_ws_smem() {
  using L = QmmNarrowWs<BITS, NT, CW, HW, STAGES, DQS>;
  return 1024 + STAGES * L::STAGE_BYTES + DQS * L::SLOT_BYTES + 16 * DQS;
}

// tile: which 16-row x BNB-column tile of out this block computes (NarrowTile).
template <bool F16, int NT, int CW, int HW, int STAGES, int DQS, int BITS>
__device__ __forceinline__ void qmm_narrow_ws(const Operand& X, const QuantOperand& W, u16* out,
                                              int M, int N, int K, int tile = -1) {
  using L = QmmNarrowWs<BITS, NT, CW, HW, STAGES, DQS>;
  constexpr int BNB = L::BNB, A_BYTES = L::A_BYTES;
  constexpr int STAGE_BYTES = L::STAGE_BYTES, SLOT_BYTES = L::SLOT_BYTES;
  constexpr int ROW_BYTES = L::QB::ROW_BYTES;
  constexpr int STEPS = BK / 16;
  const NarrowTile<BNB> tl(N, K, tile);
  const u32 base = tl.base, slots = base + STAGES * STAGE_BYTES;
  const u32 full = slots + DQS * SLOT_BYTES, empty = full + 8 * DQS;
  const int nkt = tl.nkt, lane = tl.lane, warp = tl.warp;
  // the k-tile holding K's end when it is not a whole one (its groups past K read as 0)
  const int tail_kt = K % BK ? nkt - 1 : nkt;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int d = 0; d < DQS; ++d) {
      mbar_init(full + 8 * d, 32);
      mbar_init(empty + 8 * d, 32 * CW);
    }
  }
  __syncthreads();

  if (warp >= CW) {
    // Helper h takes k-tiles h, h + HW, h + 2 HW, ...: their copies (its own stages, those of
    // index h modulo HW), then their fragments into their slots (of index h modulo HW).
    constexpr int TURNS = (STAGES - DQS) / HW;  // own k-tiles copied ahead
    const int h = warp - CW;
    QnFastCopy<BITS, BNB, 32> fc;
    fc.init(X, tl.m0, M, W, tl.n0, lane, base + h * STAGE_BYTES);
    fc.advance(0u, h);  // to k-tile h, in the same stage
    typename L::QB lb{W};
    lb.init(tl.n0, N, 0u);
    const bool fast = X.vec() && lb.vec && tl.n0 + BNB <= N;
    const int mine = h < nkt ? (nkt - h + HW - 1) / HW : 0;  // own k-tiles
    const int whole = K / BK;  // k-tiles wholly inside K
    CopyCursor<STAGES / HW, HW * STAGE_BYTES, HW> cc(
        base + h * STAGE_BYTES, h, mine, fast && h < whole ? (whole - h + HW - 1) / HW : 0);
    auto load_next = [&]() {
      if (cc.full_left > 0) {
        fc.issue(W.gshift, W.sc);
      } else {
        ws_load_x(X, tl.m0, M, cc.at, cc.k * BK, K, lane);
        lb.load(cc.at + A_BYTES, cc.k, K, lane);
      }
      fc.advance(cc.advance(), HW);
    };
    WsDequant<F16, BITS, L::TILES, HW, STAGES, STAGE_BYTES, DQS, SLOT_BYTES> dqr;
    dqr.init(base + h * STAGE_BYTES, slots + h * SLOT_BYTES, h, lane, tl.n0, N, W,
             BNB * ROW_BYTES, ROW_BYTES, A_BYTES);

#pragma unroll 1
    for (int s = 0; s < TURNS; ++s) {
      if (cc.to_copy > 0) load_next();
      cp_async_commit();
    }
    int d = h;
#pragma unroll 1
    for (int kt = h; kt < nkt; kt += HW) {
      // the consumers are done with k-tile kt - DQS: its slot, and its raw stage, which the
      // copy of k-tile kt + STAGES - DQS refills
      if (kt >= DQS) mbar_wait(empty + 8 * d, ((kt / DQS) & 1) ^ 1);
      if (cc.to_copy > 0) load_next();
      cp_async_commit();
      cp_async_wait<TURNS>();  // k-tile kt has landed, for this lane's copies
      __syncwarp();            // and for the warp's
      if (kt == tail_kt)
        dqr.template run<true>(W, K);
      else
        dqr.template run<false>(W, K);
      mbar_arrive(full + 8 * d);
      d += HW;
      if (d >= DQS) d -= DQS;
    }
    cp_async_wait<0>();
    return;
  }

  // Consumers: each k-tile's fragments, read one k-tile ahead of its MMAs (as qmm_narrow.cu).
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
  const int ar = lane & 15, ac = lane >> 4;
  u32 a_at[STEPS], b_at = slots + NT * warp * 1024 + lane * 16;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) a_at[s] = base + narrow_chunk(ar, 2 * s + ac);
  StageStep<STAGES, STAGE_BYTES> raw;
  StageStep<DQS, SLOT_BYTES> slot;
  int d = 0;
  u32 phase = 0;
  auto read = [&](u32 (&a)[STEPS][4], u32 (&b)[NT][STEPS][2]) {
    mbar_wait(full + 8 * d, phase);
#pragma unroll
    for (int s = 0; s < STEPS; ++s) ldsm_x4(a_at[s], a[s][0], a[s][1], a[s][2], a[s][3]);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(b[j][2 * h][0]), "=r"(b[j][2 * h][1]), "=r"(b[j][2 * h + 1][0]),
                       "=r"(b[j][2 * h + 1][1])
                     : "r"(b_at + j * 1024 + h * 512));
    mbar_arrive(empty + 8 * d);
    if (++d == DQS) {
      d = 0;
      phase ^= 1u;
    }
    const u32 r = raw.next();
#pragma unroll
    for (int s = 0; s < STEPS; ++s) a_at[s] += r;
    b_at += slot.next();
  };

  u32 a[STEPS][4], b[NT][STEPS][2];
  read(a, b);
#pragma unroll 1
  for (int kt = 0; kt + 1 < nkt; ++kt) {
    u32 a2[STEPS][4], b2[NT][STEPS][2];
    read(a2, b2);
    qn_mma<F16, NT>(acc, a, b);
    qn_take<NT>(a, b, a2, b2);
  }
  qn_mma<F16, NT>(acc, a, b);

  narrow_store<F16, false, NT>(acc, tl, M, N, nullptr, 0, 0, out, 1.0f, 0.0f);
}

}  // namespace bih
