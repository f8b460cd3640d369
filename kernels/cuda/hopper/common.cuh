// Device helpers of the Hopper (sm_90a) kernels: asynchronous copies, warpgroup MMA control,
// shared-memory matrix descriptors and float conversions, written in inline PTX so that the
// kernels need no CUDA header and compile with NVRTC alone.
//
// Every helper is a pure function of its operands. Conversions round to nearest even, the same
// instruction everywhere, so a value stored by one kernel configuration has the bits it has in
// every other.

namespace bih {

using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; src_bytes = 0 writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void st_shared16(u32 dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void st_shared4(u32 dst, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared16(u32 src) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(src)
               : "memory");
  return v;
}

// Shared memory written by this thread (ordinary stores or cp.async) becomes visible to the
// tensor cores' asynchronous reads after this fence and a barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// mbarriers in shared memory (8 bytes each, 8-byte aligned), initialised by one thread before
// a __syncthreads. A phase completes when `count` arrivals have happened; waiting names the
// parity of the phase waited for, and a barrier's first wait with parity 1 returns at once
// (the phase before its first counts as complete).
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes barriers just initialised visible to the asynchronous units that arrive on them (with
// the __syncthreads that follows, to the other threads).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives on the barrier, releasing this thread's earlier shared-memory reads and writes.
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
      : "memory");
}

// Waits until the barrier's phase of the given parity has completed (acquiring what the
// arrivals released).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "BI_MBAR_WAIT%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra BI_MBAR_WAIT%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Arrives on the barrier once every cp.async this thread has issued so far has landed; the
// arrival is one of the `count` the barrier was initialised with (.noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Named barrier `id` (1-15; 0 is __syncthreads') of `count` threads, a multiple of 32: sync
// waits until count threads have arrived or synced, arrive does not wait.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across a wgmma issue or wait.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major operand tile in the 128-byte swizzle layout: rows of 64 16-bit
// values (128 bytes) stored one after another, the 16-byte chunk c of row r at chunk position
// c ^ (r % 8); groups of 8 rows are 1024 bytes apart (the stride byte offset). The tile must
// start 1024-byte aligned; the k16 step s of a 64-wide tile starts 32 s bytes further.
__device__ __forceinline__ u64 sw128_desc(u32 addr) {
  return static_cast<u64>((addr & 0x3FFFF) >> 4) | (static_cast<u64>(1) << 16) |
         (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}
// Byte offset of chunk c (8 consecutive k) of row r inside such a tile.
__device__ __forceinline__ u32 sw128_offset(int r, int c) {
  return static_cast<u32>(r * 128 + ((c ^ (r & 7)) << 4));
}

// 16-bit float bits <-> float32, round to nearest even.
template <bool F16>
__device__ __forceinline__ float half_to_f32(u16 h) {
  if constexpr (F16) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
  } else {
    return __uint_as_float(static_cast<u32>(h) << 16);
  }
}
// Two floats rounded to the half type and packed low-first into one 32-bit word.
template <bool F16>
__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  u32 r;
  if constexpr (F16) {
    asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(lo), "f"(hi));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;\n" : "=r"(r) : "f"(lo), "f"(hi));
  }
  return r;
}
template <bool F16>
__device__ __forceinline__ u16 to_half(float x) {
  return static_cast<u16>(pack_half2<F16>(x, 0.0f) & 0xFFFFu);
}

// A float32 constant passed as two integer template arguments (magnitude bits, sign).
__device__ __forceinline__ float f32_from_bits(int magnitude_bits, bool negative) {
  const float v = __int_as_float(magnitude_bits);
  return negative ? -v : v;
}

}  // namespace bih
