// What the standalone device checks in tools/ (attn_schedule_check.cu, gemm_tma_check.cu,
// tma_probe.cu) share: CK(call) prints a failed CUDA runtime call's error with its place and
// exits 1, which a device call's script reads as the check's failure.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
