// gemm.cu's GEMM with its operands copied by the tensor memory accelerator (TMA) and a warp of
// its own issuing the copies: out[m, n] = alpha sum_k A[m, k] B[n, k] + beta C[m, n].
//
// Why row m's bits cannot depend on the batch, and why they are gemm.cu's: every output
// element is accumulated by one warpgroup, in registers, from +0, by one chain of wgmma
// m64nBNk16 instructions over k = 0..15, 16..31, ... in increasing order up to K rounded up to
// 64, both operands' k past K read as zeros, with nothing else adding into it (no split-K, no
// atomic), then gemm.cu's epilogue (store_tile / store_tile_staged, the same instructions).
// The instructions read the same shared-memory bytes as gemm.cu's, in the same 128-byte
// swizzle: a TMA box of 64 k by RT (or BN) rows lands exactly as gemm.cu's cp.async copies
// place it (the layout tools/tma_probe.cu checks on the device), rows and k past the tensor's
// end as zeros (gemm.cu leaves A's rows past M unloaded: their outputs are discarded either
// way, and no row's products reach another row's sums). What differs is only who copies and
// how the stages are handed over, and the block shape, the grid order and the pipeline depth
// are gemm.cu's; so the result is a function of (A row m, B, K) alone and equals gemm.cu's for
// every M, bit for bit.
//
// Schedule: NWG warpgroups multiply (64 rows each, RT = 64 NWG) and one more warp copies. The
// copying warp builds the A and B tensor maps (tma.cuh: MLX passes only arrays, so the maps are
// written by the block into its 256-byte slot of `maps`), then one of its threads fills the
// STAGES stages in turn: it waits on the stage's `empty` mbarrier, announces the stage's bytes
// on its `full` mbarrier and issues two box copies. The multiplying threads wait on `full`,
// issue the stage's four k16 steps, and once the stage before's products are done (wgmma
// wait 1) arrive on that stage's `empty`. So no block-wide barrier runs in the main loop and
// the multiplying threads issue no copies; the copies run up to STAGES k-tiles ahead.
//
// Operands TMA cannot read (tma.cuh's tma_readable: a k-stride other than 1, rows not a
// positive multiple of 16 bytes apart, a start not 16-byte aligned) run gemm.cu's main loop,
// on the block's 128 NWG multiplying threads (the copying warp leaves), with its loads STAGES - 1
// ahead (DEEP): the same bits, decided per launch from the operands. `maps` needs 256 bytes a
// block and 128 more (the kernel aligns its start). Needs common.cuh, wgmma_ops.cuh, tma.cuh
// and gemm.cu before it.

namespace bih {

// Dynamic shared memory of gemm_tma<.., BN, NWG, STAGES, ..>: 1 KiB of alignment slack, the
// stages (an A tile of 64 NWG rows and a B tile of BN rows, 128 bytes a row), the two maps and
// two mbarriers a stage.
template <int BN, int NWG, int STAGES>
__host__ __device__ constexpr int gemm_tma_smem() {
  return 1024 + STAGES * (64 * NWG + BN) * 128 + 256 + 16 * STAGES;
}

template <bool F16, int BN, int NWG, int STAGES, bool HAS_C, bool STAGED>
__device__ __forceinline__ void gemm_tma(const Operand& A, const Operand& B, const u16* C,
                                         long long ldc_m, long long ldc_n, u16* out, int M,
                                         int N, int K, float alpha, float beta,
                                         unsigned char* maps) {
  constexpr int RT = 64 * NWG;
  constexpr int MMA_THREADS = 128 * NWG;  // the copying warp is the block's last
  constexpr int A_BYTES = RT * 128, STAGE_BYTES = (RT + BN) * 128;
  constexpr int ELEM = F16 ? TMAP_F16 : TMAP_BF16;
  static_assert(NWG == 1 || NWG == 2, "warpgroups");
  static_assert(BN % 8 == 0 && BN <= 256 && RT <= 256, "wgmma N and TMA box sizes");
  static_assert(STAGES >= 2, "a stage multiplied while the next one loads");
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 smap = base + STAGES * STAGE_BYTES;  // A's map, B's 128 bytes further
  const u32 bars = smap + 256;  // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s)
  if (!tma_readable(A.p, A.s_row, A.s_k) || !tma_readable(B.p, B.s_row, B.s_k)) {
    if (threadIdx.x >= MMA_THREADS) return;
    DenseB<BN, 1, MMA_THREADS> bsrc{B};
    gemm_main<F16, BN, NWG, RT, 1, STAGES, HAS_C, DenseB<BN, 1, MMA_THREADS>, true, STAGED, 1>(
        A, bsrc, C, ldc_m, ldc_n, out, M, N, K, alpha, beta);
    return;
  }
  unsigned char* gmap = tmap_slot(maps);

  int m0, n0;
  tile_origin<RT, BN>(M, N, static_cast<int>(blockIdx.x), m0, n0);
  const int nkt = (K + BK - 1) / BK;
  const int tid = threadIdx.x;
  const bool copier = tid >= MMA_THREADS;

  if (copier) {
    const Tmap2d a{A.p, static_cast<u32>(K), static_cast<u32>(M), 2ull * A.s_row, BK, RT};
    const Tmap2d b{B.p, static_cast<u32>(K), static_cast<u32>(N), 2ull * B.s_row, BK, BN};
    tmap_pair<ELEM>(gmap, smap, a, b);
  }
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (STAGES + s), MMA_THREADS);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (copier) {
    if ((tid & 31) == 0) {  // (the lane that acquired the maps)
#pragma unroll 1
      for (int kt = 0, s = 0; kt < nkt; ++kt, s = s + 1 == STAGES ? 0 : s + 1) {
        // the stage's previous k-tile, kt - STAGES, multiplied (a first use waits for nothing)
        mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) & 1) ^ 1);
        const u32 sa = base + s * STAGE_BYTES;
        mbar_expect(bars + 8 * s, STAGE_BYTES);
        tma_load_2d(sa, gmap, kt * BK, m0, bars + 8 * s);
        tma_load_2d(sa + A_BYTES, gmap + 128, kt * BK, n0, bars + 8 * s);
      }
    }
    return;  // every copy it issued is waited for by the multiplying threads
  }

  const int wg = tid >> 7;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
#pragma unroll 1
  for (int kt = 0, s = 0, prev = STAGES - 1; kt < nkt;
       ++kt, prev = s, s = s + 1 == STAGES ? 0 : s + 1) {
    mbar_wait(bars + 8 * s, (kt / STAGES) & 1);  // k-tile kt has landed
    const u32 sa = base + s * STAGE_BYTES;
    const u64 da = sw128_desc(sa + wg * 64 * 128);
    const u64 db = sw128_desc(sa + A_BYTES);
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) Wgmma<BN, F16>::mma(acc, da + 2 * ks, db + 2 * ks);
    wgmma_commit();
    wgmma_wait<1>();  // k-tile kt - 1's products are done: its stage may be refilled
    fence_regs(acc);
    if (kt > 0) mbar_arrive(bars + 8 * (STAGES + prev));
  }
  wgmma_wait<0>();
  fence_regs(acc);
  if constexpr (STAGED) {
    // (the stages are free: every copy landed and was multiplied; the barrier inside waits
    // for the other warpgroup's last products)
    store_tile_staged<F16, HAS_C, BN, RT, NWG, 1>(acc, wg, C, ldc_m, ldc_n, out, m0, n0, M, N,
                                                  alpha, beta, base);
  } else {
    store_tile<F16, HAS_C, BN, RT>(acc, wg, C, ldc_m, ldc_n, out, m0, n0, M, N, alpha, beta);
  }
}

}  // namespace bih
