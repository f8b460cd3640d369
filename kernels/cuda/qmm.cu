// Batch-invariant quantized GEMM: out = x @ dequantize(w).T for MLX's affine 2-8-bit formats.
//
// mx.quantize packs a row of w (N, K) as a little-endian bit stream of BITS-bit values in
// uint32 words (for 2/4/8 bits: value k at bit BITS * (k % (32 / BITS)) of word
// k / (32 / BITS); 3/5/6 bits cross word boundaries), with one scale and one bias per group of
// GS = 2^gshift consecutive k: w[n, k] = scale[n, k / GS] * q + bias[n, k / GS]. This source is
// a B-operand policy for the GEMM kernels (gemm_common.cuh and a kernel file before it): the weight is
// dequantised inside the K loop (fmaf in fp32, rounded once to the activation type), and the
// reduction over K is gemm_common.cuh's, fixed by K alone, so every row is invariant across M.

namespace bi {

template <typename T, int BITS>
struct QuantRows {
  const u32* wq;
  const T* sc;
  const T* bs;
  long long s_w, s_wk, s_s, s_sk, s_b, s_bk;  // (row, column) strides of words, scales, biases
  int rows, K;
  int gshift;  // log2 of the group size (32, 64 or 128)

  // Dequantised values k0..k0+7 of row r (k0 % 8 == 0; K % 32 == 0 so they are in range).
  __device__ __forceinline__ uint4 load8(int r, int k0) const {
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
    if (r >= rows) return out;
    const long long rr = static_cast<long long>(r);
    const int grp = k0 >> gshift;
    const float s = to_f32<T>(sc[rr * s_s + grp * s_sk]);
    const float b = to_f32<T>(bs[rr * s_b + grp * s_bk]);
    const u32* row = wq + rr * s_w;
    u32 q[8];
    if constexpr (BITS == 4) {
      const u32 w = __ldg(row + (k0 / 8) * s_wk);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = (w >> (4 * i)) & 15u;
    } else if constexpr (BITS == 2) {
      const u32 w = __ldg(row + (k0 / 16) * s_wk) >> (2 * (k0 % 16));
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = (w >> (2 * i)) & 3u;
    } else if constexpr (BITS == 8) {
      const u32 w0 = __ldg(row + (k0 / 4) * s_wk), w1 = __ldg(row + (k0 / 4 + 1) * s_wk);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q[i] = (w0 >> (8 * i)) & 255u;
        q[i + 4] = (w1 >> (8 * i)) & 255u;
      }
    } else {
      // 3, 5, 6 bits: a little-endian bit stream; values k0..k0+7 are the BITS bytes from
      // byte k0 * BITS / 8 of the row (the packed words are contiguous along a row).
      const unsigned char* bytes = reinterpret_cast<const unsigned char*>(row) + (k0 / 8) * BITS;
      unsigned long long v = 0;
#pragma unroll
      for (int i = 0; i < BITS; ++i) v |= static_cast<unsigned long long>(bytes[i]) << (8 * i);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = static_cast<u32>(v >> (BITS * i)) & ((1u << BITS) - 1u);
    }
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = fmaf(s, static_cast<float>(q[i]), b);
    out.x = pack2<T>(v[0], v[1]);
    out.y = pack2<T>(v[2], v[3]);
    out.z = pack2<T>(v[4], v[5]);
    out.w = pack2<T>(v[6], v[7]);
    return out;
  }

  __device__ __forceinline__ void copy8(u16* dst, int r, int k0) const {
    *reinterpret_cast<uint4*>(dst) = load8(r, k0);
  }
};

}  // namespace bi
