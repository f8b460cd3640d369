// Batch-invariant attention on the tensor cores (bf16, f16).
// (needs common.cuh and attention_common.cuh before it; the algorithm is described there)

namespace bi {

// Head dims above 128 (256) would need more than 255 registers per thread with the query
// fragments and the whole output row in registers. There the query fragments live in shared
// memory (reloaded at each k16 step: the same values, so the same MMAs) and each block computes
// half of the output columns (blockIdx.z), recomputing the scores, which come out bit for bit
// the same in both halves; an output column's reduction (keys in block order) is unchanged.
template <int D>
constexpr bool ATT_Q_IN_SMEM = D > 128;
template <int D>
constexpr int ATT_VALUE_COLS = D > 128 ? D / 2 : D;

// The attention kernel. NW warps per block share K/V tiles (STAGES-deep cp.async pipeline).
// SPLIT: SPB consecutive splits per block (splits blockIdx.y * SPB ...), each written as an
// (m, l, acc) partial of D + 2 floats per (row, split) for the combine kernel, the online
// softmax state starting afresh at every split; otherwise all splits in order and the output
// directly. A split's partial is the same whichever block computes it and whatever else that
// block streams before or after it (the state is reset at the split's first key block and the
// blocks are taken in key order), so SPB is a speed choice that cannot move a bit.
// blockIdx.z: which DV output columns (D / DV blocks per row group). RING: keys in ring storage
// starting at key_start[b] (else position order, key_start unused). Dynamic shared memory:
// AttnConfig.shared_memory(D) in attention.py, the layout below.
template <typename T, int D, int NW, int STAGES, int MASK, bool SINKS, bool SPLIT, bool RING,
          int SPB = 1>
__device__ void attention_fwd(const T* q, const T* k, const T* v, const void* mask,
                              const T* sinks, const int* key_start, const AttnShape& S,
                              float scale, T* out, float* part) {
  constexpr int NTHR = NW * 32;
  constexpr bool QSM = ATT_Q_IN_SMEM<D>;
  constexpr int DV = ATT_VALUE_COLS<D>;  // output columns of this block
  constexpr int KS = D + 8;                // padded smem rows: conflict-free ldmatrix
  constexpr int VS = DV + 8;
  constexpr int DT = DV / 8;
  constexpr int DK = D / 16;
  constexpr int CH = D / 8;    // 16-byte chunks per K row
  constexpr int CHV = DV / 8;  // ... per V row (this block's columns)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* Ks = reinterpret_cast<u16*>(smem_raw);
  u16* Vs = Ks + STAGES * ATT_KB * KS;
  uint4* Qs = reinterpret_cast<uint4*>(Vs + STAGES * ATT_KB * VS);  // [NW][DK][32] if QSM
  // [DV/2][NTHR]: sequential mode's running fold of finished splits; a split-mode block has one
  // split and no fold, so it leaves the buffer out (less shared memory: more blocks per SM)
  float* foldbuf = reinterpret_cast<float*>(Qs + (QSM ? NW * DK * 32 : 0));
  int* rinfo = reinterpret_cast<int*>(foldbuf + (SPLIT ? 0 : (DV / 2) * NTHR));  // j0, jl [NW*16]
  const int dv0 = DV == D ? 0 : static_cast<int>(blockIdx.z) * DV;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rows_per = S.Tq * S.R;
  const int groups = (rows_per + 16 * NW - 1) / (16 * NW);
  const int grp = blockIdx.x % groups;
  const int bh = blockIdx.x / groups;
  const int kvh = bh % S.Hkv, b = bh / S.Hkv;
  const int wrow0 = grp * 16 * NW + 16 * warp;
  const float scale_log2 = __fmul_rn(scale, LOG2E);
  const int nslot = gridDim.y * SPB;  // split partials per row (split mode)
  const int sp0 = blockIdx.y * SPB;     // this block's first split (split mode)

  warp_row_ranges<T, MASK>(S, mask, b, kvh * S.R, wrow0, rows_per, lane, rinfo + 16 * warp,
                           rinfo + NW * 16 + 16 * warp);
  __syncthreads();

  // This thread's two rows (fragment rows g and g + 8).
  int rI[2], rH[2], rJ0[2], rJL[2];
  bool rV[2];
  long long rM[2], rOut[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int r = wrow0 + g + 8 * x;
    rV[x] = r < rows_per;
    rI[x] = rV[x] ? r / S.R : 0;
    rH[x] = kvh * S.R + (rV[x] ? r % S.R : 0);
    rJ0[x] = rinfo[16 * warp + g + 8 * x];
    rJL[x] = rinfo[NW * 16 + 16 * warp + g + 8 * x];
    rM[x] = mask_row<MASK>(S, b, rH[x], rI[x]);
    rOut[x] = (static_cast<long long>(b) * S.Hq + rH[x]) * S.Tq + rI[x];
  }
  const long long mcol = mask_col<MASK>(S);
  const T* kbase = k + b * S.ks[0] + kvh * S.ks[1];
  const T* vbase = v + b * S.vs[0] + kvh * S.vs[1] + dv0 * S.vs[3];
  const int kst = RING ? ring_start(key_start, b, S.Tk) : 0;
  const bool kv_vec = S.ks[3] == 1 && S.vs[3] == 1 && (S.ks[2] % 8) == 0 && (S.vs[2] % 8) == 0 &&
                      aligned16(kbase) && aligned16(vbase);

  // load_kv's fast path: thread tid copies 16-byte column tid % CH of every RSTEP-th key row.
  constexpr bool FIXED_COL = NTHR % CH == 0 && ATT_KB % (NTHR / CH) == 0;
  constexpr int RSTEP = FIXED_COL ? NTHR / CH : 1;
  // ... where the offsets (up to ATT_KB rows of stride ks[2] / vs[2]) fit in an int.
  const bool fast_tiles = FIXED_COL && !RING && kv_vec && S.ks[2] < (1 << 24) &&
                          S.vs[2] < (1 << 24);

  bool done[2] = {false, false};
  int prev = -1;
  while (true) {
    int a = 0x7fffffff;
    for (int x = 0; x < NW * 16; ++x) {
      const int j = rinfo[x];
      if (j > prev && j < a) a = j;
    }
    if (a == 0x7fffffff) break;
    int kend = 0;
    for (int x = 0; x < NW * 16; ++x)
      if (rinfo[x] == a) kend = max(kend, rinfo[NW * 16 + x] + 1);
    prev = a;
    const bool act[2] = {rV[0] && rJ0[0] == a, rV[1] && rJ0[1] == a};

    const int nkeys = kend - a;
    const int nblk = (nkeys + ATT_KB - 1) / ATT_KB;
    constexpr int BPS = ATT_SPLIT / ATT_KB;
    const int nsplit = (nkeys + ATT_SPLIT - 1) / ATT_SPLIT;
    int blk0 = 0, blk1 = nblk;
    if constexpr (SPLIT) {
      blk0 = min(sp0 * BPS, nblk);
      blk1 = min(blk0 + SPB * BPS, nblk);
    }

    // Query fragments (A operand, natural head-dim order), in registers or (QSM) in this
    // lane's own slots of shared memory, which only this lane reads back.
    u32 qf[QSM ? 1 : DK][4];
    uint4* qsm = Qs + warp * DK * 32 + lane;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const T* qrow = q + b * S.qs[0] + rH[x] * S.qs[1] + rI[x] * S.qs[2];
      const u16* q16 = reinterpret_cast<const u16*>(qrow);
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
#pragma unroll
        for (int hlf = 0; hlf < 2; ++hlf) {
          const int d = 16 * kk + 8 * hlf + 2 * t;
          u32 lo = 0, hi = 0;
          if (rV[x]) {
            lo = q16[d * S.qs[3]];
            hi = q16[(d + 1) * S.qs[3]];
          }
          if constexpr (QSM) {
            reinterpret_cast<u32*>(qsm + kk * 32)[2 * hlf + x] = lo | (hi << 16);
          } else {
            qf[kk][2 * hlf + x] = lo | (hi << 16);
          }
        }
      }
    }

    // The online-softmax state of a split: running max, sum and output, fresh at each split.
    float m[2], l[2];
    float acc[DT][4];
    auto fresh_state = [&]() {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        m[x] = NEG_INF;
        l[x] = 0.0f;
      }
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
    };
    fresh_state();
    float mt[2] = {NEG_INF, NEG_INF}, lt[2] = {0.0f, 0.0f};
    const bool multi = !SPLIT && nsplit > 1;

    // Logical keys [kb0, kb0 + ATT_KB) of the pass into a stage; keys from kend on are zeros
    // and are never read. A V row holds this block's DV columns.
    auto load_kv = [&](int stage, int blk) {
      const int kb0 = a + blk * ATT_KB;
      // A whole tile of valid keys in position order from 16-byte-aligned rows, and the
      // block's threads covering whole rows per pass: each thread copies one fixed 16-byte
      // column of rows fr0, fr0 + RSTEP, ..., at fixed 32-bit offsets from one base (a few
      // instructions a copy where the general loop below spends about twenty, in a kernel
      // whose decode is issue-bound). The same bytes to the same places as that loop.
      if (fast_tiles && kend - kb0 >= ATT_KB) {
        const int fcol = tid % CH, fr0 = tid / CH;
        const bool fcol_v = DV == D || fcol < CHV;
        const T* ks_ = kbase + static_cast<long long>(kb0 + fr0) * S.ks[2] + 8 * fcol;
        const T* vs_ = vbase + static_cast<long long>(kb0 + fr0) * S.vs[2] + 8 * fcol;
        const unsigned dk = smem_addr(Ks + (stage * ATT_KB + fr0) * KS + 8 * fcol);
        const unsigned dv = smem_addr(Vs + (stage * ATT_KB + fr0) * VS + 8 * fcol);
        const int kstep = RSTEP * static_cast<int>(S.ks[2]);
        const int vstep = RSTEP * static_cast<int>(S.vs[2]);
#pragma unroll 4
        for (int i = 0; i < ATT_KB / RSTEP; ++i) {
          cp_async16_raw(dk + i * RSTEP * KS * 2, ks_ + i * kstep);
          if (fcol_v) cp_async16_raw(dv + i * RSTEP * VS * 2, vs_ + i * vstep);
        }
      } else {
      for (int idx = tid; idx < ATT_KB * CH; idx += NTHR) {
        const int r = idx / CH, c = idx % CH;
        const int j = kb0 + r;
        const bool ok = j < kend;
        const bool has_v = DV == D || c < CHV;
        const long long js = !ok ? 0 : RING ? ring_index(j, kst, S.Tk) : j;
        u16* dk = Ks + (stage * ATT_KB + r) * KS + 8 * c;
        u16* dv = Vs + (stage * ATT_KB + r) * VS + 8 * c;
        if (kv_vec) {
          cp_async16(dk, kbase + js * S.ks[2] + 8 * c, ok);
          if (has_v) cp_async16(dv, vbase + js * S.vs[2] + 8 * c, ok);
        } else {
          const u16* sk = reinterpret_cast<const u16*>(kbase) + js * S.ks[2];
          const u16* sv = reinterpret_cast<const u16*>(vbase) + js * S.vs[2];
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int d = 8 * c + e;
            dk[e] = ok ? sk[d * S.ks[3]] : static_cast<u16>(0);
            if (has_v) dv[e] = ok ? sv[d * S.vs[3]] : static_cast<u16>(0);
          }
        }
      }
      }
    };

    // Split mode: this pass's rows' partial of split `sp` from the running state (empty
    // where the row saw no key of it).
    auto put_partial = [&](int sp) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        if (!act[x]) continue;
        float* p = part + (rOut[x] * nslot + sp) * (D + 2);
        if (t == 0 && dv0 == 0) {
          p[0] = m[x];
          p[1] = l[x];
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          p[2 + dv0 + 8 * dt + 2 * t] = acc[dt][2 * x];
          p[2 + dv0 + 8 * dt + 2 * t + 1] = acc[dt][2 * x + 1];
        }
      }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (blk0 + s < blk1) load_kv(s, blk0 + s);
      cp_async_commit();
    }
    for (int blk = blk0; blk < blk1; ++blk) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      const int nb = blk + STAGES - 1;
      if (nb < blk1) load_kv((nb - blk0) % STAGES, nb);
      cp_async_commit();
      const int st = (blk - blk0) % STAGES;
      const u16* Kst = Ks + st * ATT_KB * KS;
      const u16* Vst = Vs + st * ATT_KB * VS;
      const int kb0 = a + blk * ATT_KB;

      float s[8][4];
#pragma unroll
      for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[jn][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
        u32 a0, a1, a2, a3;
        if constexpr (QSM) {
          const uint4 f = qsm[kk * 32];
          a0 = f.x, a1 = f.y, a2 = f.z, a3 = f.w;
        } else {
          a0 = qf[kk][0], a1 = qf[kk][1], a2 = qf[kk][2], a3 = qf[kk][3];
        }
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          u32 r0, r1, r2, r3;
          const int mi = lane >> 3;
          ldmatrix_x4(r0, r1, r2, r3,
                      Kst + (16 * jp + (mi >> 1) * 8 + (lane & 7)) * KS + 16 * kk + (mi & 1) * 8);
          mma16816<T>(s[2 * jp], a0, a1, a2, a3, r0, r1);
          mma16816<T>(s[2 * jp + 1], a0, a1, a2, a3, r2, r3);
        }
      }

      float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e >> 1;
          const int j = kb0 + 8 * jn + 2 * t + (e & 1);
          bool ok = act[x] && j <= rJL[x];
          float sc = __fmul_rn(s[jn][e], scale_log2);
          if constexpr (MASK >= 2) {
            float add = 0.0f;
            if (ok) {
              ok = mask_ok<T, MASK>(mask, rM[x] + j * mcol, add);
              if constexpr (MASK == 3) sc = fmaf(add, LOG2E, sc);
            }
          }
          s[jn][e] = ok ? sc : NEG_INF;
          mx[x] = fmaxf(mx[x], s[jn][e]);
        }
      }
      float alpha[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
        const float mn = fmaxf(m[x], mx[x]);
        const float mu = mn == NEG_INF ? 0.0f : mn;
        alpha[x] = ex2(__fsub_rn(m[x], mu));
        m[x] = mn;
        mx[x] = mu;  // now the max used for this block's exponents
      }
      float rs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e >> 1;
          s[jn][e] = ex2(__fsub_rn(s[jn][e], mx[x]));
          rs[x] = __fadd_rn(rs[x], s[jn][e]);
        }
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        rs[x] = __fadd_rn(rs[x], __shfl_xor_sync(0xffffffffu, rs[x], 1));
        rs[x] = __fadd_rn(rs[x], __shfl_xor_sync(0xffffffffu, rs[x], 2));
        l[x] = fmaf(l[x], alpha[x], rs[x]);
      }
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        acc[dt][0] = __fmul_rn(acc[dt][0], alpha[0]);
        acc[dt][1] = __fmul_rn(acc[dt][1], alpha[0]);
        acc[dt][2] = __fmul_rn(acc[dt][2], alpha[1]);
        acc[dt][3] = __fmul_rn(acc[dt][3], alpha[1]);
      }
#pragma unroll
      for (int kk = 0; kk < ATT_KB / 16; ++kk) {
        const u32 p0 = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        const u32 p1 = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        const u32 p2 = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const u32 p3 = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          u32 r0, r1, r2, r3;
          const int mi = lane >> 3;
          ldmatrix_x4_trans(r0, r1, r2, r3,
                            Vst + (16 * kk + (mi & 1) * 8 + (lane & 7)) * VS + 16 * dp + (mi >> 1) * 8);
          mma16816<T>(acc[2 * dp], p0, p1, p2, p3, r0, r1);
          mma16816<T>(acc[2 * dp + 1], p0, p1, p2, p3, r2, r3);
        }
      }

      // End of a split in split mode: its partial, then a fresh state for the next one.
      if (SPLIT && (((blk + 1) % BPS) == 0 || blk + 1 == blk1)) {
        put_partial(blk / BPS);
        fresh_state();
      }
      // End of a split (sequential mode, several splits): fold it into the running result.
      if (multi && (((blk + 1) % BPS) == 0 || blk + 1 == blk1)) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          if (m[x] == NEG_INF) continue;
          if (mt[x] == NEG_INF) {
            mt[x] = m[x];
            lt[x] = l[x];
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              foldbuf[(dt * 4 + 2 * x) * NTHR + tid] = acc[dt][2 * x];
              foldbuf[(dt * 4 + 2 * x + 1) * NTHR + tid] = acc[dt][2 * x + 1];
            }
          } else {
            float ca, cb;
            fold_scalars(mt[x], lt[x], m[x], l[x], ca, cb);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
              for (int y = 0; y < 2; ++y) {
                float& f = foldbuf[(dt * 4 + 2 * x + y) * NTHR + tid];
                f = fold_value(f, acc[dt][2 * x + y], ca, cb);
              }
            }
          }
        }
        fresh_state();
      }
    }
    cp_async_wait<0>();
    // Split mode: the block's splits past the rows' last key are empty (the state is fresh).
    if constexpr (SPLIT) {
      for (int sp = sp0 + (blk1 - blk0 + BPS - 1) / BPS; sp < sp0 + SPB; ++sp) put_partial(sp);
    }

#pragma unroll
    for (int x = 0; x < 2; ++x) {
      if (!act[x]) continue;
      done[x] = true;
      if constexpr (SPLIT) {
        continue;  // its partials went out at each split end and just above
      } else {
        const float sink2 = SINKS ? __fmul_rn(to_f32<T>(sinks[rH[x]]), LOG2E) : 0.0f;
        float c, ll;
        float fm = multi ? mt[x] : m[x], fl = multi ? lt[x] : l[x];
        finalize_scalars(fm, fl, SINKS, sink2, c, ll);
        T* o = out + rOut[x] * D + dv0;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          float v0 = multi ? foldbuf[(dt * 4 + 2 * x) * NTHR + tid] : acc[dt][2 * x];
          float v1 = multi ? foldbuf[(dt * 4 + 2 * x + 1) * NTHR + tid] : acc[dt][2 * x + 1];
          *reinterpret_cast<u32*>(o + 8 * dt + 2 * t) =
              pack2<T>(finalize_value(v0, c, ll), finalize_value(v1, c, ll));
        }
      }
    }
    __syncthreads();
  }

  // Rows with no valid key: zero output (or an empty partial).
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    if (!rV[x] || done[x]) continue;
    if constexpr (SPLIT) {
      for (int sp = sp0; sp < sp0 + SPB; ++sp) {
        float* p = part + (rOut[x] * nslot + sp) * (D + 2);
        if (t == 0 && dv0 == 0) {
          p[0] = NEG_INF;
          p[1] = 0.0f;
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          p[2 + dv0 + 8 * dt + 2 * t] = 0.0f;
          p[2 + dv0 + 8 * dt + 2 * t + 1] = 0.0f;
        }
      }
    } else {
      // finalize_value gives 0 here with or without a sink: acc is 0.
      T* o = out + rOut[x] * D + dv0;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<u32*>(o + 8 * dt + 2 * t) = pack2<T>(0.0f, 0.0f);
    }
  }
}

}  // namespace bi
