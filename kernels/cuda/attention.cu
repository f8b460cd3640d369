// Batch-invariant attention for MLX's CUDA backend: softmax(scale * q k^T + mask) v, with GQA,
// masks (none, causal lower-right aligned, bool, additive) and attention sinks.
//
// One algorithm for decode, chunked prefill and full prefill (needs common.cuh before it).
// For each query row, with a = its first valid key and e = one past its last valid key:
//   * keys [a, e) are cut into blocks of ATT_KB keys starting at a, blocks into splits of
//     ATT_SPLIT keys (a fixed split SIZE, never a fixed number of splits);
//   * a block: scores by m16n8k16 MMAs over the head dim (fixed order), fp32 online softmax
//     (running max, exp2 on the SFU, row sums by a fixed quad butterfly), P V by MMAs with keys
//     in block order;
//   * each split restarts the online softmax; split results are folded left to right
//     (fold() below), in one block (sequential mode) or by the combine kernel (split mode);
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

// The attention kernel. NW warps per block share K/V tiles (STAGES-deep cp.async pipeline).
// SPLIT: one split per block (blockIdx.y), writing (m, l, acc) partials of D + 2 floats per
// (row, split) for the combine kernel; otherwise all splits in order and the output directly.
// Dynamic shared memory: attn_smem_bytes(D, NW, STAGES).
template <typename T, int D, int NW, int STAGES, int MASK, bool SINKS, bool SPLIT>
__device__ void attention_fwd(const T* q, const T* k, const T* v, const void* mask,
                              const T* sinks, const AttnShape& S, float scale, T* out,
                              float* part) {
  constexpr int NTHR = NW * 32;
  constexpr int KS = D + 8;  // padded smem row: conflict-free ldmatrix
  constexpr int DT = D / 8;
  constexpr int DK = D / 16;
  constexpr int CH = D / 8;  // 16-byte chunks per K/V row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* Ks = reinterpret_cast<u16*>(smem_raw);
  u16* Vs = Ks + STAGES * ATT_KB * KS;
  float* foldbuf = reinterpret_cast<float*>(Vs + STAGES * ATT_KB * KS);  // [D/2][NTHR]
  int* rinfo = reinterpret_cast<int*>(foldbuf + (D / 2) * NTHR);      // j0[NW*16], jl[NW*16]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rows_per = S.Tq * S.R;
  const int groups = (rows_per + 16 * NW - 1) / (16 * NW);
  const int grp = blockIdx.x % groups;
  const int bh = blockIdx.x / groups;
  const int kvh = bh % S.Hkv, b = bh / S.Hkv;
  const int wrow0 = grp * 16 * NW + 16 * warp;
  const float scale_log2 = __fmul_rn(scale, LOG2E);
  const int nsplit_max = (S.Tk + ATT_SPLIT - 1) / ATT_SPLIT;

  for (int rr = 0; rr < 16; ++rr) {
    const int r = wrow0 + rr;
    int j0 = 0x7fffffff, jl = -1;
    if (r < rows_per) row_range<T, MASK>(S, mask, b, kvh * S.R + r % S.R, r / S.R, lane, j0, jl);
    if (lane == 0) {
      rinfo[16 * warp + rr] = j0;
      rinfo[NW * 16 + 16 * warp + rr] = jl;
    }
  }
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
  const T* vbase = v + b * S.vs[0] + kvh * S.vs[1];
  const bool kv_vec = S.ks[3] == 1 && S.vs[3] == 1 && (S.ks[2] % 8) == 0 && (S.vs[2] % 8) == 0 &&
                      aligned16(kbase) && aligned16(vbase);

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
      blk0 = min(static_cast<int>(blockIdx.y) * BPS, nblk);
      blk1 = min(blk0 + BPS, nblk);
    }

    // Query fragments (A operand, natural head-dim order).
    u32 qf[DK][4];
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
          qf[kk][2 * hlf + x] = lo | (hi << 16);
        }
      }
    }

    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
    float mt[2] = {NEG_INF, NEG_INF}, lt[2] = {0.0f, 0.0f};
    const bool multi = !SPLIT && nsplit > 1;

    auto load_kv = [&](int stage, int blk) {
      const int kb0 = a + blk * ATT_KB;
      for (int idx = tid; idx < ATT_KB * CH; idx += NTHR) {
        const int r = idx / CH, c = idx % CH;
        const int j = kb0 + r;
        const bool ok = j < kend;
        u16* dk = Ks + (stage * ATT_KB + r) * KS + 8 * c;
        u16* dv = Vs + (stage * ATT_KB + r) * KS + 8 * c;
        if (kv_vec) {
          cp_async16(dk, ok ? kbase + j * S.ks[2] + 8 * c : kbase, ok);
          cp_async16(dv, ok ? vbase + j * S.vs[2] + 8 * c : vbase, ok);
        } else {
          const u16* sk = reinterpret_cast<const u16*>(kbase) + j * S.ks[2];
          const u16* sv = reinterpret_cast<const u16*>(vbase) + j * S.vs[2];
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const int d = 8 * c + e;
            dk[e] = ok ? sk[d * S.ks[3]] : static_cast<u16>(0);
            dv[e] = ok ? sv[d * S.vs[3]] : static_cast<u16>(0);
          }
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
      const u16* Vst = Vs + st * ATT_KB * KS;
      const int kb0 = a + blk * ATT_KB;

      float s[8][4];
#pragma unroll
      for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[jn][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) {
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          u32 r0, r1, r2, r3;
          const int mi = lane >> 3;
          ldmatrix_x4(r0, r1, r2, r3,
                      Kst + (16 * jp + (mi >> 1) * 8 + (lane & 7)) * KS + 16 * kk + (mi & 1) * 8);
          mma16816<T>(s[2 * jp], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], r0, r1);
          mma16816<T>(s[2 * jp + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], r2, r3);
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
                            Vst + (16 * kk + (mi & 1) * 8 + (lane & 7)) * KS + 16 * dp + (mi >> 1) * 8);
          mma16816<T>(acc[2 * dp], p0, p1, p2, p3, r0, r1);
          mma16816<T>(acc[2 * dp + 1], p0, p1, p2, p3, r2, r3);
        }
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
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          m[x] = NEG_INF;
          l[x] = 0.0f;
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
      }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int x = 0; x < 2; ++x) {
      if (!act[x]) continue;
      done[x] = true;
      if constexpr (SPLIT) {
        float* p = part + (rOut[x] * nsplit_max + blockIdx.y) * (D + 2);
        if (t == 0) {
          p[0] = m[x];
          p[1] = l[x];
        }
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          p[2 + 8 * dt + 2 * t] = acc[dt][2 * x];
          p[2 + 8 * dt + 2 * t + 1] = acc[dt][2 * x + 1];
        }
      } else {
        const float sink2 = SINKS ? __fmul_rn(to_f32<T>(sinks[rH[x]]), LOG2E) : 0.0f;
        float c, ll;
        float fm = multi ? mt[x] : m[x], fl = multi ? lt[x] : l[x];
        finalize_scalars(fm, fl, SINKS, sink2, c, ll);
        T* o = out + rOut[x] * D;
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
      float* p = part + (rOut[x] * nsplit_max + blockIdx.y) * (D + 2);
      if (t == 0) {
        p[0] = NEG_INF;
        p[1] = 0.0f;
      }
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        p[2 + 8 * dt + 2 * t] = 0.0f;
        p[2 + 8 * dt + 2 * t + 1] = 0.0f;
      }
    } else {
      // finalize_value gives 0 here with or without a sink: acc is 0.
      T* o = out + rOut[x] * D;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<u32*>(o + 8 * dt + 2 * t) = pack2<T>(0.0f, 0.0f);
    }
  }
}

// Fold the split partials of each row in split order and normalise: one warp per row.
template <typename T, int D, bool SINKS>
__device__ void attention_combine(const float* part, int rows, int nsplit, int Hq, int Tq,
                                  const T* sinks, T* out) {
  constexpr int PER = (D + 31) / 32;
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  float mt = NEG_INF, lt = 0.0f, f[PER];
#pragma unroll
  for (int x = 0; x < PER; ++x) f[x] = 0.0f;
  for (int sp = 0; sp < nsplit; ++sp) {
    const float* p = part + (row * nsplit + sp) * (D + 2);
    const float m = p[0];
    if (m == NEG_INF) continue;
    const float l = p[1];
    if (mt == NEG_INF) {
      mt = m;
      lt = l;
#pragma unroll
      for (int x = 0; x < PER; ++x)
        if (lane + 32 * x < D) f[x] = p[2 + lane + 32 * x];
    } else {
      float ca, cb;
      fold_scalars(mt, lt, m, l, ca, cb);
#pragma unroll
      for (int x = 0; x < PER; ++x)
        if (lane + 32 * x < D) f[x] = fold_value(f[x], p[2 + lane + 32 * x], ca, cb);
    }
  }
  const int h = static_cast<int>((row / Tq) % Hq);
  const float sink2 = SINKS ? __fmul_rn(to_f32<T>(sinks[h]), LOG2E) : 0.0f;
  float c, ll;
  finalize_scalars(mt, lt, SINKS, sink2, c, ll);
#pragma unroll
  for (int x = 0; x < PER; ++x)
    if (lane + 32 * x < D) out[row * D + lane + 32 * x] = from_f32<T>(finalize_value(f[x], c, ll));
}

// float32 (no tensor cores, fmaf only): one warp per query row. The same 64-key blocks from
// the row's first valid key and the same online softmax; a block's scores are computed by its
// lanes (dot products in increasing head-dim order) and P V visits its keys in order. One
// code path whatever the query length, so a row's bits depend on that row alone.
template <int D, int MASK, bool SINKS>
__device__ void attention_f32(const float* q, const float* k, const float* v, const void* mask,
                              const float* sinks, const AttnShape& S, float scale, float* out) {
  constexpr int PER = (D + 31) / 32;
  __shared__ float qsh[4][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;
  const long long rows = static_cast<long long>(S.B) * S.Hq * S.Tq;
  if (row >= rows) return;
  const int i = static_cast<int>(row % S.Tq);
  const int h = static_cast<int>((row / S.Tq) % S.Hq);
  const int b = static_cast<int>(row / (static_cast<long long>(S.Tq) * S.Hq));
  const int kvh = h / S.R;
  float* o = out + row * D;
  int j0, jl;
  row_range<float, MASK>(S, mask, b, h, i, lane, j0, jl);
  const float scale_log2 = __fmul_rn(scale, LOG2E);
  const float* qrow = q + b * S.qs[0] + h * S.qs[1] + i * S.qs[2];
  for (int d = lane; d < D; d += 32) qsh[warp][d] = qrow[d * S.qs[3]];
  __syncwarp();
  const float* kb = k + b * S.ks[0] + kvh * S.ks[1];
  const float* vb = v + b * S.vs[0] + kvh * S.vs[1];
  const long long mrow = mask_row<MASK>(S, b, h, i), mcol = mask_col<MASK>(S);
  float m = NEG_INF, l = 0.0f, acc[PER];
#pragma unroll
  for (int x = 0; x < PER; ++x) acc[x] = 0.0f;
  for (int kb0 = j0; j0 != 0x7fffffff && kb0 <= jl; kb0 += ATT_KB) {
    float sc[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = kb0 + 32 * u + lane;
      bool ok = j <= jl;
      float add = 0.0f;
      if constexpr (MASK >= 2) {
        if (ok) ok = mask_ok<float, MASK>(mask, mrow + j * mcol, add);
      }
      sc[u] = NEG_INF;
      if (ok) {
        const float* kr = kb + j * S.ks[2];
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qsh[warp][d], kr[d * S.ks[3]], dot);
        sc[u] = __fmul_rn(dot, scale_log2);
        if constexpr (MASK == 3) sc[u] = fmaf(add, LOG2E, sc[u]);
      }
    }
    float mx = fmaxf(sc[0], sc[1]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float mn = fmaxf(m, mx);
    const float mu = mn == NEG_INF ? 0.0f : mn;
    const float alpha = ex2(__fsub_rn(m, mu));
    m = mn;
    const float p0 = ex2(__fsub_rn(sc[0], mu)), p1 = ex2(__fsub_rn(sc[1], mu));
    float rs = __fadd_rn(p0, p1);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) rs = __fadd_rn(rs, __shfl_xor_sync(0xffffffffu, rs, off));
    l = fmaf(l, alpha, rs);
#pragma unroll
    for (int x = 0; x < PER; ++x) acc[x] = __fmul_rn(acc[x], alpha);
    const int last = min(ATT_KB - 1, jl - kb0);
    for (int jj = 0; jj <= last; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, jj < 32 ? p0 : p1, jj & 31);
      const float* vr = vb + (kb0 + jj) * S.vs[2];
#pragma unroll
      for (int x = 0; x < PER; ++x) {
        const int d = lane + 32 * x;
        if (d < D) acc[x] = fmaf(pj, vr[d * S.vs[3]], acc[x]);
      }
    }
  }
  const float sink2 = SINKS ? __fmul_rn(sinks[h], LOG2E) : 0.0f;
  float c, ll;
  finalize_scalars(m, l, SINKS, sink2, c, ll);
#pragma unroll
  for (int x = 0; x < PER; ++x) {
    const int d = lane + 32 * x;
    if (d < D) o[d] = finalize_value(acc[x], c, ll);
  }
}

}  // namespace bi
