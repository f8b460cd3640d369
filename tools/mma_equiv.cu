// Do Hopper's two tensor-core MMA families give the same fp32 bits for the same chain of k16
// steps? A design question, answered on the device in seconds:
//
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/mma_equiv \
//       tools/mma_equiv.cu && /tmp/mma_equiv
//
// For a 64 x N output, each element is accumulated from +0 over k = 0..15, 16..31, ... in
// increasing order, once by a chain of `mma.sync.m16n8k16` (one warp per 16 rows, one
// instruction per 8 columns and k16 step: what the portable GEMM and the attention kernel
// use) and once by a chain of `wgmma.mma_async.m64nNk16` (one warpgroup, both operands in
// shared memory in the 128-byte swizzle layout: what the Hopper GEMM family uses). If every
// element's bits agree over many inputs, decode (few rows) and prefill (many rows) may use
// different families and still give the same bits; if not, every path of one computation
// must use one family. A third column is a plain fp32 `fmaf` chain over single k, a negative
// control: it differs from the tensor cores, so the comparison can see a difference.
//
// Inputs: bf16 and f16, K from 16 to 512, several value distributions (normal, wide exponent
// range, cancelling pairs, raw finite bit patterns). Prints differing elements per case and
// exits 1 if the two MMA families ever differ (0 if they agree everywhere).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../kernels/cuda/hopper/common.cuh"
#include "../kernels/cuda/hopper/wgmma_ops.cuh"

using bih::u16;
using bih::u32;
using bih::u64;

constexpr int M = 64;
constexpr int N = 64;

#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

// One warpgroup: A (M x K) and B (N x K), row-major 16-bit, staged k-tile by k-tile into the
// swizzled layout, then one wgmma chain over every k16 step in order.
template <bool F16>
__global__ void wgmma_chain(const u16* a, const u16* b, int K, float* out) {
  __shared__ __align__(1024) unsigned char smem[(M + N) * 128 + 1024];
  const u32 base = (bih::smem_u32(smem) + 1023u) & ~1023u;
  const u32 sa = base, sb = base + M * 128;
  unsigned char* gen = smem + (base - bih::smem_u32(smem));
  float acc[N / 2];
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 64) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < (M + N) * 8; idx += blockDim.x) {
      const bool is_a = idx < M * 8;
      const int r = (is_a ? idx : idx - M * 8) / 8, c = idx % 8;
      const u16* src = (is_a ? a : b) + static_cast<long long>(r) * K + k0 + 8 * c;
      u32 w[4];
      for (int j = 0; j < 4; ++j) {
        const int k = k0 + 8 * c + 2 * j;
        w[j] = (k < K ? src[2 * j] : 0u) | ((k + 1 < K ? src[2 * j + 1] : 0u) << 16);
      }
      *reinterpret_cast<uint4*>(gen + (is_a ? 0 : M * 128) + bih::sw128_offset(r, c)) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    bih::fence_async_shared();
    __syncthreads();
    bih::fence_regs(acc);
    bih::wgmma_fence();
    const u64 da = bih::sw128_desc(sa), db = bih::sw128_desc(sb);
    for (int s = 0; s < 4 && k0 + 16 * s < K; ++s) {
      bih::Wgmma<N, F16>::mma(acc, da + 2 * s, db + 2 * s);
    }
    bih::wgmma_commit();
    bih::wgmma_wait<0>();
    bih::fence_regs(acc);
  }
  // acc[4j + e]: row 16 w + l / 4 (+ 8 for e >= 2), column 8 j + 2 (l % 4) + (e & 1).
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = 0; j < N / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + lane / 4 + (e >= 2 ? 8 : 0);
      const int c = 8 * j + 2 * (lane % 4) + (e & 1);
      out[r * N + c] = acc[4 * j + e];
    }
  }
}

__device__ __forceinline__ u32 pair(const u16* p) {
  return static_cast<u32>(p[0]) | (static_cast<u32>(p[1]) << 16);
}

// Four warps, 16 rows each: one mma.sync.m16n8k16 chain per 8-column tile, k16 steps in order.
template <bool F16>
__global__ void mma_sync_chain(const u16* a, const u16* b, int K, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  for (int j = 0; j < N / 8; ++j) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int n = 8 * j + g;
    for (int k = 0; k < K; k += 16) {
      const u32 a0 = pair(a + r0 * K + k + 2 * t), a1 = pair(a + r1 * K + k + 2 * t);
      const u32 a2 = pair(a + r0 * K + k + 8 + 2 * t), a3 = pair(a + r1 * K + k + 8 + 2 * t);
      const u32 b0 = pair(b + n * K + k + 2 * t), b1 = pair(b + n * K + k + 8 + 2 * t);
      if constexpr (F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
      }
    }
    const int c = 8 * j + 2 * t;
    out[r0 * N + c] = d[0];
    out[r0 * N + c + 1] = d[1];
    out[r1 * N + c] = d[2];
    out[r1 * N + c + 1] = d[3];
  }
}

// The negative control: one fmaf per k, in order, from +0.
template <bool F16>
__global__ void fma_chain(const u16* a, const u16* b, int K, float* out) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= M * N) return;
  const int r = idx / N, c = idx % N;
  float s = 0.0f;
  for (int k = 0; k < K; ++k) {
    s = fmaf(bih::half_to_f32<F16>(a[r * K + k]), bih::half_to_f32<F16>(b[c * K + k]), s);
  }
  out[idx] = s;
}

static u16 to_half_bits(float x, bool f16) {
  u32 u;
  std::memcpy(&u, &x, 4);
  if (!f16) {  // bf16, round to nearest even
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<u16>(u >> 16);
  }
  // f16 through the host's conversion is not needed exactly: any finite f16 pattern will do,
  // so build it from sign, a clamped exponent and the top mantissa bits.
  const u32 sign = (u >> 16) & 0x8000u;
  int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  if (e <= 0) return static_cast<u16>(sign);
  if (e >= 31) e = 30;
  return static_cast<u16>(sign | (static_cast<u32>(e) << 10) | ((u >> 13) & 0x3FFu));
}

static void fill(std::vector<u16>& v, int dist, bool f16, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ed(-12, 12);
  std::uniform_int_distribution<u32> bits(0, 0xFFFF);
  for (size_t i = 0; i < v.size(); ++i) {
    float x = nd(rng);
    switch (dist) {
      case 0:  // normal
        break;
      case 1:  // wide exponent range: products span many binades
        x = std::ldexp(x, ed(rng));
        break;
      case 2:  // cancelling neighbours: partial sums far below the terms
        x = std::ldexp(1.0f, ed(rng));
        if (i % 2) x = -x * (1.0f + 1e-2f * nd(rng));
        break;
      default: {  // raw bit patterns of finite values (exponents capped to keep sums finite)
        u16 h = static_cast<u16>(bits(rng));
        if (f16) {
          if (((h >> 10) & 0x1F) > 20) h = static_cast<u16>((h & 0x83FFu) | (20u << 10));
        } else if (((h >> 7) & 0xFF) > 140 || ((h >> 7) & 0xFF) < 100) {
          h = static_cast<u16>((h & 0x807Fu) | (120u << 7));
        }
        v[i] = h;
        continue;
      }
    }
    v[i] = to_half_bits(x, f16);
  }
}

template <bool F16>
static long long run(int dist, int K, int seed, long long& control) {
  std::mt19937 rng(seed);
  std::vector<u16> ha(M * K), hb(N * K);
  fill(ha, dist, F16, rng);
  fill(hb, dist, F16, rng);
  u16 *da, *db;
  float *ow, *om, *of;
  CHECK(cudaMalloc(&da, ha.size() * 2));
  CHECK(cudaMalloc(&db, hb.size() * 2));
  CHECK(cudaMalloc(&ow, M * N * 4));
  CHECK(cudaMalloc(&om, M * N * 4));
  CHECK(cudaMalloc(&of, M * N * 4));
  CHECK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  wgmma_chain<F16><<<1, 128>>>(da, db, K, ow);
  mma_sync_chain<F16><<<1, 128>>>(da, db, K, om);
  fma_chain<F16><<<(M * N + 127) / 128, 128>>>(da, db, K, of);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<u32> w(M * N), m(M * N), f(M * N);
  CHECK(cudaMemcpy(w.data(), ow, M * N * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(m.data(), om, M * N * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(f.data(), of, M * N * 4, cudaMemcpyDeviceToHost));
  long long differ = 0;
  for (int i = 0; i < M * N; ++i) {
    differ += w[i] != m[i];
    control += w[i] != f[i];
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(ow);
  cudaFree(om);
  cudaFree(of);
  return differ;
}

int main() {
  const char* names[] = {"normal", "wide exponents", "cancelling pairs", "raw bits"};
  long long total = 0, compared = 0, control = 0;
  std::printf("%-5s %-17s %5s %12s %12s %14s\n", "type", "values", "K", "elements",
              "mma!=wgmma", "fmaf!=wgmma");
  for (int f16 = 0; f16 < 2; ++f16) {
    for (int dist = 0; dist < 4; ++dist) {
      for (int K : {16, 32, 48, 64, 128, 256, 512}) {
        long long differ = 0, ctrl = 0;
        for (int seed = 0; seed < 8; ++seed) {
          differ += f16 ? run<true>(dist, K, 1000 * dist + seed, ctrl)
                        : run<false>(dist, K, 1000 * dist + seed, ctrl);
        }
        std::printf("%-5s %-17s %5d %12d %12lld %14lld\n", f16 ? "f16" : "bf16", names[dist], K,
                    8 * M * N, differ, ctrl);
        total += differ;
        control += ctrl;
        compared += 8LL * M * N;
      }
    }
  }
  std::printf("\n%lld of %lld elements differ between mma.sync and wgmma chains; "
              "the fmaf control differs in %lld\n", total, compared, control);
  if (control == 0) {
    std::printf("control never differed: the comparison is not shown able to see a difference\n");
    return 3;
  }
  return total == 0 ? 0 : 1;
}
