// Copies by the tensor memory accelerator (TMA) from a kernel launched through MLX, which
// passes only arrays and scalars: the kernel writes its own tensor maps. A map (128 bytes:
// the tensor's address, sizes and strides, the shared-memory box and its swizzle) must sit
// in parameter, constant or global memory when a copy names it, so a block builds its maps in
// shared memory (tmap_build_2d on a zeroed, 128-byte aligned map), copies each to its slot of
// a global scratch array (tmap_publish, one whole warp), and the thread that issues copies
// acquires the slot (tmap_acquire) before its first one. A box lands in the 128-byte swizzle
// layout the wgmma operands use (common.cuh's sw128_offset): the 16-byte chunk c of row r at
// c ^ (r % 8), 128 bytes a row, when the box is 64 16-bit elements wide. Elements of a box past
// the tensor's end land as zeros. Needs common.cuh before it.

namespace bih {

// The map's element type, in tensormap.replace's encoding (.f16 6, .f64 9, .bf16 10), which is
// not the driver's CUtensorMapDataType (bf16 9 there, f64 8): a map built here with the
// driver's 9 would copy 8-byte elements. (An enum, not constexpr ints: NVRTC emits a global for
// each of those in every kernel that includes this file, used or not.)
enum : int {
  TMAP_F16 = 6,
  TMAP_BF16 = 10,
};

// The address field alone, in a map (at shared address tm) whose other fields are set.
__device__ __forceinline__ void tmap_set_address(u32 tm, const void* base) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(tm),
               "l"(reinterpret_cast<u64>(base))
               : "memory");
}

// Every field of a 2-D map at shared address tm (zeroed, 128-byte aligned): dimension 0 has
// dim0 elements, contiguous; dimension 1 has dim1 rows, row_bytes apart (a multiple of 16);
// boxes of box0 x box1 elements (box0 * 2 bytes <= 128) in the 128-byte swizzle; base
// 16-byte aligned; ELEMTYPE one of the TMAP_ types.
template <int ELEMTYPE>
__device__ __forceinline__ void tmap_build_2d(u32 tm, const void* base, u32 dim0, u32 dim1,
                                              u64 row_bytes, u32 box0, u32 box1) {
  tmap_set_address(tm, base);
  asm volatile("tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 1;" ::"r"(tm) : "memory");
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(tm),
               "r"(box0)
               : "memory");
  asm volatile("tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(tm),
               "r"(box1)
               : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(tm),
               "r"(dim0)
               : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(tm),
               "r"(dim1)
               : "memory");
  // Bytes; compilers that emit PTX 8.5 or older (CUDA before 12.7) took it in 16-byte units.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ < 7))
  row_bytes >>= 4;
#endif
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" ::"r"(tm),
               "l"(row_bytes)
               : "memory");
  asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 0, 1;" ::"r"(tm)
               : "memory");
  asm volatile("tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 1, 1;" ::"r"(tm)
               : "memory");
  asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], %1;" ::"r"(tm),
               "n"(ELEMTYPE)
               : "memory");
  asm volatile("tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [%0], 0;" ::"r"(tm)
               : "memory");
  // 3: the 128-byte swizzle
  asm volatile("tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [%0], 3;" ::"r"(tm)
               : "memory");
  // 0: zeros past the tensor's end
  asm volatile("tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [%0], 0;" ::"r"(tm)
               : "memory");
}

// The map at shared address tm copied to its global slot (128-byte aligned) and released to
// the tensor-map proxy. All 32 lanes of one warp, after the map's last field write.
__device__ __forceinline__ void tmap_publish(void* slot, u32 tm) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned "
      "[%0], [%1], 128;" ::"l"(reinterpret_cast<u64>(slot)),
      "r"(tm)
      : "memory");
}

// Before the first copy through a published map, by the thread that issues it. (The
// bulk-group commit and wait after the fence are what Triton emits there too, against a fence
// ptxas was seen to drop.)
__device__ __forceinline__ void tmap_acquire(const void* slot) {
  asm volatile(
      "fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n"
      "cp.async.bulk.commit_group;\n"
      "cp.async.bulk.wait_group.read 0;" ::"l"(reinterpret_cast<u64>(slot))
      : "memory");
}

// Whether a map can describe rows of 16-bit elements starting at p, row_stride elements apart,
// elem_stride apart within a row: contiguous rows (elem_stride 1), rows a positive multiple of
// 16 bytes apart (the map's stride is unsigned and counts whole 16 bytes: a reversed or
// broadcast view cannot be described), a 16-byte aligned start. Operands that fail take a
// kernel's 16-byte or element copies instead.
__device__ __forceinline__ bool tma_readable(const void* p, long long row_stride,
                                             long long elem_stride) {
  return elem_stride == 1 && row_stride > 0 && row_stride % 8 == 0 &&
         (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// Block blockIdx.x's 256-byte slot of a launch's maps output, whose start the kernel aligns up
// to 128 bytes (the launch allocates 128 bytes more: bi_rl's _kernels.tma_maps_words).
__device__ __forceinline__ unsigned char* tmap_slot(unsigned char* maps) {
  const u64 aligned = (reinterpret_cast<u64>(maps) + 127ull) & ~127ull;
  return reinterpret_cast<unsigned char*>(aligned) + 256 * static_cast<long long>(blockIdx.x);
}

// A 2-D map's fields, as tmap_build_2d takes them.
struct Tmap2d {
  const void* base;
  u32 dim0, dim1;
  u64 row_bytes;
  u32 box0, box1;
};

// The two maps a kernel copies through (A and B, K and V), by one whole warp: zeroed at shared
// address tm (256 bytes, 128-byte aligned; the second map 128 bytes after the first), written
// by lane 0, published to the 256 bytes at slot (tmap_slot) and acquired by lane 0, the thread
// that then issues the copies.
template <int ELEMTYPE>
__device__ __forceinline__ void tmap_pair(unsigned char* slot, u32 tm, const Tmap2d& a,
                                          const Tmap2d& b) {
  const int lane = threadIdx.x & 31;
  st_shared4(tm + 4 * lane, 0u);
  st_shared4(tm + 128 + 4 * lane, 0u);
  __syncwarp();
  if (lane == 0) {
    tmap_build_2d<ELEMTYPE>(tm, a.base, a.dim0, a.dim1, a.row_bytes, a.box0, a.box1);
    tmap_build_2d<ELEMTYPE>(tm + 128, b.base, b.dim0, b.dim1, b.row_bytes, b.box0, b.box1);
  }
  __syncwarp();
  tmap_publish(slot, tm);
  tmap_publish(slot + 128, tm + 128);
  if (lane == 0) {
    tmap_acquire(slot);
    tmap_acquire(slot + 128);
  }
}

// One arrival on the mbarrier that also adds `bytes` to the transaction count its phase waits
// for (the bytes of the copies that complete on it).
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
  asm volatile(
      "{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
}

// The box whose first element is (c, r) (dimension 0, dimension 1) of the map at generic
// address map, into shared memory at dst (1024-byte aligned for the swizzle), its bytes
// completing on the mbarrier bar.
__device__ __forceinline__ void tma_load_2d(u32 dst, const void* map, int c, int r, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(c), "r"(r), "r"(bar)
      : "memory");
}

}  // namespace bih
