// The prefill attention's schedules against each other without MLX (a check that needs no
// MLX CUDA wheel on the machine, only nvcc and a Hopper GPU): the same bf16 inputs through two
// warpgroups a block in lockstep, two in ping-pong (kernels/cuda/hopper/attention.cu, PP) and
// one warpgroup a block; the output bits of each compared with lockstep's (a schedule may change
// speed only), then each timed with CUDA events, the three alternating over seven rounds.
// Cases: a window (many passes a block, the ping-pong hand-offs carrying their phases across
// them), no mask, 4,097 causal tokens (a split and a block edge one key past), eight sequences
// of 606 tokens (bi-bench's rescoring at B = 8), 2,048-16,384 tokens at head dims 128 and 64;
// Qwen3-1.7B's heads (16 query / 8 KV), contiguous (B, H, T, D) as hopper_attention.launch
// passes them. Build and run from the repository root on the GPU's machine:
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/attn_schedule_check \
//     tools/attn_schedule_check.cu && /tmp/attn_schedule_check
// (`/tmp/attn_schedule_check quick`: four small cases, bits only, for compute-sanitizer.)
// One JSON line a case: differing elements (ping-pong and one warpgroup against lockstep),
// lockstep elements left unwritten (its output starts as NaN bits no row produces), median ms a
// launch of each schedule, ping-pong / lockstep; then a summary line, and exit status 1 where
// any schedule's bits differed or any element was left unwritten.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

#include "cuda_check.h"
#include "../kernels/cuda/hopper/common.cuh"
#include "../kernels/cuda/hopper/tma.cuh"
#include "../kernels/cuda/hopper/wgmma_ops.cuh"
#include "../kernels/cuda/hopper/wgmma_rs.cuh"
#include "../kernels/cuda/attention_rows.cuh"
#include "../kernels/cuda/hopper/attention.cu"

template <int D, int MASK, int STAGES, int NWG, bool PP, bool TMA>
__global__ void schedule_attn(const unsigned short* q, const unsigned short* k,
                              const unsigned short* v, unsigned short* out, int B, int Hq, int T,
                              int Hkv, int W, float scale, unsigned char* maps) {
  bih::AttnShape S;
  S.B = B; S.Hq = Hq; S.Tq = T; S.Hkv = Hkv; S.Tk = T; S.R = Hq / Hkv; S.W = W;
  const long long qs[4] = {1LL * Hq * T * D, 1LL * T * D, D, 1};
  const long long ks[4] = {1LL * Hkv * T * D, 1LL * T * D, D, 1};
  for (int d = 0; d < 4; ++d) {
    S.qs[d] = qs[d]; S.ks[d] = ks[d]; S.vs[d] = ks[d];
    S.mshape[d] = 1; S.ms[d] = 0;
  }
  bih::attention_wg<false, D, MASK, STAGES, NWG, PP, TMA>(q, k, v, nullptr, S, scale, out, maps);
}

using Kern = void (*)(const unsigned short*, const unsigned short*, const unsigned short*,
                      unsigned short*, int, int, int, int, int, float, unsigned char*);
unsigned char* g_maps = nullptr;  // the TMA schedule's tensor maps, 256 bytes a block

struct Sched {
  Kern f;
  int nwg;
  int smem;
};

template <int D, int MASK, int STAGES, int NWG, bool PP, bool TMA = false>
Sched make() {
  const int smem = bih::attention_wg_smem<D, STAGES, NWG, TMA>();
  Kern f = schedule_attn<D, MASK, STAGES, NWG, PP, TMA>;
  CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return {f, NWG, smem};
}

struct Case {
  int B, T, D, mask, W;
};

static void launch(const Sched& s, const Case& c, const unsigned short* q, const unsigned short* k,
                   const unsigned short* v, unsigned short* o) {
  const int Hq = 16, Hkv = 8, rows = c.T * (Hq / Hkv);
  const int blocks = c.B * Hkv * ((rows + 64 * s.nwg - 1) / (64 * s.nwg));
  // (the maps' start 8 bytes past an alignment: the kernel aligns it)
  s.f<<<blocks, 128 * s.nwg, s.smem>>>(q, k, v, o, c.B, Hq, c.T, Hkv, c.W,
                                       1.0f / std::sqrt((float)c.D), g_maps + 8);
}

static long long differ(const std::vector<unsigned short>& a, const std::vector<unsigned short>& b) {
  long long n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Whether every schedule gave lockstep's bits and lockstep wrote every element.
static bool run(const Case& c, Sched lock, Sched pp, Sched x1, Sched tma, bool timed) {
  const int Hq = 16, Hkv = 8;
  const size_t nq = (size_t)c.B * Hq * c.T * c.D, nk = (size_t)c.B * Hkv * c.T * c.D;
  std::vector<unsigned short> hq(nq), hk(nk), hv(nk);
  unsigned int seed = 12345u + c.T * 7u + c.D + c.B * 131u + c.W;
  auto rnd = [&]() {
    seed = seed * 1664525u + 1013904223u;
    return ((seed >> 8) & 0xFFFF) / 32768.0f - 1.0f;
  };
  for (auto& x : hq) x = bf16_bits(rnd());
  for (auto& x : hk) x = bf16_bits(rnd());
  for (auto& x : hv) x = bf16_bits(rnd());
  unsigned short *q, *k, *v, *o1, *o2, *o3, *o4;
  CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2));
  CK(cudaMalloc(&o1, nq * 2)); CK(cudaMalloc(&o2, nq * 2)); CK(cudaMalloc(&o3, nq * 2));
  CK(cudaMalloc(&o4, nq * 2));
  CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(o1, 0xFF, nq * 2)); CK(cudaMemset(o2, 0xEE, nq * 2)); CK(cudaMemset(o3, 0xDD, nq * 2));
  CK(cudaMemset(o4, 0xCC, nq * 2));
  launch(lock, c, q, k, v, o1);
  launch(pp, c, q, k, v, o2);
  launch(x1, c, q, k, v, o3);
  launch(tma, c, q, k, v, o4);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned short> r1(nq), r2(nq), r3(nq), r4(nq);
  CK(cudaMemcpy(r1.data(), o1, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r2.data(), o2, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r3.data(), o3, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r4.data(), o4, nq * 2, cudaMemcpyDeviceToHost));
  const long long d_pp = differ(r2, r1), d_x1 = differ(r3, r1), d_tma = differ(r4, r1);
  // the lockstep output was written (the 0xFFFF fill is a NaN no row produces)
  long long unwritten = 0;
  for (auto x : r1) unwritten += x == 0xFFFF;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const Sched* sides[4] = {&lock, &pp, &x1, &tma};
  std::vector<float> ms[4];
  const int iters = c.T >= 8192 ? 5 : 20;
  for (int round = 0; timed && round < 7; ++round) {
    for (int s = 0; s < 4; ++s) {
      launch(*sides[s], c, q, k, v, o1);
      CK(cudaEventRecord(e0));
      for (int i = 0; i < iters; ++i) launch(*sides[s], c, q, k, v, o1);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms[s].push_back(t / iters);
    }
  }
  float med[4] = {-1.0f, -1.0f, -1.0f, -1.0f};  // -1: not timed
  for (int s = 0; timed && s < 4; ++s) {
    std::sort(ms[s].begin(), ms[s].end());
    med[s] = ms[s][ms[s].size() / 2];
  }
  std::printf("{\"B\": %d, \"T\": %d, \"D\": %d, \"mask\": %d, \"W\": %d, \"differ_pp\": %lld, "
              "\"differ_x1\": %lld, \"differ_tma\": %lld, \"unwritten\": %lld, "
              "\"lockstep_ms\": %.4f, \"pingpong_ms\": %.4f, \"x1_ms\": %.4f, \"pp_tma_ms\": %.4f, "
              "\"pp/lockstep\": %.3f, \"pp_tma/pp\": %.3f}\n",
              c.B, c.T, c.D, c.mask, c.W, d_pp, d_x1, d_tma, unwritten, med[0], med[1], med[2],
              med[3], timed ? med[1] / med[0] : -1.0f, timed ? med[3] / med[1] : -1.0f);
  std::fflush(stdout);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o1); cudaFree(o2); cudaFree(o3); cudaFree(o4);
  return d_pp == 0 && d_x1 == 0 && d_tma == 0 && unwritten == 0;
}

int main(int argc, char** argv) {
  // "quick": small cases, bits only, no timing (for compute-sanitizer's racecheck and
  // synccheck, under which every launch runs many times slower)
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("# %s\n", p.name);
  auto l128 = make<128, 1, 3, 2, false>(), p128 = make<128, 1, 4, 2, true>();
  auto x128 = make<128, 1, 3, 1, false>(), t128 = make<128, 1, 4, 2, true, true>();
  auto l128n = make<128, 0, 3, 2, false>(), p128n = make<128, 0, 4, 2, true>();
  auto x128n = make<128, 0, 3, 1, false>(), t128n = make<128, 0, 4, 2, true, true>();
  auto l64 = make<64, 1, 3, 2, false>(), p64 = make<64, 1, 4, 2, true>();
  auto x64 = make<64, 1, 3, 1, false>(), t64 = make<64, 1, 4, 2, true, true>();
  CK(cudaMalloc(&g_maps, 256 * 4096 + 128));  // blocks of the largest case: 8 x 256
  const Case cases[] = {
      {1, 600, 128, 1, 256},  // a window: many passes a block
      {3, 1500, 128, 0, 0},   // no mask
      {1, 4097, 128, 1, 0},   {8, 606, 128, 1, 0},  {1, 2048, 128, 1, 0},
      {1, 8192, 128, 1, 0},   {1, 16384, 128, 1, 0}, {1, 2048, 64, 1, 0},
      {1, 8192, 64, 1, 0},
  };
  const Case small[] = {
      {1, 600, 128, 1, 256}, {2, 300, 128, 0, 0}, {1, 700, 128, 1, 0}, {1, 700, 64, 1, 0},
  };
  bool ok = true;
  for (const Case& c : quick ? std::vector<Case>(std::begin(small), std::end(small))
                             : std::vector<Case>(std::begin(cases), std::end(cases))) {
    if (c.D == 64)
      ok = run(c, l64, p64, x64, t64, !quick) && ok;
    else if (c.mask == 0)
      ok = run(c, l128n, p128n, x128n, t128n, !quick) && ok;
    else
      ok = run(c, l128, p128, x128, t128, !quick) && ok;
  }
  std::printf("{\"summary\": {\"bits_equal\": %s}}\n", ok ? "true" : "false");
  return ok ? 0 : 1;
}
