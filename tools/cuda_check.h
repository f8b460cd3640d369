// What the standalone device checks in tools/ (attn_schedule_check.cu, gemm_tma_check.cu,
// tma_probe.cu) share: CK(call) prints a failed CUDA runtime call's error with its place and
// exits 1, which a device call's script reads as the check's failure; bf16_bits rounds the
// inputs they make on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// The bf16 bits of x, rounded to nearest even.
static inline unsigned short bf16_bits(float x) {
  unsigned int u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
