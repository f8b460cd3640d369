// Batch-invariant attention on Hopper tensor cores (wgmma, sm_90a), for prefill and rescoring.
//
// The algorithm is the one kernels/cuda/attention_common.cuh describes, element for element: each
// query row's keys [a, e) (after mask, causality and window) in 64-key blocks counted from its
// first valid key a, AT_SPLIT-key splits that restart the online softmax and are folded left to
// right, scores scaled and masked in fp32, exp2 on the special-function unit, row maxima and sums
// by the same fixed quad butterfly, P rounded to the half type, P V accumulated over the keys of a
// block in order, the same fold and normalisation expressions. What differs from
// kernels/cuda/attention.cu is only which tensor-core instruction multiplies: the scores (Q K^T
// over the head dim) and P V run as chains of `wgmma.m64nNk16` over the same k16 steps in the same
// order as that kernel's `mma.sync.m16n8k16` chains. tools/mma_equiv.cu checks on the device that
// the two instruction families give the same fp32 bits for the same chain; the GPU tests compare
// this kernel with the mma.sync one bit for bit.
//
// Why a row's bits cannot depend on the batch: every quantity that places a key in a block, a
// split or a fold (a, e, block and split boundaries, the k16 order) is a function of the row's
// own query index, mask row, window and keys; the 64 rows a block computes together share one
// key-block alignment per pass (rows whose first valid key differs are computed in passes of
// their own, the others masked), so which rows share a block changes which rows are masked in
// a pass, never a row's sequence of operations. Nothing depends on the batch size, left
// padding of other rows, the number of query rows computed together or the cache capacity.
//
// Layout: a block of NWG warpgroups computes 64 NWG rows, the (query i, head r) pairs of one
// (batch, kv head), 64 per warpgroup and 16 per warp in the wgmma accumulator layout: thread
// (warp w, lane l) holds rows 16 w + l / 4 and + 8, columns 8 j + 2 (l % 4) (+ 1). The
// warpgroups share the K and V stages and run the same passes over the same key blocks; which
// warpgroup computes a row changes nothing in its arithmetic. Blocks are dealt their row
// groups longest first (the order of the launch, not of any row's arithmetic). Q (64 x D per
// warpgroup), and each stage of K and V (64 keys x D), sit in shared memory as 64-column
// tiles in the 128-byte swizzle layout (kernels/cuda/hopper/common.cuh); K is read K-major
// for the scores, V MN-major (transposed) for P V, whose A operand (P) comes from registers.
// K and V stream through a STAGES-deep cp.async pipeline; the fold of finished splits lives
// in shared memory, each thread's elements its own (in registers it pushes a thread past 255
// registers).
//
// Schedule (speed only): while a block's P V and the next block's scores run on the tensor
// cores, the warpgroup computes the next block's softmax; the accumulated values are rescaled
// once both are done, and a finished split is folded in two halves around that softmax (its
// scalars before, its values after). Each element still sees the same operations in the same
// order as computing one block after another; with an array mask the next block's scores
// wait for this block's P V (the mask reads need the registers). Three stages: the block
// whose V is being read, the next one whose K is, and one loading. Blocks that end a split run
// a copy of the step with the fold compiled in, the others one without it.
// With PP (two warpgroups, no array mask) the warpgroups take turns at the tensor cores and hand
// K/V stages over by mbarriers instead of meeting at a barrier every step (see PP below).
//
// Scope: 16-bit types, head dims 64 and 128, no mask / causal / bool / additive masks, the
// window argument, keys in position order (no ring), no sinks, the whole row in one block.
// Needs common.cuh, tma.cuh, wgmma_ops.cuh, wgmma_rs.cuh and ../attention_rows.cuh before it.

namespace bih {

constexpr int AT_KB = 64;      // keys per block
// Keys per split: 512 unless a build defines BI_ATT_SPLIT (the same size as attention.cu's).
#ifndef BI_ATT_SPLIT
#define BI_ATT_SPLIT 512
#endif
constexpr int AT_SPLIT = BI_ATT_SPLIT;
constexpr float AT_LOG2E = 1.4426950408889634f;
constexpr int AT_TILE = 64 * 128;  // bytes of one 64-row x 64-column swizzled tile

// The shape, the split fold, the final normalisation and a row's key range are
// attention_rows.cuh's, shared with the mma.sync kernel; the mask element is read as 16 bits.
using bia::AttnShape;

template <bool F16>
struct AtMaskAdd {
  __device__ __forceinline__ float operator()(const void* mask, long long off) const {
    return half_to_f32<F16>(reinterpret_cast<const u16*>(mask)[off]);
  }
};

// Descriptor of an MN-major operand in the 128-byte swizzle layout: rows of 64 16-bit values
// along N (128 bytes) for consecutive k, the 16-byte chunk c of row r at c ^ (r % 8); groups of
// 8 k rows 1024 bytes apart (the stride byte offset), 64-column blocks of N `lbo` bytes apart
// (the leading byte offset). The k16 step s starts 2048 s bytes further.
__device__ __forceinline__ u64 sw128_desc_mn(u32 addr, u32 lbo) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(lbo >> 4) << 16) |
         (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}

// Element i (a constant after unrolling) of a float4.
__device__ __forceinline__ float& lane4(float4& g, int i) {
  return i == 0 ? g.x : i == 1 ? g.y : i == 2 ? g.z : g.w;
}

// Dynamic shared memory of attention_wg<D, STAGES, NWG, ...> (hopper_attention.py's
// shared_memory): 1 KiB of alignment slack, Q of each warpgroup, STAGES stages of K and of V,
// the row ranges, the fold buffer, the pass's key range, (used by the ping-pong schedule
// only) two mbarriers a stage, and (TMA only) the K and V tensor maps with 128 bytes to align
// them.
template <int D, int STAGES, int NWG, bool TMA = false>
__host__ __device__ constexpr int attention_wg_smem() {
  return 1024 + (D / 64) * AT_TILE * (NWG + 2 * STAGES) + 2 * 64 * NWG * 4 +
         (D / 2) * 128 * NWG * 4 + 16 + 16 * STAGES + (TMA ? 384 : 0);
}

// PP: the ping-pong schedule (speed only; every element's operations and their order are the
// same as without it). The two warpgroups take turns issuing their tensor-core work, so that
// one's softmax runs while the other's products do: warpgroup w issues a step's score and P V
// products after named barrier 1 + w says the other has issued its own, then lets the other
// go. They no longer meet at a block-wide barrier every step; a K/V stage is handed over by
// two mbarriers instead: `full` completes when every thread's copies into it have landed
// (cp.async arrives on it as its copies complete), `empty` when every thread has waited for
// the P V that last read it. So a warpgroup may run up to a step ahead of the other, and a
// stage is refilled only at the end of the step that reads it next to last: STAGES >= 4
// keeps the copy a whole step ahead of its scores, as three stages do in lockstep.
//
// TMA (with PP; needs tma.cuh before this file): a pass's blocks whose 64 keys all lie before
// its end are copied by one thread (TMA_ISSUER, the first of warpgroup 1, which issues second
// and so seldom waits for the other's release) through the tensor memory accelerator: the
// block's warp 4 writes the K and V tensor maps of its (batch, kv head) into its 256-byte slot
// of `maps` (128 bytes more for the kernel to align their start) before the first pass; the
// issuer waits on the stage's `empty`, announces its bytes on `full` and issues 2 D / 64 box
// copies, while every other thread arrives on `full` without waiting. A box lands in the same
// swizzled layout as the 16-byte copies. A pass's last block, if it ends before its 64th key,
// is copied by every thread as without TMA (its keys past the pass's end are zero-filled,
// which TMA would only do past the tensor's end), and so is every block of K/V rows a map
// cannot describe (tma.cuh's tma_readable false). Which path copies a block changes no byte of
// the stage.
template <bool F16, int D, int MASK, int STAGES, int NWG, bool PP = false, bool TMA = false>
__device__ void attention_wg(const u16* q, const u16* k, const u16* v, const void* mask,
                             const AttnShape& S, float scale, u16* out,
                             unsigned char* maps = nullptr) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(NWG == 1 || NWG == 2, "warpgroups");
  static_assert(STAGES >= 3, "a block's stage, the next block's, and one loading");
  static_assert(!PP || (NWG == 2 && MASK < 2 && STAGES >= 4),
                "ping-pong: two warpgroups, no array mask, a stage more than lockstep");
  static_assert(!TMA || PP, "TMA copies hand stages over by the ping-pong schedule's mbarriers");
  constexpr int TMA_ISSUER = 128;
  constexpr int NTHR = 128 * NWG;
  constexpr int ROWS = 64 * NWG;  // rows of the block
  constexpr int DC = D / 64;  // 64-column tiles per row of Q, K, V
  constexpr int CH = D / 8;   // 16-byte chunks per row
  constexpr int DT = D / 8;   // 8-column output tiles
  constexpr int KV_BYTES = DC * AT_TILE;
  constexpr int BPS = AT_SPLIT / AT_KB;
  extern __shared__ unsigned char smem_raw[];
  const u32 raw = smem_u32(smem_raw);
  const u32 base = (raw + 1023u) & ~1023u;
  const u32 sq = base, sk = sq + NWG * DC * AT_TILE, sv = sk + STAGES * KV_BYTES;
  // j0 [ROWS], jl [ROWS]
  int* rinfo = reinterpret_cast<int*>(smem_raw + (sv + STAGES * KV_BYTES - raw));
  // The running fold of finished splits in shared memory, in groups of 4 elements: elements
  // 4 g .. 4 g + 3 of thread tid (one output tile's two columns of both rows) at float4
  // [g * NTHR + tid], so that a warp reads or writes a group in one 16-byte access a thread
  // without bank conflicts (only that thread touches it).
  float4* foldbuf = reinterpret_cast<float4*>(rinfo + 2 * ROWS);
  // The pass's first key and end, found by warp 0 for the block.
  int* pass_s = reinterpret_cast<int*>(foldbuf + (D / 8) * NTHR);
  // Ping-pong only: stage s's `full` mbarrier at bars + 8 s, its `empty` at bars + 8 (STAGES + s)
  const u32 bars = smem_u32(pass_s + 4);
  // TMA only: the K map at tmaps, the V map 128 bytes further
  const u32 tmaps = (bars + 16 * STAGES + 127u) & ~127u;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const int t = lane & 3;
  const int rows_per = S.Tq * S.R;
  const int groups = (rows_per + ROWS - 1) / ROWS;
  // Longest rows first: block x takes row group groups - 1 - x / nbh of (batch, kv head)
  // x % nbh, so every (batch, kv head)'s last group (a causal prefill's longest rows) starts
  // before any earlier one and the short groups fill the tail of the launch. Only which
  // block index serves a group changes; each block computes the same rows as before.
  const int nbh = S.B * S.Hkv;
  const int grp = groups - 1 - static_cast<int>(blockIdx.x) / nbh;
  const int bh = static_cast<int>(blockIdx.x) % nbh;
  const int kvh = bh % S.Hkv, b = bh / S.Hkv;
  const int row0 = grp * ROWS;
  const float scale_log2 = __fmul_rn(scale, AT_LOG2E);
  const float NEG = bia::neg_inf();
  if constexpr (PP) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < 2 * STAGES; ++s) mbar_init(bars + 8 * s, NTHR);
      fence_mbar_init();
    }  // visible to every thread after the barrier that ends Q's copy
  }

  bia::warp_row_ranges<MASK>(S, mask, b, kvh * S.R, row0 + 16 * warp, rows_per, lane,
                             rinfo + 16 * warp, rinfo + ROWS + 16 * warp, AtMaskAdd<F16>());
  // Q: the block's rows (zeros past the last), every head-dim column, each warpgroup's 64
  // rows in tiles of their own.
  // (16-byte loads where the head dim is contiguous and every row starts 16-byte aligned)
  const bool q_vec = S.qs[3] == 1 && (S.qs[0] % 8) == 0 && (S.qs[1] % 8) == 0 &&
                     (S.qs[2] % 8) == 0 && (reinterpret_cast<unsigned long long>(q) & 15ull) == 0;
  for (int idx = tid; idx < ROWS * CH; idx += NTHR) {
    const int r = idx / CH, c = idx % CH;
    const int gr = row0 + r;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (gr < rows_per) {
      const u16* qrow = q + b * S.qs[0] + (kvh * S.R + gr % S.R) * S.qs[1] + (gr / S.R) * S.qs[2];
      if (q_vec) {
        w = *reinterpret_cast<const uint4*>(qrow + 8 * c);
      } else {
        u32 e4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = 8 * c + 2 * e;
          e4[e] = static_cast<u32>(qrow[d * S.qs[3]]) |
                  (static_cast<u32>(qrow[(d + 1) * S.qs[3]]) << 16);
        }
        w = make_uint4(e4[0], e4[1], e4[2], e4[3]);
      }
    }
    const u32 at = sq + ((r >> 6) * DC + (c >> 3)) * AT_TILE + sw128_offset(r & 63, c & 7);
    st_shared16(at, w);
  }
  fence_async_shared();
  __syncthreads();

  // This thread's two rows (accumulator rows l / 4 and l / 4 + 8 of its warp): query index
  // and head; out_row gives its output row (computed again at the end, not kept live).
  auto row_of = [&](int x, int& i, int& h) {
    const int r = row0 + 16 * warp + (lane >> 2) + 8 * x;
    i = r < rows_per ? r / S.R : 0;
    h = kvh * S.R + (r < rows_per ? r % S.R : 0);
  };
  auto out_row = [&](int x) -> u16* {
    int i, h;
    row_of(x, i, h);
    return out + ((static_cast<long long>(b) * S.Hq + h) * S.Tq + i) * D;
  };
  int rJ0[2], rJL[2];
  bool rV[2];
  long long rM[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int lr = 16 * warp + (lane >> 2) + 8 * x;
    rV[x] = row0 + lr < rows_per;
    rJ0[x] = rinfo[lr];
    rJL[x] = rinfo[ROWS + lr];
    int i, h;
    row_of(x, i, h);
    rM[x] = bia::mask_row<MASK>(S, b, h, i);
  }
  const long long mcol = bia::mask_col<MASK>(S);
  const u16* kbase = k + b * S.ks[0] + kvh * S.ks[1];
  const u16* vbase = v + b * S.vs[0] + kvh * S.vs[1];
  const bool kv_vec = S.ks[3] == 1 && S.vs[3] == 1 && (S.ks[2] % 8) == 0 && (S.vs[2] % 8) == 0 &&
                      (reinterpret_cast<unsigned long long>(kbase) & 15ull) == 0 &&
                      (reinterpret_cast<unsigned long long>(vbase) & 15ull) == 0;
  // TMA: the maps of this block's K and V rows (keys along dimension 1, their D values along
  // dimension 0), written by the issuer's warp and acquired by the issuer.
  const bool use_tma =
      TMA && tma_readable(kbase, S.ks[2], S.ks[3]) && tma_readable(vbase, S.vs[2], S.vs[3]);
  unsigned char* kmap = nullptr;
  if constexpr (TMA) {
    kmap = tmap_slot(maps);
    if (use_tma && warp == TMA_ISSUER / 32) {
      const Tmap2d km{kbase, D, static_cast<u32>(S.Tk), 2ull * S.ks[2], 64, AT_KB};
      const Tmap2d vm{vbase, D, static_cast<u32>(S.Tk), 2ull * S.vs[2], 64, AT_KB};
      tmap_pair<F16 ? TMAP_F16 : TMAP_BF16>(kmap, tmaps, km, vm);
    }
  }

  // The K/V copy: this thread's 16-byte chunks of a stage are chunk lc of rows lr0 + n RSTEP,
  // n < NLD, all at the same swizzled column (RSTEP is a multiple of the swizzle period 8).
  constexpr int RSTEP = NTHR / CH;
  constexpr int NLD = AT_KB / RSTEP;
  static_assert(NTHR % CH == 0 && RSTEP % 8 == 0 && AT_KB % RSTEP == 0, "K/V copy layout");
  const int lc = tid % CH, lr0 = tid / CH;
  const u32 loff = (lc >> 3) * AT_TILE + sw128_offset(lr0, lc & 7);

  // Lower halves of the descriptors of this warpgroup's Q and of stage 0's K and V: a stage's
  // are KV_BYTES / 16 further, a tile's AT_TILE / 16 (shared addresses stay below 2**18, so the
  // start address field never carries into the leading offset above it). The upper halves, the
  // stride byte offset and the swizzle mode, do not depend on the address: taken once from
  // each kind of descriptor, they keep the per-step descriptor arithmetic to 32-bit adds.
  constexpr u64 HI = ~0xFFFFFFFFull;
  const u64 DHI = sw128_desc(0u) & HI, DHI_MN = sw128_desc_mn(0u, AT_TILE) & HI;
  const u32 dq0 = static_cast<u32>(sw128_desc(sq + wg * DC * AT_TILE));
  const u32 dk0 = static_cast<u32>(sw128_desc(sk));
  const u32 dv0 = static_cast<u32>(sw128_desc_mn(sv, AT_TILE));
  constexpr u32 DSTAGE = KV_BYTES >> 4, DTILE = AT_TILE >> 4;
  bool done[2] = {false, false};
  u32 full_ph = 0u, empty_ph = (1u << STAGES) - 1u;  // ping-pong: parity bits a stage
  int prev = -1;
  while (true) {
    // The pass's first key a: the least first valid key above the previous pass's; its end:
    // one past the last key of any row starting there. Warp 0 finds them, each lane looking
    // at every 32nd row and the warp reducing (integers: the same whatever the order), and
    // hands them to the block through shared memory (the previous pass ended with a barrier,
    // so every thread has read the previous values). Read by every thread from one shared
    // address, as the search over all rows in every thread read them before, they leave the
    // block loop's code as it was; reduced in every warp instead, they changed ptxas's
    // register allocation, and the kernel with an additive mask at head dim 128 spilled.
    if (warp == 0) {
      int am = 0x7fffffff;
      for (int x = lane; x < ROWS; x += 32) {
        const int j = rinfo[x];
        if (j > prev && j < am) am = j;
      }
      am = bia::warp_min(am);
      int ke = 0;
      for (int x = lane; x < ROWS; x += 32)
        if (rinfo[x] == am) ke = max(ke, rinfo[ROWS + x] + 1);
      ke = bia::warp_max(ke);
      if (lane == 0) {
        pass_s[0] = am;
        pass_s[1] = ke;
      }
    }
    __syncthreads();
    const int a = pass_s[0];
    if (a == 0x7fffffff) break;
    const int kend = pass_s[1];
    prev = a;
    const bool act[2] = {rV[0] && rJ0[0] == a, rV[1] && rJ0[1] == a};
    // Ping-pong: warpgroup 0 issues first in every pass.
    if constexpr (PP) {
      if (wg == 1) named_arrive(1, NTHR);
    }
    const int nkeys = kend - a;
    const int nblk = (nkeys + AT_KB - 1) / AT_KB;
    const int nsplit = (nkeys + AT_SPLIT - 1) / AT_SPLIT;
    const bool multi = nsplit > 1;

    float m[2] = {NEG, NEG}, l[2] = {0.0f, 0.0f};
    float mt[2] = {NEG, NEG}, lt[2] = {0.0f, 0.0f};
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;

    // Logical keys [kb0, kb0 + 64) into a stage, K and V alike (64 rows of D, swizzled);
    // keys from kend on are zeros and never weigh in. This thread copies the 16-byte chunk lc
    // of rows lr0 + n RSTEP (the chunks of a 64 x D stage dealt round the block's threads).
    // On the fast path (kv_vec) this thread's first K and V chunk of the pass, and the steps
    // to its next chunk of a block; a block's chunks are AT_KB rows further.
    const long long kstep = RSTEP * S.ks[2], vstep = RSTEP * S.vs[2];
    // The blocks are loaded in order, one call each, so the pointers to the next block's
    // chunks advance by a block's rows a call.
    const u16* kpn = kbase + (a + lr0) * S.ks[2] + 8 * lc;
    const u16* vpn = vbase + (a + lr0) * S.vs[2] + 8 * lc;
    auto load_kv = [&](int stage, int blk) {
      const int jr = a + blk * AT_KB + lr0;
      const u32 dk0 = sk + stage * KV_BYTES + loff, dv0 = sv + stage * KV_BYTES + loff;
      if (kv_vec) {
        // (with an additive mask at head dim 128 the pass-long pointers would spill: there
        // they are computed for each copy)
        constexpr bool KEEP = !(MASK == 3 && D == 128);
        const u16* kp = KEEP ? kpn : kbase + jr * S.ks[2] + 8 * lc;
        const u16* vp = KEEP ? vpn : vbase + jr * S.vs[2] + 8 * lc;
        if constexpr (KEEP) {
          kpn += AT_KB * S.ks[2];
          vpn += AT_KB * S.vs[2];
        }
        if (a + (blk + 1) * AT_KB <= kend) {  // every key of the block exists
#pragma unroll
          for (int n = 0; n < NLD; ++n, kp += kstep, vp += vstep) {
            cp_async16(dk0 + n * RSTEP * 128, kp, 16u);
            cp_async16(dv0 + n * RSTEP * 128, vp, 16u);
          }
        } else {
#pragma unroll
          for (int n = 0; n < NLD; ++n, kp += kstep, vp += vstep) {
            const bool ok = jr + n * RSTEP < kend;
            cp_async16(dk0 + n * RSTEP * 128, ok ? kp : kbase, ok ? 16u : 0u);
            cp_async16(dv0 + n * RSTEP * 128, ok ? vp : vbase, ok ? 16u : 0u);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < NLD; ++n) {
          const int j = jr + n * RSTEP;
          u32 wk[4] = {0u, 0u, 0u, 0u}, wv[4] = {0u, 0u, 0u, 0u};
          if (j < kend) {
            const u16* kr = kbase + j * S.ks[2];
            const u16* vr = vbase + j * S.vs[2];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int d = 8 * lc + 2 * e;
              wk[e] = static_cast<u32>(kr[d * S.ks[3]]) |
                      (static_cast<u32>(kr[(d + 1) * S.ks[3]]) << 16);
              wv[e] = static_cast<u32>(vr[d * S.vs[3]]) |
                      (static_cast<u32>(vr[(d + 1) * S.vs[3]]) << 16);
            }
          }
          st_shared16(dk0 + n * RSTEP * 128, make_uint4(wk[0], wk[1], wk[2], wk[3]));
          st_shared16(dv0 + n * RSTEP * 128, make_uint4(wv[0], wv[1], wv[2], wv[3]));
        }
      }
    };

    // Scores of the block in stage st into sc: one chain of m64n64k16 over the head dim's k16
    // steps in order, issued and committed, not waited for.
    auto scores = [&](float (&sc)[32], int st) {
#pragma unroll
      for (int i = 0; i < 32; ++i) sc[i] = 0.0f;
      fence_regs(sc);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < DC; ++kc) {
        const u32 da = dq0 + kc * DTILE;
        const u32 db = dk0 + (st * DSTAGE + kc * DTILE);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          Wgmma<64, F16>::mma(sc, DHI | (da + 2 * ks), DHI | (db + 2 * ks));
      }
      wgmma_commit();
    };

    // The online softmax of attention.cu on the scores of the block at key kb0, on the same
    // fragment positions (sc[4 jn + e] is that kernel's s[jn][e]): leaves P (unrounded) in sc,
    // updates m and l, and gives the factor alpha that the accumulated values take before this
    // block's P V adds in.
    auto softmax = [&](float (&sc)[32], int kb0, float (&alpha)[2]) {
      float mx[2] = {NEG, NEG};
      // Every key of the block valid for both rows (no array mask): the scaled scores as they
      // are, which is what the masked form gives for valid keys.
      const bool full = MASK < 2 && act[0] && act[1] && kb0 + AT_KB - 1 <= min(rJL[0], rJL[1]);
      if (full) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          sc[i] = __fmul_rn(sc[i], scale_log2);
          mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
        }
      } else {
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = e >> 1;
            const int j = kb0 + 8 * jn + 2 * t + (e & 1);
            bool ok = act[x] && j <= rJL[x];
            float v = __fmul_rn(sc[4 * jn + e], scale_log2);
            if constexpr (MASK >= 2) {
              float add = 0.0f;
              if (ok) {
                ok = bia::mask_ok<MASK>(mask, rM[x] + j * mcol, add, AtMaskAdd<F16>());
                if constexpr (MASK == 3) v = fmaf(add, AT_LOG2E, v);
              }
            }
            sc[4 * jn + e] = ok ? v : NEG;
            mx[x] = fmaxf(mx[x], sc[4 * jn + e]);
          }
        }
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
        const float mn = fmaxf(m[x], mx[x]);
        const float mu = mn == NEG ? 0.0f : mn;
        alpha[x] = bia::ex2(__fsub_rn(m[x], mu));
        m[x] = mn;
        mx[x] = mu;
      }
      float rs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e >> 1;
          sc[4 * jn + e] = bia::ex2(__fsub_rn(sc[4 * jn + e], mx[x]));
          rs[x] = __fadd_rn(rs[x], sc[4 * jn + e]);
        }
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        rs[x] = __fadd_rn(rs[x], __shfl_xor_sync(0xffffffffu, rs[x], 1));
        rs[x] = __fadd_rn(rs[x], __shfl_xor_sync(0xffffffffu, rs[x], 2));
        l[x] = fmaf(l[x], alpha[x], rs[x]);
      }
    };
    auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[4 * dt + 0] = __fmul_rn(o[4 * dt + 0], alpha[0]);
        o[4 * dt + 1] = __fmul_rn(o[4 * dt + 1], alpha[0]);
        o[4 * dt + 2] = __fmul_rn(o[4 * dt + 2], alpha[1]);
        o[4 * dt + 3] = __fmul_rn(o[4 * dt + 3], alpha[1]);
      }
    };
    // A block's P travels from its softmax to its P V rounded to the half type and packed in
    // pairs (16 registers) as the softmax ends: the rounding P V's A operand needs anyway,
    // done earlier, so no bit can move; it frees registers and keeps a copy of 32 floats off
    // the path between one block's P V and the next one's.
    // The probabilities of a block as P V's A operand: each pair rounded to the half type.
    auto pack = [&](u32 (&pk)[16], const float (&p)[32]) {
#pragma unroll
      for (int i = 0; i < 16; ++i) pk[i] = pack_half2<F16>(p[2 * i], p[2 * i + 1]);
    };
    // P V of the block in stage st: P packed in registers (all of it written before the fence:
    // a register operand written after it makes ptxas put a fence and a wait before every
    // instruction of the chain), V's stage read transposed; one m64nDk16 per 16 keys of the
    // block, in key order. Committed, not waited for.
    auto pv = [&](const u32 (&pk)[16], int st) {
      fence_regs(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < AT_KB / 16; ++kk) {
        const u64 dv = DHI_MN | (dv0 + (st * DSTAGE + kk * (2048 >> 4)));
        WgmmaRS<D, F16>::mma(o, pk[4 * kk], pk[4 * kk + 1], pk[4 * kk + 2], pk[4 * kk + 3], dv);
      }
      wgmma_commit();
    };

    // One block, the one in stage st: its P is in cur_pk (its factor already applied to o). The
    // next block's scores (into nxt) and this block's P V run on the tensor cores while the
    // next block's softmax runs; o is touched only once both are done. The fold of a finished
    // split is done in two halves around the next softmax, which needs the split's m and l
    // reset: the scalars before it, the values after this P V is done, the same expressions in
    // the same order as folding at once. split_end: whether this block ends a split that is
    // folded. The loop below calls the step with a constant true at one call site and false at
    // the other, so it is compiled twice: the common copy carries no fold code, and ptxas keeps
    // the accumulators in place through it instead of moving half of them out and back around
    // the fold's branch (speed only: which copy runs is decided per block by the same condition
    // as before). A plain bool, not a type carrying the flag into a generic lambda: the device's
    // NVRTC took such a lambda for a host function.
    // Ping-pong hand-offs. Every thread copies part of every stage and reads all of it, so
    // each waits for every fill and releases every stage it read; the parities of the
    // phases it waits for are per-stage bits carried across passes (empty's start at 1: a
    // stage's first fill waits for nothing).
    auto full_wait = [&](int s) {
      mbar_wait(bars + 8 * s, (full_ph >> s) & 1u);
      full_ph ^= 1u << s;
      fence_async_shared();  // the copies, seen through the mbarrier, before the tensor cores
    };
    auto fill = [&](int s, int blk) {
      if (use_tma && a + (blk + 1) * AT_KB <= kend) {  // every key of the block exists
        if (tid == TMA_ISSUER) {
          mbar_wait(bars + 8 * (STAGES + s), (empty_ph >> s) & 1u);
          mbar_expect(bars + 8 * s, 2 * KV_BYTES);
          const int key = a + blk * AT_KB;
#pragma unroll
          for (int c = 0; c < DC; ++c) {
            tma_load_2d(sk + s * KV_BYTES + c * AT_TILE, kmap, 64 * c, key, bars + 8 * s);
            tma_load_2d(sv + s * KV_BYTES + c * AT_TILE, kmap + 128, 64 * c, key, bars + 8 * s);
          }
        } else {
          mbar_arrive(bars + 8 * s);  // one of the stage's arrivals, as a copying thread's
        }
        empty_ph ^= 1u << s;  // (the parity stays in step in every thread)
        // the 16-byte path's pointers move on a block a call, whoever copied it
        kpn += AT_KB * S.ks[2];
        vpn += AT_KB * S.vs[2];
        return;
      }
      mbar_wait(bars + 8 * (STAGES + s), (empty_ph >> s) & 1u);
      empty_ph ^= 1u << s;
      load_kv(s, blk);
      if (kv_vec)
        mbar_arrive_cp_async(bars + 8 * s);  // once this thread's copies have landed
      else
        mbar_arrive(bars + 8 * s);  // its ordinary stores, released
    };
    auto release = [&](int s) { mbar_arrive(bars + 8 * (STAGES + s)); };
    // This warpgroup's turn to issue (barrier 1 + wg), and the other's after it (2 - wg).
    auto take_turn = [&]() { named_sync(1 + wg, NTHR); };
    auto give_turn = [&]() { named_arrive(2 - wg, NTHR); };

    float nxt[32];
    u32 cur_pk[16];
    // With an array mask the softmax's mask reads need the registers that overlapping the
    // next block's scores would hold: there they are computed after this block's P V.
    constexpr bool OVERLAP = MASK < 2;
    auto step = [&](int blk, int st, const bool split_end) {
      if constexpr (!PP) {
        // Block blk + 1 has landed for every thread, ordered before the tensor cores' reads;
        // every thread is done with block blk - 1's stage (its MMAs were waited for), which
        // the load below overwrites with block blk + STAGES - 1.
        cp_async_wait<STAGES - 3>();
        fence_async_shared();
        __syncthreads();
      }
      const int nb = blk + STAGES - 1;  // loaded into stage (st + STAGES - 1) % STAGES
      const int st_prev = st == 0 ? STAGES - 1 : st - 1;
      const int st_next = st + 1 == STAGES ? 0 : st + 1;
      if constexpr (!PP) {
        if (nb < nblk) load_kv(st_prev, nb);
        cp_async_commit();
      }
      const bool next = blk + 1 < nblk;
      if constexpr (PP) {
        if (next) full_wait(st_next);
        take_turn();
      }
      // (after the last block too, over a stage no load is writing, so that the MMA groups
      // in flight are the same on every path; those scores are never read)
      if constexpr (OVERLAP) scores(nxt, st_next);
      pv(cur_pk, st);
      if constexpr (PP) {
        // warpgroup 1's last issue of the pass has no turn of warpgroup 0 after it
        if (wg == 0 || next) give_turn();
      }
      bool fold_on[2] = {false, false}, fold_first[2] = {false, false};
      float ca[2] = {0.0f, 0.0f}, cb[2] = {0.0f, 0.0f};
      if (split_end) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          if (m[x] == NEG) continue;
          fold_on[x] = true;
          if (mt[x] == NEG) {
            fold_first[x] = true;
            mt[x] = m[x];
            lt[x] = l[x];
          } else {
            bia::fold_scalars(mt[x], lt[x], m[x], l[x], ca[x], cb[x]);
          }
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          m[x] = NEG;
          l[x] = 0.0f;
        }
      }
      float alpha[2];
      if constexpr (OVERLAP) {
        wgmma_wait<1>();  // the next block's scores (committed before this P V)
        fence_regs(nxt);
        if (next) softmax(nxt, a + (blk + 1) * AT_KB, alpha);
      }
      wgmma_wait<0>();  // this block's P V
      fence_regs(o);
      if constexpr (PP) {
        // This thread is done with block blk's stage; the one block blk - 1 used (released by
        // both warpgroups at the end of their previous step) takes block blk + STAGES - 1.
        release(st);
        if (nb < nblk) fill(st_prev, nb);
      }
      if (split_end) {
        if (fold_on[0] && fold_on[1] && !fold_first[0] && !fold_first[1]) {
          // Both rows fold into values they already hold (every fold of a split but a row's
          // first): group dt is elements 4 dt .. 4 dt + 3, row x's two columns at 2 x, 2 x + 1.
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            float4 g = foldbuf[dt * NTHR + tid];
            g.x = bia::fold_value(g.x, o[4 * dt + 0], ca[0], cb[0]);
            g.y = bia::fold_value(g.y, o[4 * dt + 1], ca[0], cb[0]);
            g.z = bia::fold_value(g.z, o[4 * dt + 2], ca[1], cb[1]);
            g.w = bia::fold_value(g.w, o[4 * dt + 3], ca[1], cb[1]);
            foldbuf[dt * NTHR + tid] = g;
          }
        } else {
          float* fb = reinterpret_cast<float*>(foldbuf);
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            if (!fold_on[x]) continue;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
              for (int y = 0; y < 2; ++y) {
                float& f = fb[(dt * NTHR + tid) * 4 + 2 * x + y];
                const float v = o[4 * dt + 2 * x + y];
                f = fold_first[x] ? v : bia::fold_value(f, v, ca[x], cb[x]);
              }
            }
          }
        }
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
      }
      if (!OVERLAP && next) {
        scores(nxt, st_next);
        wgmma_wait<0>();
        fence_regs(nxt);
        softmax(nxt, a + (blk + 1) * AT_KB, alpha);
      }
      if (next) {
        // After a fold o is +0 and the new split's factor is ex2(-inf) = 0 (its m was reset),
        // so the rescale would leave +0: skipped there.
        if (!split_end) rescale(alpha);
        pack(cur_pk, nxt);
      }
    };

    if constexpr (PP) {
#pragma unroll
      for (int q = 0; q < STAGES - 1; ++q)
        if (q < nblk) fill(q, q);
      full_wait(0);  // block 0
      take_turn();
    } else {
#pragma unroll
      for (int q = 0; q < STAGES - 1; ++q) {
        if (q < nblk) load_kv(q, q);
        cp_async_commit();
      }
      cp_async_wait<STAGES - 2>();  // block 0 has landed
      fence_async_shared();
      __syncthreads();
    }
    {
      scores(nxt, 0);  // block 0, in stage 0
      if constexpr (PP) give_turn();  // (a step always follows)
      wgmma_wait<0>();
      fence_regs(nxt);
      float alpha[2];
      softmax(nxt, a, alpha);
      rescale(alpha);
      pack(cur_pk, nxt);
    }
    // Block blk sits in stage blk % STAGES, carried as st. A split ends after every BPS-th
    // block and after the last one; with one split there is nothing to fold.
    for (int blk = 0, st = 0; blk < nblk; ++blk, st = st + 1 == STAGES ? 0 : st + 1) {
      if (multi && (((blk + 1) % BPS) == 0 || blk + 1 == nblk))
        step(blk, st, true);
      else
        step(blk, st, false);
    }
    cp_async_wait<0>();

#pragma unroll
    for (int x = 0; x < 2; ++x) {
      if (!act[x]) continue;
      done[x] = true;
      // finalize_scalars without a sink: c = 1, l as it is.
      const float ll = multi ? lt[x] : l[x];
      u16* orow = out_row(x);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        // the group of o's elements 4 dt .. 4 dt + 3, or of the fold's, which holds them alike
        float4 g = multi ? foldbuf[dt * NTHR + tid]
                         : make_float4(o[4 * dt], o[4 * dt + 1], o[4 * dt + 2], o[4 * dt + 3]);
        const float v0 = lane4(g, 2 * x), v1 = lane4(g, 2 * x + 1);
        *reinterpret_cast<u32*>(orow + 8 * dt + 2 * t) =
            pack_half2<F16>(bia::finalize_value(v0, 1.0f, ll), bia::finalize_value(v1, 1.0f, ll));
      }
    }
    __syncthreads();
  }

  // Rows with no valid key: zero output.
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (!rV[x] || done[x]) continue;
    u16* orow = out_row(x);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) *reinterpret_cast<u32*>(orow + 8 * dt + 2 * t) = 0u;
  }
}

}  // namespace bih
