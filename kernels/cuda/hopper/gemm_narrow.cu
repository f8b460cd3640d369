// Batch-invariant GEMM on Hopper for few rows (decode): the bits of gemm.cu's wgmma kernels,
// computed with mma.sync. out[m, n] = alpha sum_k A[m, k] B[n, k] + beta C[m, n], as gemm.cu.
//
// Why an element's bits are those of gemm.cu, and cannot depend on the batch: each output
// element is accumulated by one warp, in registers, starting from +0, by one chain of
// mma.sync m16n8k16 over k = 0..15, 16..31, ... in increasing order up to K rounded up to 64
// (the missing k zero-filled in both operands), each k in the slot of its k16 step that it has
// in gemm.cu's wgmma chain (fragments come from shared memory through ldmatrix, k in natural
// order). That an m16n8k16 chain and an m64nNk16 chain over the same k slots give the same
// fp32 bits is a property of the tensor cores, which tools/mma_equiv.cu measures; the GPU
// tests compare these configurations bit for bit with every other the dispatcher can pick.
// Nothing else adds into an element (no split-K, no atomics), and the epilogue is gemm.cu's
// store_pair: round(fma(beta, c, alpha * acc)) in fp32, rounded once. Which rows share a block
// (16 a block; rows past M are not loaded and their outputs are discarded), how many columns a
// warp computes and the pipeline depth decide only which elements are computed together.
//
// Why it exists: a wgmma instruction computes 64 rows, so a decode step of one to sixteen rows
// pays for 64 and streams its weights at one instruction per chain latency; an mma.sync tile
// is 16 rows, and a warp runs NT independent chains (one per 8-column tile).
//
// Layout: a block of WARPS warps computes 16 rows by BNB = 8 NT WARPS columns; warp w owns the
// n8 tiles NT w .. NT w + NT - 1. STAGES shared-memory stages each hold one 64-wide k-tile of
// A (16 rows) and B (BNB rows), 128-byte rows with the 16-byte chunk c of row r at
// c ^ (r % 8) (gemm.cu's TileLoader layout; ldmatrix reads it without bank conflicts),
// filled by cp.async from all threads STAGES - 1 k-tiles ahead. Needs common.cuh and gemm.cu
// before it.

namespace bih {

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

// d += A (16 x 16, row-major fragments a0..a3) * B (16 x 8, column fragments b0, b1), fp32.
template <bool F16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                             u32 b0, u32 b1) {
  if constexpr (F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Byte offset of the 16-byte chunk c of row r in a tile of 128-byte rows (TileLoader's layout).
__device__ __forceinline__ u32 narrow_chunk(int r, int c) {
  return static_cast<u32>(r * 128 + ((c ^ (r & 7)) << 4));
}

// Steps through STAGES shared-memory stages of STAGE_BYTES each and back to the first, by a
// countdown rather than a comparison with the end (which ptxas would recompute every k-tile):
// next() is the byte offset from the current stage to the one after it.
template <int STAGES, int STAGE_BYTES>
struct StageStep {
  static constexpr u32 WRAP = STAGE_BYTES - STAGES * STAGE_BYTES;  // the last stage to the first
  int left = STAGES;  // stages from the current one to the wrap
  __device__ __forceinline__ u32 next() {
    const u32 d = --left == 0 ? WRAP : STAGE_BYTES;
    if (left == 0) left = STAGES;
    return d;
  }
};

// The copy side of a few-row block's pipeline, carried from one k-tile to the next: the stage
// the next k-tile goes to (at), that k-tile's index (k), how many k-tiles are left to copy
// (to_copy), and how many of the next ones take the unchecked copy (full_left: the test is
// folded into this count once, which keeps ptxas from recomputing it from the kernel
// arguments every k-tile). A block's copies take every k-tile from the first (STRIDE 1); a
// warp that takes every STRIDE-th k-tile from k0 (qmm_narrow_ws.cu's helpers) steps through
// its own stages, STAGES of them STAGE_BYTES apart.
template <int STAGES, int STAGE_BYTES, int STRIDE = 1>
struct CopyCursor {
  u32 at;
  int k, to_copy, full_left;
  StageStep<STAGES, STAGE_BYTES> step;
  __device__ __forceinline__ CopyCursor(u32 base, int nkt, int full)
      : at(base), k(0), to_copy(nkt), full_left(full) {}
  __device__ __forceinline__ CopyCursor(u32 base, int k0, int count, int full)
      : at(base), k(k0), to_copy(count), full_left(full) {}
  // Past the k-tile just issued; the byte offset by which `at` moved.
  __device__ __forceinline__ u32 advance() {
    k += STRIDE;
    --to_copy;
    --full_left;
    const u32 d = step.next();
    at += d;
    return d;
  }
};

// Where a few-row block works: its dynamic shared memory from the first 1024-byte boundary
// (base), the 16-row x BNB-column tile of out at index `tile`, row-tile major (negative: the
// block's index; the grouped entry, one launch over several weights, passes the tile within
// the weight its block serves), that tile's first row m0 and column n0, the k-tile count of
// K, and the thread's lane and warp.
template <int BNB>
struct NarrowTile {
  static_assert(BNB <= 256, "columns a block");
  u32 base;
  int m0, n0, nkt, lane, warp;
  __device__ __forceinline__ NarrowTile(int N, int K, int tile) {
    extern __shared__ unsigned char smem_raw[];
    base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const int tiles_n = (N + BNB - 1) / BNB;
    const unsigned at = tile < 0 ? blockIdx.x : static_cast<unsigned>(tile);
    m0 = (at / tiles_n) * 16;
    n0 = (at % tiles_n) * BNB;
    nkt = (K + BK - 1) / BK;
    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
  }
};

// A few-row block's epilogue: each lane stores its accumulator fragments through gemm.cu's
// store_pair, rows past M and columns past N skipped. Fragment of lane l: acc[j][e] is row
// l / 4 (+ 8 for e >= 2), column 8 (NT w + j) + 2 (l % 4) + (e & 1) of warp w's columns.
template <bool F16, bool HAS_C, int NT, int BNB>
__device__ __forceinline__ void narrow_store(const float (&acc)[NT][4], const NarrowTile<BNB>& tl,
                                             int M, int N, const u16* C, long long ldc_m,
                                             long long ldc_n, u16* out, float alpha, float beta) {
  const int g = tl.lane >> 2, t = tl.lane & 3;
  const bool pairs = (N % 2) == 0;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = tl.n0 + 8 * (NT * tl.warp + j) + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = tl.m0 + g + 8 * h;
      if (m >= M || n >= N) continue;
      store_pair<F16, HAS_C>(acc[j][2 * h], acc[j][2 * h + 1], C, ldc_m, ldc_n, out, m, n, N,
                             alpha, beta, pairs);
    }
  }
}

template <int NT, int WARPS, int STAGES>
__host__ __device__ constexpr int gemm_narrow_smem() {
  return 1024 + STAGES * (16 * 128 + 8 * NT * WARPS * 128);
}

// tile: which 16-row x BNB-column tile of out this block computes (NarrowTile).
template <bool F16, int NT, int WARPS, int STAGES, bool HAS_C>
__device__ __forceinline__ void gemm_narrow(const Operand& A, const Operand& B, const u16* C,
                                            long long ldc_m, long long ldc_n, u16* out, int M,
                                            int N, int K, float alpha, float beta,
                                            int tile = -1) {
  constexpr int THREADS = 32 * WARPS;
  constexpr int BNB = 8 * NT * WARPS;
  constexpr int A_BYTES = 16 * 128;
  constexpr int STAGE_BYTES = A_BYTES + BNB * 128;
  static_assert(STAGES >= 2, "stages");
  const NarrowTile<BNB> tl(N, K, tile);
  const u32 base = tl.base;
  const int m0 = tl.m0, n0 = tl.n0, nkt = tl.nkt, lane = tl.lane, warp = tl.warp;

  TileLoader<16, THREADS> la;
  la.init(A, m0, M);
  TileLoader<BNB, THREADS> lb;
  lb.init(B, n0, N);
  constexpr int PB = TileLoader<BNB, THREADS>::PER_THREAD;

  // The copies, one k-tile after another into stage after stage, state carried from one to
  // the next (the next k-tile's source pointers and stage). Where both operands are 16-byte
  // aligned with unit k stride, every B row of the block lies inside N and the k-tile lies
  // wholly inside K, the copy is one cp.async per chunk with no checks (A's rows past M are
  // left unwritten: their outputs are discarded); otherwise TileLoader's checked copy, which
  // writes the same values.
  const bool fast = la.vec && lb.vec && lb.valid == PB;
  const u16* na = la.src;
  const u16* nb = lb.src;
  CopyCursor<STAGES, STAGE_BYTES> cc(base, nkt, fast ? K / BK : 0);
  auto load_next = [&]() {
    if (cc.full_left > 0) {
      la.load_interior(cc.at, na, la.valid);
      lb.load_interior(cc.at + A_BYTES, nb, PB);
    } else {
      la.load(cc.at, cc.k * BK, K, true);
      lb.load(cc.at + A_BYTES, cc.k * BK, K, false);
    }
    na += BK;
    nb += BK;
    cc.advance();
  };

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  // ldmatrix addresses, per k16 step s, in the stage of the k-tile being computed: A's 16 x 16
  // block as four 8 x 8 matrices (rows 0-7 and 8-15, k 0-7 and 8-15, in the order of the
  // mma's a0..a3); B's two n8 tiles j, j + 1 as four (tile j k 0-7, k 8-15, tile j + 1 k 0-7,
  // k 8-15: b0, b1 of each), a row 8 j further down being 1024 bytes on in the same chunk
  // order (the swizzle depends on the row modulo 8). With an odd NT the last tile is read by
  // an x2 load; lanes 16-31 give it no address, and theirs stays on that tile. The addresses
  // advance with the stage, carried from tile to tile.
  const int ar = lane & 15, ac = lane >> 4;
  const int br = 8 * NT * warp + (lane & 7) + ((lane >> 4) << 3), bc = (lane >> 3) & 1;
  const int bt = 8 * (NT * warp + NT - 1) + (lane & 7);
  constexpr int STEPS = BK / 16;
  static_assert(STEPS % 2 == 0 && STEPS >= 2, "k16 steps a k-tile");
  u32 a_at[STEPS], b_at[STEPS], t_at[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    a_at[s] = base + narrow_chunk(ar, 2 * s + ac);
    b_at[s] = base + A_BYTES + narrow_chunk(br, 2 * s + bc);
    t_at[s] = base + A_BYTES + narrow_chunk(bt, 2 * s + bc);
  }
  // The fragments of one k16 step of every chain of this warp, and that step's MMAs.
  struct Frag {
    u32 a[4];
    u32 b[NT][2];
  };
  auto load_frag = [&](Frag& f, int s) {
    ldsm_x4(a_at[s], f.a[0], f.a[1], f.a[2], f.a[3]);
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
      if (j + 1 < NT)
        ldsm_x4(b_at[s] + 1024 * j, f.b[j][0], f.b[j][1], f.b[j + 1][0], f.b[j + 1][1]);
      else
        ldsm_x2(t_at[s], f.b[j][0], f.b[j][1]);
    }
  };
  auto mma_frag = [&](const Frag& f) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
      mma_m16n8k16<F16>(acc[j], f.a[0], f.a[1], f.a[2], f.a[3], f.b[j][0], f.b[j][1]);
  };

#pragma unroll 1
  for (int s = 0; s < STAGES - 1; ++s) {
    if (cc.to_copy > 0) load_next();
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();
  // The fragments of each k16 step are read one step ahead of its MMAs, so a step's ldmatrix
  // latency runs under the previous step's MMAs, across k-tiles too: the k-tile's last step
  // reads the next k-tile's first fragments. So the wait for the next k-tile and the barrier
  // come one step before the end of a k-tile, once every warp has read that k-tile's last
  // fragments: after it, the next k-tile has landed for every thread and no thread reads the
  // stage of this one again. The copy into the stage of the previous k-tile (read before the
  // previous barrier) goes out after the first step's MMAs. Every chain's MMAs keep their
  // order; only when the fragments are read moves. The last k-tile's read-ahead (from a stage
  // holding no k-tile of this product) is never used.
  Frag f[2];
  load_frag(f[0], 0);
  StageStep<STAGES, STAGE_BYTES> step;  // from the stage of the k-tile being computed
#pragma unroll 1
  for (int kt = nkt; kt > 0; --kt) {
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      load_frag(f[(s + 1) & 1], (s + 1) % STEPS);
      mma_frag(f[s & 1]);
      if (s == 0) {
        if (cc.to_copy > 0) load_next();
        cp_async_commit();
      }
      if (s == STEPS - 2) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const u32 d = step.next();
#pragma unroll
        for (int i = 0; i < STEPS; ++i) {
          a_at[i] += d;
          b_at[i] += d;
          t_at[i] += d;
        }
      }
    }
  }
  cp_async_wait<0>();

  narrow_store<F16, HAS_C, NT>(acc, tl, M, N, C, ldc_m, ldc_n, out, alpha, beta);
}

}  // namespace bih
