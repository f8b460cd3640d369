// The rollout engine's keyed draw and row fingerprint in one pass over the logits (needs
// common.cuh before it). bi_rl/rollout/sampler.py and bi_rl/logprobs.py define both as MLX
// ops; this computes the same values with the same float operations:
//
//   x_v = float(logit_v) / T                                     (IEEE division, rounded once)
//   u_v = (2 * (h_v >> 9) + 1) * 2^-24,  h_v = fmix32(fmix32(fmix32(v * 0x9E3779B9 + k0) ^ k1) + k0)
//   z_v = x_v - log(-log(u_v))          (greedy: z_v = x_v)
//   token = the first v with z_v = max z (the row's length V where any z_v is NaN)
//   fingerprint lane i = sum_v fmix32(bits(logit_v) ^ index_hash[i][v])   mod 2^32
//
// log is logf, the function MLX's own log kernels call (cuda::std::log on float), so every z_v
// has the bits the MLX ops give. Nothing here is a floating-point reduction: the maximum with
// its first index is a maximum under a total order ((z, smaller index) wins ties), and the
// fingerprint lanes are wrapping integer sums, so neither depends on how the row is split
// between threads and blocks, on the batch, or on any other row.
//
// Two kernels. `sample_partial`: block (chunk c, row r) covers SAMPLE_CHUNK columns of row r
// and writes (best z bits, best index, lane 0 sum, lane 1 sum) to partial[r][c]; a chunk with
// a NaN z writes NaN as its z. `sample_combine`: one thread a row folds the row's chunks into
// the token and the two fingerprint lanes.

namespace bi {

constexpr int SAMPLE_THREADS = 256;
constexpr int SAMPLE_CHUNK = 4096;  // columns a block of sample_partial covers
constexpr u32 SAMPLE_NONE = 0x7fffffffu;  // index of "no element yet": loses every tie

__device__ __forceinline__ u32 fmix32u(u32 x) {
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}

template <typename T>
__device__ __forceinline__ u32 logit_bits(T x);
template <>
__device__ __forceinline__ u32 logit_bits<float>(float x) {
  return __float_as_uint(x);
}
template <>
__device__ __forceinline__ u32 logit_bits<__nv_bfloat16>(__nv_bfloat16 x) {
  return static_cast<u32>(*reinterpret_cast<const u16*>(&x));
}
template <>
__device__ __forceinline__ u32 logit_bits<__half>(__half x) {
  return static_cast<u32>(*reinterpret_cast<const u16*>(&x));
}

// (z, i) beats (best_z, best_i): a larger z, or the same z at a smaller index. z is never NaN.
__device__ __forceinline__ bool sample_beats(float z, u32 i, float best_z, u32 best_i) {
  return z > best_z || (z == best_z && i < best_i);
}

struct SampleState {
  float z;
  u32 i;
  u32 nan;
  u32 lane0;
  u32 lane1;
};

__device__ __forceinline__ void sample_fold(SampleState& a, const SampleState& b) {
  if (sample_beats(b.z, b.i, a.z, a.i)) {
    a.z = b.z;
    a.i = b.i;
  }
  a.nan |= b.nan;
  a.lane0 += b.lane0;
  a.lane1 += b.lane1;
}

// logits: (rows, V) read through (row_stride, col_stride); keys: (rows, 2) uint32 read
// through (key_row, key_col);
// index_hash: (2, V) uint32, dense (bi_rl.logprobs' per-lane index hashes); t: the temperature
// (1 for greedy); partial: (rows, chunks, 4) uint32.
template <typename T, bool GREEDY>
__device__ void sample_partial(const T* logits, long long row_stride, long long col_stride,
                               const u32* keys, long long key_row, long long key_col,
                               const u32* index_hash, float t, u32* partial, int vocab,
                               int chunks) {
  const int c = blockIdx.x;
  const int r = blockIdx.y;
  const T* row = logits + r * row_stride;
  const u32 k0 = keys[r * key_row];
  const u32 k1 = keys[r * key_row + key_col];
  SampleState s{-cuda::std::numeric_limits<float>::infinity(), SAMPLE_NONE, 0u, 0u, 0u};
  const int end = min(vocab, (c + 1) * SAMPLE_CHUNK);
  for (int v = c * SAMPLE_CHUNK + static_cast<int>(threadIdx.x); v < end; v += SAMPLE_THREADS) {
    const T raw = row[v * col_stride];
    const u32 bits = logit_bits<T>(raw);
    s.lane0 += fmix32u(bits ^ index_hash[v]);
    s.lane1 += fmix32u(bits ^ index_hash[vocab + v]);
    float z = __fdiv_rn(to_f32<T>(raw), t);
    if constexpr (!GREEDY) {
      const u32 h = fmix32u(fmix32u(fmix32u(static_cast<u32>(v) * 0x9E3779B9u + k0) ^ k1) + k0);
      const float u = __fmul_rn(static_cast<float>((h >> 9) * 2u + 1u), 5.9604644775390625e-08f);
      z = __fsub_rn(z, logf(-logf(u)));
    }
    if (isnan(z)) {
      s.nan = 1u;
    } else if (sample_beats(z, static_cast<u32>(v), s.z, s.i)) {
      s.z = z;
      s.i = static_cast<u32>(v);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    SampleState other{__shfl_xor_sync(0xffffffffu, s.z, o), __shfl_xor_sync(0xffffffffu, s.i, o),
                      __shfl_xor_sync(0xffffffffu, s.nan, o),
                      __shfl_xor_sync(0xffffffffu, s.lane0, o),
                      __shfl_xor_sync(0xffffffffu, s.lane1, o)};
    sample_fold(s, other);
  }
  __shared__ SampleState warps[SAMPLE_THREADS / 32];
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) warps[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < SAMPLE_THREADS / 32; ++w) sample_fold(s, warps[w]);
    u32* out = partial + (static_cast<long long>(r) * chunks + c) * 4;
    out[0] = s.nan ? 0x7fc00000u : __float_as_uint(s.z);
    out[1] = s.i;
    out[2] = s.lane0;
    out[3] = s.lane1;
  }
}

// partial: (rows, chunks, 4) from sample_partial; tokens: (rows,) int32; fingerprints:
// (rows, 2) uint32.
__device__ void sample_combine(const u32* partial, int* tokens, u32* fingerprints, int rows,
                               int chunks, int vocab) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const u32* p = partial + static_cast<long long>(r) * chunks * 4;
  SampleState s{-cuda::std::numeric_limits<float>::infinity(), SAMPLE_NONE, 0u, 0u, 0u};
  for (int c = 0; c < chunks; ++c) {
    const float z = __uint_as_float(p[4 * c]);
    SampleState o{z, p[4 * c + 1], isnan(z) ? 1u : 0u, p[4 * c + 2], p[4 * c + 3]};
    if (o.nan) o.z = -cuda::std::numeric_limits<float>::infinity();
    sample_fold(s, o);
  }
  tokens[r] = s.nan ? vocab : static_cast<int>(s.i);
  fingerprints[2 * r] = s.lane0;
  fingerprints[2 * r + 1] = s.lane1;
}

}  // namespace bi
