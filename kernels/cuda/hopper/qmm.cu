// Batch-invariant quantized GEMM on Hopper tensor cores: out = x @ dequantize(w).T for MLX's
// affine 2/3/4/5/6/8-bit formats, groups of 32, 64 or 128 (needs gemm.cu before it).
//
// Why row m's bits cannot depend on the batch: this is gemm.cu's main loop, with the B tile of
// each k-tile made from the packed weight instead of copied. The dequantised tile is a function
// of (w, scales, biases, k-tile) alone, the same bits whichever rows of x are computed beside
// it, and the reduction is gemm.cu's: one wgmma chain per output element over K in order.
//
// mx.quantize packs row n of w (N, K) as a little-endian stream of BITS-bit values q in uint32
// words, one scale s and bias b per group of GS consecutive k: w[n, k] = s * q + b. Each stage
// holds the packed bytes of BN rows x 64 k (8 * BITS bytes a row) and the scales and biases
// those rows need; before the tensor cores read a k-tile, the block turns it into a BN x 64
// bf16/f16 tile, each value s q + b rounded once to the half type (DequantPair), in the
// swizzled layout, while the tensor cores work on the stage before it.

namespace bih {

// Dequantisation, shared by this file's wgmma kernels and qmm_narrow.cu's few-row ones, so
// that both give every weight the same bits: w = s q + b for the group's scale s and bias b
// (half-type values), rounded once to the half type, two values at a time by one fma.rn on a
// half2 pair (the half types' fma rounds the exact s q + b once). q is first made exactly in
// the half type: its bits go under a half whose unit in the last place is 1 at bit 0 (the
// magic: 1024 for f16, 128 for bf16), and subtracting the magic leaves q exactly. bf16 has
// 8 significant bits, so its 8-bit values (up to 255 beside the magic's own bit) are made as
// floats instead (the same exact q, one more instruction a pair).
//
// The constants are kept in registers made from a kernel argument (whose value the compiler
// cannot know), so that one LOP3 masks the pair and ORs the magic in: with both as
// immediates ptxas splits them into two instructions (an instruction takes one immediate).
template <bool F16, int BITS>
struct DequantPair {
  static constexpr bool VIA_FLOAT = !F16 && BITS == 8;
  // the half route: BITS low bits of each half, and the magic in each half; the float
  // route: its exponent words 2^23 (ulp 1 at bit 0) and 2^15 (ulp 1 at bit 8)
  u32 mask2, magic2;

  // gshift: the weight's log2 group size (5, 6 or 7), so that gshift >> 16 is 0.
  __device__ __forceinline__ static DequantPair make(int gshift) {
    const u32 zero = static_cast<u32>(gshift) >> 16;
    if constexpr (VIA_FLOAT) {
      return {0x4B000000u | zero, 0x47000000u | zero};
    } else {
      return {((1u << BITS) - 1u) * 0x10001u | zero, (F16 ? 0x64006400u : 0x43004300u) | zero};
    }
  }

  // The pair v (q0 at bits 0 .. BITS - 1, q1 above it; nothing above 2 BITS) as two exact
  // half-type values, q0 low.
  __device__ __forceinline__ u32 exact_q(u32 v) const {
    if constexpr (VIA_FLOAT) {
      const float q0 = __fsub_rn(__uint_as_float(mask2 | (v & 0xFFu)), 8388608.0f);
      const float q1 = __fsub_rn(__uint_as_float(magic2 | (v & 0xFF00u)), 32768.0f);
      return pack_half2<false>(q0, q1);  // exact: q < 2^8
    } else {
      // q1 to bit 16: a multiply where the two copies cannot overlap (so no carry), else a
      // shift and OR; the mask then keeps q0 and q1 alone under the magic
      const u32 both = 3 * BITS <= 16 ? v * (1u + (1u << (16 - BITS))) : v | (v << (16 - BITS));
      const u32 x = (both & mask2) | magic2;
      u32 q;
      if constexpr (F16)
        asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(q) : "r"(x), "r"(magic2));
      else
        asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(q) : "r"(x), "r"(magic2));
      return q;
    }
  }

  // s q + b of the pair, rounded once; s2, b2: the scale and bias in both halves.
  __device__ __forceinline__ u32 operator()(u32 v, u32 s2, u32 b2) const {
    const u32 q = exact_q(v);
    u32 w;
    if constexpr (F16)
      asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(w) : "r"(q), "r"(s2), "r"(b2));
    else
      asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(w) : "r"(q), "r"(s2), "r"(b2));
    return w;
  }
};

// A half-type value in both halves of a word.
__device__ __forceinline__ u32 dup_half(u16 h) { return static_cast<u32>(h) * 0x10001u; }

// Packed operand: row n's bytes from w + n * w_row; scales/biases element (n, g) at
// s[n * s_row + g] (their column stride must be 1).
struct QuantOperand {
  const unsigned char* w;
  long long w_row;  // bytes
  const u16* sc;
  const u16* bi;
  long long s_row, b_row;      // elements
  long long s_total, b_total;  // elements one may read from sc / bi (bounds of the last row)
  int gshift;                  // log2 of the group size
};

template <int BITS, int BN, int KT, int THREADS, bool F16>
struct QuantB {
  static constexpr bool DEQUANT = true;
  static constexpr int ROW_BYTES = 8 * BITS;         // 64 k of one row
  static constexpr int CH = BITS % 2 == 0 ? 16 : 8;  // cp.async width
  static constexpr int CHUNKS = ROW_BYTES / CH;      // per row
  static constexpr int W_BYTES = BN * ROW_BYTES;     // per k-tile
  // per row and k-tile: the 4 scales and 4 biases from the even element at or before the
  // k-tile's first group (two 4-byte words each), which cover the tile's one or two groups
  static constexpr int SB_BYTES = BN * 16;
  static constexpr int STAGE_BYTES = (KT * (W_BYTES + SB_BYTES) + 1023) / 1024 * 1024;
  static constexpr int TILE_BYTES = BN * BK * 2;                // one dequantised k-tile
  static constexpr int EXTRA_BYTES = 3 * KT * TILE_BYTES;       // three rotating buffers
  QuantOperand q;
  int n0, N;
  u32 extra;  // the rotating buffers, after the stages
  bool vec;

  __device__ void init(int n0_, int N_, u32 extra_) {
    n0 = n0_;
    N = N_;
    extra = extra_;
    const auto addr = [](const void* p) { return reinterpret_cast<unsigned long long>(p); };
    vec = (addr(q.w) % CH) == 0 && (q.w_row % CH) == 0 && (addr(q.sc) % 4) == 0 &&
          (addr(q.bi) % 4) == 0;
  }

  // First element (even) of the 4 scales or biases staged for row n at k-tile kt.
  __device__ __forceinline__ long long first(long long row_stride, int n, int kt) const {
    return (n * row_stride + ((kt * BK) >> q.gshift)) & ~1ll;
  }

  // tid: this thread's index among the THREADS that copy (default: the block's).
  __device__ __forceinline__ void load(u32 stage_b, int kt0, int K, unsigned tid = threadIdx.x) {
    const long long row_len = (static_cast<long long>(K) * BITS) / 8;
#pragma unroll 1
    for (int j = 0; j < KT; ++j) {
      const int kt = kt0 + j;
      const long long off0 = static_cast<long long>(kt) * ROW_BYTES;
      for (int u = tid; u < BN * CHUNKS; u += THREADS) {
        const int r = u / CHUNKS, c = u % CHUNKS, n = n0 + r;
        if (n >= N) continue;  // columns past N are discarded
        const long long off = off0 + c * CH;
        const long long left = row_len - off;
        const u32 nbytes = left >= CH ? CH : (left > 0 ? static_cast<u32>(left) : 0u);
        const unsigned char* src = q.w + n * q.w_row + (nbytes ? off : 0);
        const u32 dst = stage_b + j * W_BYTES + r * ROW_BYTES + c * CH;
        if (vec) {
          if constexpr (CH == 16) {
            cp_async16(dst, src, nbytes);
          } else {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                         "r"(nbytes)
                         : "memory");
          }
        } else {
          for (int b = 0; b < CH; ++b) {
            const u32 v = b < static_cast<int>(nbytes) ? src[b] : 0u;
            asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(dst + b), "r"(v) : "memory");
          }
        }
      }
      for (int u = tid; u < BN * 4; u += THREADS) {
        const int r = u >> 2, which = u & 3, n = n0 + r;
        if (n >= N || kt * BK >= K) continue;
        const bool bias = which >= 2;
        const u16* arr = bias ? q.bi : q.sc;
        const long long e = first(bias ? q.b_row : q.s_row, n, kt) + 2 * (which & 1);
        const long long left = (bias ? q.b_total : q.s_total) - e;
        const u32 nbytes = left >= 2 ? 4u : (left == 1 ? 2u : 0u);
        const u32 dst = stage_b + KT * W_BYTES + j * SB_BYTES + r * 16 + which * 4;
        const u16* src = arr + (nbytes ? e : 0);
        if (vec) {
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                       "r"(nbytes)
                       : "memory");
        } else {
          const u32 lo = nbytes >= 2 ? src[0] : 0u, hi = nbytes >= 4 ? src[1] : 0u;
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(lo | (hi << 16)) : "memory");
        }
      }
    }
  }

  // The dequantised tiles of stage st (KT of them, TILE_BYTES apart).
  __device__ __forceinline__ u32 tiles(u32, int st) const {
    return extra + (st % 3) * KT * TILE_BYTES;
  }

  // Dequantises the KT k-tiles of stage st (from kt0) into its buffer. The caller orders these
  // writes before the tensor cores' reads (proxy fence and barrier).
  //
  // A thread owns the units (row r, chunk column c = tid % 8) u = tid + i * THREADS of each
  // k-tile of the stage. It first issues the shared-memory loads of all its units of all KT
  // k-tiles (packed values, scale, bias), then converts and stores them: the loads' latencies
  // overlap instead of adding up, which matters at decode sizes, where one warpgroup per block
  // has little else to do. Each value is DequantPair's whatever the order of the units, so the
  // tiles' bits are the same.
  __device__ __forceinline__ void prepare(u32 stage_b, int st, int kt0, int K) {
    constexpr int UNITS = (BN * 8 + THREADS - 1) / THREADS;
    constexpr int ALL = KT * UNITS;
    const u32 dst0 = tiles(stage_b, st);
    const int c = threadIdx.x & 7;  // every unit of a thread has the same chunk column
    const auto dq = DequantPair<F16, BITS>::make(q.gshift);
    u16 sh[ALL], bh[ALL];
    unsigned long long v[ALL];
#pragma unroll
    for (int x = 0; x < ALL; ++x) {
      const int j = x / UNITS, i = x % UNITS;
      const int kt = kt0 + j, k = kt * BK + 8 * c, g = k >> q.gshift;
      const int u = threadIdx.x + i * THREADS, r = u >> 3, n = n0 + r;
      const u32 packed = stage_b + j * W_BYTES, sb = stage_b + KT * W_BYTES + j * SB_BYTES;
      sh[x] = bh[x] = 0;
      v[x] = 0;
      if (u >= BN * 8 || n >= N || k >= K) continue;
      const int rs = static_cast<int>(n * q.s_row + g - first(q.s_row, n, kt));
      const int rb = static_cast<int>(n * q.b_row + g - first(q.b_row, n, kt));
      asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(sh[x]) : "r"(sb + r * 16 + rs * 2));
      asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(bh[x]) : "r"(sb + r * 16 + 8 + rb * 2));
      const u32 at = packed + r * ROW_BYTES + c * BITS;  // the 8 values' BITS bytes
      if constexpr (BITS == 8) {
        asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v[x]) : "r"(at));
      } else if constexpr (BITS == 4) {
        u32 w;
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w) : "r"(at));
        v[x] = w;
      } else if constexpr (BITS == 2) {
        u16 w;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(w) : "r"(at));
        v[x] = w;
      } else {
#pragma unroll
        for (int b = 0; b < BITS; ++b) {
          u32 byte;
          asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(byte) : "r"(at + b));
          v[x] |= static_cast<unsigned long long>(byte) << (8 * b);
        }
      }
    }
#pragma unroll
    for (int x = 0; x < ALL; ++x) {
      const int j = x / UNITS, i = x % UNITS;
      const int k = (kt0 + j) * BK + 8 * c;
      const int u = threadIdx.x + i * THREADS, r = u >> 3, n = n0 + r;
      if (u >= BN * 8 || n >= N) continue;
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
      if (k < K) {  // K is a whole number of groups (of 32 or more), so 8 values are in or out
        const u32 s2 = dup_half(sh[x]), b2 = dup_half(bh[x]);
        u32 p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          p[e] = dq(static_cast<u32>(v[x] >> (2 * BITS * e)) & ((1u << (2 * BITS)) - 1u), s2, b2);
        out = make_uint4(p[0], p[1], p[2], p[3]);
      }
      st_shared16(dst0 + j * TILE_BYTES + sw128_offset(r, c), out);
    }
  }
};

template <bool F16, int BN, int NWG, int RT, int KT, int STAGES, int BITS>
__device__ __forceinline__ void qmm(const Operand& X, const QuantOperand& W, u16* out, int M,
                                    int N, int K, int tile = -1) {
  QuantB<BITS, BN, KT, 128 * NWG, F16> bsrc{W};
  gemm_main<F16, BN, NWG, RT, KT, STAGES, false>(X, bsrc, nullptr, 0, 0, out, M, N, K, 1.0f,
                                                 0.0f, tile);
}

}  // namespace bih
