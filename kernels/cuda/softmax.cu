// Batch-invariant softmax over the last axis (needs common.cuh before it).
//
// Attention written by hand (q @ k^T, a soft-cap, a mask, softmax, @ v) runs this softmax over
// rows whose length is the number of keys of the call: a decode step's row holds the cache's
// keys, a rescoring pass's row the whole sequence's, and left padding puts a row's keys at a
// different offset. A reduction whose association depends on the row length or on where the
// keys start (as a block-wide tree over the row does) then gives the same token different
// bits. Here one warp owns a row and, in fp32:
//   * m = max of the row (max is exact in any order);
//   * e_j = exp(x_j - m); a = the first j with e_j != 0 (masked keys, at -inf or at the dtype's
//     lowest value, give exact zeros);
//   * lane l sums e_{a + l}, e_{a + l + 32}, ... in increasing order, then the 32 lane sums
//     fold by a fixed butterfly (xor 16, 8, 4, 2, 1);
//   * out_j = e_j / s, rounded once to the output type.
// Elements before a are zero, elements past the row's last nonzero add exact zeros, so s, and
// every output, depends on the nonzero values and their positions relative to a alone: not on
// the row length, the batch, the other rows or the padding.

namespace bi {

template <typename T>
__device__ void softmax_rows(const T* x, long long x_row, long long x_col, T* out, int rows,
                             int n) {
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * x_row;
  T* orow = out + row * static_cast<long long>(n);
  float m = -cuda::std::numeric_limits<float>::infinity();
  for (int j = lane; j < n; j += 32) m = fmaxf(m, to_f32<T>(xr[j * x_col]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  int a = n;
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    const bool nz = j < n && expf(__fsub_rn(to_f32<T>(xr[j * x_col]), m)) != 0.0f;
    const unsigned bal = __ballot_sync(0xffffffffu, nz);
    if (bal) {
      a = base + __ffs(bal) - 1;
      break;
    }
  }
  float s = 0.0f;
  for (int j = a + lane; j < n; j += 32) s = __fadd_rn(s, expf(__fsub_rn(to_f32<T>(xr[j * x_col]), m)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
  for (int j = lane; j < n; j += 32)
    orow[j] = from_f32<T>(__fdiv_rn(expf(__fsub_rn(to_f32<T>(xr[j * x_col]), m)), s));
}

}  // namespace bi
