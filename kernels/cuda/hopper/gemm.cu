// Batch-invariant GEMM on Hopper tensor cores (sm_90a): out[m, n] = alpha sum_k A[m, k] B[n, k]
// + beta C[m, n], A (M, K) and B (N, K) row-major 16-bit floats, fp32 accumulation.
//
// Why row m's bits cannot depend on the batch: every output element is accumulated by exactly
// one warpgroup, in registers, starting from +0, by one chain of wgmma m64nNk16 instructions
// over k = 0..15, 16..31, ... in increasing order up to K rounded up to 64 (the missing k are
// zero-filled in both operands). Nothing else ever adds into it: there is no split-K and no
// atomic. The block shape (BM = 64 NWG rows, BN columns), the pipeline depth and the grid order
// decide only which elements are computed together and when, never the sequence of
// floating-point operations of one element, and the k16 product-sum of the instruction is the
// same for every N width (the GPU tests compare every configuration the dispatcher can pick,
// bit for bit). The epilogue is round(fma(beta, c, alpha * acc)), in fp32, rounded once, by the
// same instructions whether a tile is written straight from the registers (store_tile) or
// through shared memory (store_tile_staged, for whole tiles only: which path a tile takes
// depends on M, what it writes does not). So the result is a function of (A row m, B, K)
// alone: decode (M = 1), prefill and rescoring (M in the thousands) give the same bits for the
// same row.
//
// Pipeline: STAGES shared-memory stages of KT 64-wide k-tiles (A: RT x 64, B: BN x 64, in the
// 128-byte swizzle layout the tensor cores read), filled by cp.async from all threads
// STAGES - 2 stages ahead (DEEP: STAGES - 1, for a second barrier a stage); each warpgroup
// keeps one stage of wgmma in flight while the next stages load. Rows of A past M are never
// loaded (their outputs are discarded), so a one-row decode step reads only its own row.
//
// Template parameters: F16 (else bf16), BN, NWG (warpgroups), RT (rows per block: 64 NWG, or
// 8/16/32 with one warpgroup), KT, STAGES, HAS_C, DEEP (dense B only), STAGED (the epilogue
// through shared memory, store_tile_staged).
// Operands are read through their strides; the fast loader needs unit k-stride, rows 16-byte
// aligned, and falls back to element loads otherwise (same values, same bits). Needs
// common.cuh and wgmma_ops.cuh before it.

namespace bih {

constexpr int BK = 64;      // k per pipeline stage: one 128-byte swizzled row per operand row
constexpr int GROUP_M = 8;  // tiles of M visited together, for L2 reuse of B

// An operand in (row, k) terms: element (r, k) at p[r * s_row + k * s_k].
struct Operand {
  const u16* p;
  long long s_row, s_k;
  int rows;
  __device__ bool vec() const {
    return s_k == 1 && (s_row % 8) == 0 && (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
  }
};

// An operand from a kernel argument of any 16-bit element type (MLX passes __nv_bfloat16*).
__device__ __forceinline__ Operand operand(const void* p, long long s_row, long long s_k,
                                           int rows) {
  return Operand{static_cast<const u16*>(p), s_row, s_k, rows};
}

// Copies one operand tile (ROWS x 64 k) into shared memory, in the swizzled layout. A thread
// always handles the same 16-byte chunk column c = tid % 8 of rows tid / 8 + i * THREADS / 8,
// so its global address advances by a fixed step per row and its swizzled chunk position
// (which depends on the row only through row % 8, constant here) never changes: the per-tile
// cost is one add per chunk. Rows at or past `rows` are skipped when skip_tail (their outputs
// are discarded) and zero-filled otherwise; k at or past K is zero-filled.
template <int ROWS, int THREADS>
struct TileLoader {
  static constexpr int STEP = THREADS / 8;  // rows between one thread's chunks
  // The swizzle position computed from a thread's first row holds for its other rows only if
  // they are a multiple of 8 rows apart: with 32 threads (STEP 4) rows r and r + 4 would share
  // a chunk position and the tile would be read back permuted.
  static_assert(STEP % 8 == 0, "TileLoader needs a multiple of 64 threads");
  static constexpr int PER_THREAD = (ROWS + STEP - 1) / STEP;
  const u16* src;     // this thread's first chunk at k = 0
  long long stride;   // elements between this thread's consecutive chunks
  long long s_k;      // elements between consecutive k (1 on the fast path)
  u32 dst;            // byte offset of the first chunk inside a tile
  int count;          // chunks of the tile this thread owns
  int valid;          // of those, the ones on rows inside the matrix
  int c8;             // the first k of this thread's chunk column
  bool vec;

  // tid: this thread's index among the THREADS that share the tile (default: the block's).
  __device__ void init(const Operand& op, int row0, int rows, unsigned tid = threadIdx.x) {
    const int r = tid >> 3, c = tid & 7;
    c8 = 8 * c;
    s_k = op.s_k;
    src = op.p + static_cast<long long>(row0 + r) * op.s_row + c8 * op.s_k;
    stride = static_cast<long long>(STEP) * op.s_row;
    dst = static_cast<u32>(r * 128 + ((c ^ (r & 7)) << 4));
    count = r >= ROWS ? 0 : min(PER_THREAD, (ROWS - r + STEP - 1) / STEP);
    const int left = rows - row0 - r;  // rows from this thread's first row to the matrix end
    valid = left <= 0 ? 0 : min(count, (left + STEP - 1) / STEP);
    vec = op.vec();
  }

  // An interior tile's copy, no checks: the first n of this thread's chunks, from p (this
  // thread's first chunk of the tile: src + k0 on the fast path), one cp.async each.
  __device__ __forceinline__ void load_interior(u32 tile, const u16* p, int n) const {
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i, p += stride)
      if (i < n) cp_async16(tile + dst + i * STEP * 128, p, 16);
  }

  __device__ __forceinline__ void load(u32 tile, int k0, int K, bool skip_tail) const {
    if (!vec) return load_slow(tile, k0, K, skip_tail);
    const u16* p = src + k0;
    if (valid == PER_THREAD && k0 + BK <= K) return load_interior(tile, p, PER_THREAD);
    const bool in_k = k0 + c8 < K;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i, p += stride) {
      if (i >= count) break;
      const u32 at = tile + dst + i * STEP * 128;
      if (i < valid) {
        cp_async16(at, in_k ? p : src, in_k ? 16u : 0u);
      } else if (!skip_tail) {
        cp_async16(at, src, 0);
      }
    }
  }

  // The same values, read one element at a time (a misaligned operand or K % 8 != 0): rare,
  // so kept compact rather than unrolled.
  __device__ __forceinline__ void load_slow(u32 tile, int k0, int K, bool skip_tail) const {
#pragma unroll 1
    for (int i = 0; i < count; ++i) {
      if (i >= valid && skip_tail) continue;
      const u16* p = src + i * stride + k0 * s_k;
      u32 w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = k0 + c8 + 2 * j;
        const u32 lo = i < valid && k < K ? p[2 * j * s_k] : 0u;
        const u32 hi = i < valid && k + 1 < K ? p[(2 * j + 1) * s_k] : 0u;
        w[j] = lo | (hi << 16);
      }
      st_shared16(tile + dst + i * STEP * 128, make_uint4(w[0], w[1], w[2], w[3]));
    }
  }
};

// The dense B operand: the BN x 64 tile of each k-tile is copied straight into the stage.
template <int BN, int KT, int THREADS>
struct DenseB {
  static constexpr bool DEQUANT = false;
  static constexpr int STAGE_BYTES = KT * BN * BK * 2;
  static constexpr int EXTRA_BYTES = 0;
  Operand op;
  TileLoader<BN, THREADS> loader;
  __device__ void init(int n0, int N, u32) { loader.init(op, n0, N); }
  __device__ __forceinline__ void load(u32 stage_b, int kt0, int K) {
#pragma unroll
    for (int j = 0; j < KT; ++j) loader.load(stage_b + j * BN * BK * 2, (kt0 + j) * BK, K, false);
  }
  // The swizzled B tiles (KT of them, BN * 128 bytes apart) the tensor cores read for a stage.
  __device__ __forceinline__ u32 tiles(u32 stage_b, int) const { return stage_b; }
  __device__ __forceinline__ void prepare(u32, int, int, int) {}
};

// The epilogue every GEMM kernel here shares, for the elements (m, n) and (m, n + 1) of out
// (the second only where n + 1 < N): round(fma(beta, c, alpha * acc)) in fp32, rounded once;
// pairs (N even) stores both as one 32-bit word.
template <bool F16, bool HAS_C>
__device__ __forceinline__ void store_pair(float a0, float a1, const u16* C, long long ldc_m,
                                           long long ldc_n, u16* out, int m, int n, int N,
                                           float alpha, float beta, bool pairs) {
  float v0 = __fmul_rn(alpha, a0);
  float v1 = __fmul_rn(alpha, a1);
  if constexpr (HAS_C) {
    const u16* cr = C + m * ldc_m + n * ldc_n;
    v0 = fmaf(beta, half_to_f32<F16>(cr[0]), v0);
    if (n + 1 < N) v1 = fmaf(beta, half_to_f32<F16>(cr[ldc_n]), v1);
  }
  u16* row = out + static_cast<long long>(m) * N;
  if (pairs) {
    *reinterpret_cast<u32*>(row + n) = pack_half2<F16>(v0, v1);
  } else {
    row[n] = to_half<F16>(v0);
    if (n + 1 < N) row[n + 1] = to_half<F16>(v1);
  }
}

// The origin (m0, n0) of the RT x BN tile of out with index pid: tiles are visited GROUP_M rows
// of tiles at a time, column by column, so that the blocks running together share B's columns.
template <int RT, int BN>
__device__ __forceinline__ void tile_origin(int M, int N, int pid, int& m0, int& n0) {
  const int tiles_m = (M + RT - 1) / RT, tiles_n = (N + BN - 1) / BN;
  const int in_group = GROUP_M * tiles_n;
  const int first_m = (pid / in_group) * GROUP_M;
  const int group_rows = min(tiles_m - first_m, GROUP_M);
  m0 = (first_m + (pid % in_group) % group_rows) * RT;
  n0 = ((pid % in_group) / group_rows) * BN;
}

// Stores warpgroup wg's accumulators of the tile at (m0, n0) through store_pair.
//
// Accumulator fragment of thread (warp w of the warpgroup, lane l): for each 8-column group
// j, acc[4j + e] is row 16 w + l / 4 (+ 8 for e >= 2), column 8 j + 2 (l % 4) + (e & 1).
// Rows at or past RT of a one-warpgroup block are the discarded ones.
template <bool F16, bool HAS_C, int BN, int RT>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], int wg, const u16* C,
                                           long long ldc_m, long long ldc_n, u16* out, int m0,
                                           int n0, int M, int N, float alpha, float beta) {
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int r_a = wg * 64 + warp * 16 + (lane >> 2);
  const bool pairs = (N % 2) == 0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int n = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_a + 8 * h, m = m0 + r;
      if (r >= RT || m >= M || n >= N) continue;
      store_pair<F16, HAS_C>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], C, ldc_m, ldc_n, out,
                             m, n, N, alpha, beta, pairs);
    }
  }
}

// The block barrier of the GEMM main loop and staged epilogue: BAR 0 is __syncthreads, any other
// the named barrier BAR of the COUNT threads that run them (gemm_tma.cu's blocks hold a warp
// more, which does not).
template <int BAR, int COUNT>
__device__ __forceinline__ void block_sync() {
  if constexpr (BAR == 0)
    __syncthreads();
  else
    named_sync(BAR, COUNT);
}

// store_tile through shared memory, for a block of 64 rows a warpgroup (RT = 64 NWG): each
// thread computes its values with store_pair's arithmetic (alpha * acc, then fma with beta c,
// rounded once, packed as a pair), writes them into the pipeline's stages, free once every
// warpgroup's MMAs are done, as the tile's rows, and the warpgroup then copies its 64 rows out
// 16 bytes a thread, each warp a whole row per instruction, instead of the 8 scattered 16-byte
// pieces a warp writes per instruction from the accumulator layout. The values, and so the
// bits, are store_tile's. Only where the whole tile lies inside out and its rows are 16-byte
// aligned (N % 8 == 0): every other tile goes through store_tile. All threads of the block
// must call it (it holds block barriers); the condition is the same for all of them. BAR:
// 0 for __syncthreads, else the named barrier of the block's 128 NWG threads that hold the
// tile, where the block has others (gemm_tma.cu's copying warp).
template <bool F16, bool HAS_C, int BN, int RT, int NWG, int BAR = 0>
__device__ __forceinline__ void store_tile_staged(const float (&acc)[BN / 2], int wg,
                                                  const u16* C, long long ldc_m, long long ldc_n,
                                                  u16* out, int m0, int n0, int M, int N,
                                                  float alpha, float beta, u32 smem) {
  static_assert(RT == 64 * NWG, "a staged tile has 64 rows a warpgroup");
  // A staged row takes 16 bytes more than its values, so that the 8 rows a warp writes at
  // once start 4 banks apart and the 32 lanes hit 32 different banks.
  constexpr int ROW = BN * 2 + 16;
  const bool whole = m0 + RT <= M && n0 + BN <= N && N % 8 == 0 &&
                     (reinterpret_cast<unsigned long long>(out) & 15ull) == 0;
  if (!whole) {
    store_tile<F16, HAS_C, BN, RT>(acc, wg, C, ldc_m, ldc_n, out, m0, n0, M, N, alpha, beta);
    return;
  }
  // every warpgroup's MMAs, the last readers of the stages, are done
  block_sync<BAR, 128 * NWG>();
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
  const int r_a = wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int n = 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r_a + 8 * h;
      float v0 = __fmul_rn(alpha, acc[4 * j + 2 * h]);
      float v1 = __fmul_rn(alpha, acc[4 * j + 2 * h + 1]);
      if constexpr (HAS_C) {
        const u16* cr = C + (m0 + r) * ldc_m + (n0 + n) * ldc_n;
        v0 = fmaf(beta, half_to_f32<F16>(cr[0]), v0);
        v1 = fmaf(beta, half_to_f32<F16>(cr[ldc_n]), v1);
      }
      st_shared4(smem + r * ROW + n * 2, pack_half2<F16>(v0, v1));
    }
  }
  block_sync<BAR, 128 * NWG>();
  // The warpgroup's 128 threads cover PASS rows at a time, thread t the 16-byte piece t % CHUNKS
  // of row t / CHUNKS, then the rows PASS further down.
  constexpr int CHUNKS = BN / 8, PASS = 128 / CHUNKS;
  static_assert(128 % CHUNKS == 0, "a pass covers whole rows");
  const int t = threadIdx.x & 127, r0 = wg * 64 + t / CHUNKS, c = t % CHUNKS;
  u32 src = smem + r0 * ROW + c * 16;
  u16* dst = out + static_cast<long long>(m0 + r0) * N + n0 + c * 8;
#pragma unroll 4
  for (int p = 0; p < 64 / PASS; ++p) {
    *reinterpret_cast<uint4*>(dst) = ld_shared16(src);
    src += PASS * ROW;
    dst += static_cast<long long>(PASS) * N;
  }
}

// The main loop, for any B source (DenseB here, the dequantising source of qmm.cu).
//
// A block computes RT rows (64 per warpgroup when NWG = 2; 8, 16, 32 or 64 with one
// warpgroup) by BN columns. A stage holds KT consecutive k-tiles of 64. With RT < 64 only RT
// rows of A are stored per k-tile: the warpgroup's m64 instruction then reads its other rows
// from whatever follows in shared memory, and those rows' results are discarded, so a decode
// step (M = 1) stores and loads only its own row. Stages are STAGES - 2 ahead; a B source that
// dequantises (DEQUANT) turns stage s + 1 into tensor-core tiles while the MMAs of stage s run,
// in three rotating buffers (the one written was last read two stages ago).
//
// out (M, N) is row-major; C, when HAS_C, is read at C[m * ldc_m + n * ldc_n] (a bias row has
// ldc_m = 0). tile: which tile of out this block computes (its index in the order below);
// default the block's index (a grouped entry, one launch over several weights, passes the
// tile within the weight its block serves). BAR: the block barrier, 0 for __syncthreads, else
// the named barrier of the 128 NWG threads that run this (gemm_tma.cu's blocks hold a warp
// more, which leaves before).
template <bool F16, int BN, int NWG, int RT, int KT, int STAGES, bool HAS_C, class BSrc,
          bool DEEP = false, bool STAGED = false, int BAR = 0>
__device__ __forceinline__ void gemm_main(const Operand& A, BSrc& bsrc, const u16* C,
                                          long long ldc_m, long long ldc_n, u16* out, int M,
                                          int N, int K, float alpha, float beta,
                                          int tile = -1) {
  constexpr int THREADS = 128 * NWG;
  constexpr int A_TILE = RT * BK * 2;
  constexpr int STAGE_BYTES = KT * A_TILE + BSrc::STAGE_BYTES;
  constexpr int AHEAD = DEEP ? STAGES - 1 : STAGES - 2;
  static_assert(!(DEEP && BSrc::DEQUANT), "a deep pipeline reads dense B only");
  static_assert(NWG == 1 ? (RT == 8 || RT == 16 || RT == 32 || RT == 64) : RT == 64 * NWG,
                "row tile");
  static_assert(AHEAD >= (BSrc::DEQUANT ? 2 : 1), "stages in flight");
  static_assert(BN % 8 == 0 && BN <= 256, "wgmma N");
  static_assert(STAGE_BYTES % 1024 == 0, "stages keep the 1024-byte swizzle alignment");
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 extra = base + STAGES * STAGE_BYTES;

  int m0, n0;
  tile_origin<RT, BN>(M, N, tile < 0 ? static_cast<int>(blockIdx.x) : tile, m0, n0);

  const int nkt = (K + BK - 1) / BK;
  const int nst = (nkt + KT - 1) / KT;  // stages of KT k-tiles
  const int wg = threadIdx.x >> 7;

  TileLoader<RT, THREADS> la;
  la.init(A, m0, M);
  bsrc.init(n0, N, extra);
  auto load_stage = [&](int st) {
    const u32 sa = base + (st % STAGES) * STAGE_BYTES;
#pragma unroll
    for (int j = 0; j < KT; ++j) la.load(sa + j * A_TILE, (st * KT + j) * BK, K, true);
    bsrc.load(sa + KT * A_TILE, st * KT, K);
  };
  auto b_stage = [&](int st) { return base + (st % STAGES) * STAGE_BYTES + KT * A_TILE; };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

#pragma unroll 1
  for (int s = 0; s < AHEAD; ++s) {
    if (s < nst) load_stage(s);
    cp_async_commit();
  }
  if constexpr (BSrc::DEQUANT) {
    cp_async_wait<AHEAD - 1>();
    block_sync<BAR, THREADS>();
    bsrc.prepare(b_stage(0), 0, 0, K);
  }
  for (int st = 0; st < nst; ++st) {
    // Stage st (and, for a dequantising source, st + 1) has landed for this thread; after the
    // barrier for every thread, with every earlier shared-memory write ordered before the
    // tensor cores' reads, and every warpgroup done with the MMAs of stage st - 2.
    if constexpr (BSrc::DEQUANT) {
      cp_async_wait<AHEAD - 2>();
    } else {
      cp_async_wait<AHEAD - 1>();
    }
    fence_async_shared();
    block_sync<BAR, THREADS>();

    const u32 sa = base + (st % STAGES) * STAGE_BYTES;
    const u32 sb = bsrc.tiles(b_stage(st), st);
    fence_regs(acc);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < KT; ++j) {
      if (st * KT + j < nkt) {  // the same k16 steps for every KT: those of the k-tiles of K
        const u64 da = sw128_desc(sa + j * A_TILE + wg * 64 * 128);
        const u64 db = sw128_desc(sb + j * BN * BK * 2);
#pragma unroll
        for (int s = 0; s < BK / 16; ++s) {
          // +32 bytes per k16 step is +2 in the descriptor's address field (16-byte units).
          Wgmma<BN, F16>::mma(acc, da + 2 * s, db + 2 * s);
        }
      }
    }
    wgmma_commit();

    if constexpr (!DEEP) {
      if (st + AHEAD < nst) load_stage(st + AHEAD);  // into the slot of stage st - 2
      cp_async_commit();
    }
    if constexpr (BSrc::DEQUANT) {
      if (st + 1 < nst) bsrc.prepare(b_stage(st + 1), st + 1, (st + 1) * KT, K);
    }
    wgmma_wait<1>();
    fence_regs(acc);
    if constexpr (DEEP) {
      // Every warpgroup is past the MMAs of stage st - 1 once all have passed this barrier,
      // so its slot takes stage st + STAGES - 1: one stage more in flight, one barrier more.
      block_sync<BAR, THREADS>();
      if (st + AHEAD < nst) load_stage(st + AHEAD);
      cp_async_commit();
    }
  }
  wgmma_wait<0>();
  fence_regs(acc);
  cp_async_wait<0>();

  if constexpr (STAGED) {
    store_tile_staged<F16, HAS_C, BN, RT, NWG, BAR>(acc, wg, C, ldc_m, ldc_n, out, m0, n0, M,
                                                    N, alpha, beta, base);
  } else {
    store_tile<F16, HAS_C, BN, RT>(acc, wg, C, ldc_m, ldc_n, out, m0, n0, M, N, alpha, beta);
  }
}

template <bool F16, int BN, int NWG, int RT, int KT, int STAGES, bool HAS_C, bool DEEP = false,
          bool STAGED = false>
__device__ __forceinline__ void gemm(const Operand& A, const Operand& B, const u16* C,
                                     long long ldc_m, long long ldc_n, u16* out, int M, int N,
                                     int K, float alpha, float beta) {
  DenseB<BN, KT, 128 * NWG> bsrc{B};
  gemm_main<F16, BN, NWG, RT, KT, STAGES, HAS_C, DenseB<BN, KT, 128 * NWG>, DEEP, STAGED>(
      A, bsrc, C, ldc_m, ldc_n, out, M, N, K, alpha, beta);
}

}  // namespace bih
