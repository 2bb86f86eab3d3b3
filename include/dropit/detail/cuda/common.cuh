#pragma once
// Plumbing of the CUDA backend: the kernel attribute, launch shapes and the value conversions
// densify shares with the CPU backend.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../backend.hpp"
#include "../../cache.hpp"
#include "../../config.hpp"
#include "../../types.hpp"
#include "../common/workspace.hpp"
#include "runtime.hpp"

// Kernels have hidden visibility (as cuCollections' do): two shared libraries that both
// instantiate the same kernel template then each keep their own copy instead of binding one
// library's host stub to the other's registration. Every kernel is launched with
// `block_threads` threads, and says so (__launch_bounds__): without it nvcc must budget registers
// for 1024-thread blocks, which forces spills or cuts what a thread may keep in registers.
// DROPIT_KERNEL_RESIDENT(blocks) also asks for `blocks` blocks per multiprocessor, which budgets
// registers for that many (a cooperative kernel's grid is what fits at once).
#if defined(_WIN32)
#define DROPIT_KERNEL_VISIBILITY
#else
#define DROPIT_KERNEL_VISIBILITY __attribute__((visibility("hidden")))
#endif
#define DROPIT_KERNEL \
  DROPIT_KERNEL_VISIBILITY __global__ __launch_bounds__(::dropit::detail::cuda::block_threads)
#define DROPIT_KERNEL_RESIDENT(blocks)                                                         \
  DROPIT_KERNEL_VISIBILITY __global__ __launch_bounds__(::dropit::detail::cuda::block_threads, \
                                                        blocks)

namespace dropit::detail::cuda {

/// Threads of every block the backend launches.
inline constexpr int block_threads = 256;

// ---------------------------------------------------------------------------------------------
// Launches. Every kernel is launched here, and reads its dynamic shared memory from here: the
// backend's tests also compile the kernels as host code for a CPU emulation of the device
// (tests/cuda/emulation, which defines DROPIT_CUDA_EMULATION and runs the launches).

/// A launch's grid, its dynamic shared memory per block, and its blocks.
struct launch_shape {
  dim3 grid;
  std::size_t shared_bytes = 0;
  dim3 block = dim3(block_threads);
};

/// `kernel<<<shape..., stream>>>(args...)`, each argument converted to the kernel's parameter type.
template <class... Params>
void launch(void (*kernel)(Params...), const launch_shape& shape, cudaStream_t stream,
            std::type_identity_t<Params>... args) {
#if defined(DROPIT_CUDA_EMULATION)
  static_cast<void>(stream);
  ::dropit_emulation::run_grid(shape.grid, shape.block, shape.shared_bytes,
                               [&] { kernel(args...); });
#else
  // clang-format off
  kernel<<<shape.grid, shape.block, shape.shared_bytes, stream>>>(args...);
  // clang-format on
#endif
}

/// The block's dynamic shared memory: the bytes its launch asked for, 16-byte aligned.
template <class Item>
__device__ inline Item* dynamic_shared_memory() {
#if defined(DROPIT_CUDA_EMULATION)
  return static_cast<Item*>(::dropit_emulation::dynamic_shared_memory());
#else
  extern __shared__ uint4 dynamic_shared_storage[];
  return reinterpret_cast<Item*>(dynamic_shared_storage);
#endif
}

/// Grid-stride loops everywhere, so no grid exceeds this many blocks whatever the size.
inline constexpr std::int64_t max_blocks = std::int64_t{1} << 20;

inline unsigned grid_for(std::int64_t items, std::int64_t items_per_block = block_threads) {
  const std::int64_t blocks = (items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_blocks));
}

/// The grid of a kernel whose threads walk their elements with index_walk, whose setup divides and
/// whose steps do not: at most 1 024 blocks, enough to fill an H100 or H200 (132 multiprocessors
/// holding at most 8 blocks each), so that each thread of a large launch takes many steps and pays
/// the setup once.
inline unsigned grid_for_walk(std::int64_t items) { return std::min(grid_for(items), 1024u); }

/// The sum of `value` over the 32 lanes of the warp, in every lane (called by all 32 together).
template <class Value>
__device__ inline Value warp_sum(Value value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

/// The sum of `value` over lanes 0 .. this one of the calling warp (all 32 lanes take part).
template <class Value>
__device__ inline Value warp_inclusive_sum(Value value) {
  const unsigned lane = threadIdx.x & 31u;
#pragma unroll
  for (unsigned offset = 1; offset < 32; offset *= 2) {
    const Value below = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += below;
  }
  return value;
}

// ---------------------------------------------------------------------------------------------
// Copies into shared memory.

/// Starts copying 16 bytes from global memory to shared memory `to` (both 16-byte aligned)
/// without holding them in registers (sm_80 and later; a plain copy before).
__device__ inline void copy_16_bytes_async(void* to, const void* from) {
#if __CUDA_ARCH__ >= 800
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(from) : "memory");
#elif defined(DROPIT_CUDA_EMULATION)
  ::dropit_emulation::copy_16_bytes_later(to, from);  // as cp.async: landed only at the wait
#else
  *static_cast<uint4*>(to) = *static_cast<const uint4*>(from);
#endif
}

/// Waits for this thread's copies begun by copy_16_bytes_async (a barrier must follow before
/// other threads read them).
__device__ inline void wait_for_async_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#elif defined(DROPIT_CUDA_EMULATION)
  ::dropit_emulation::complete_copies();
#endif
}

/// `pointer` into global memory, computed here once: the compiler may not fold it into the
/// addresses derived from it (which would redo its 64-bit arithmetic for each), so each of those
/// is one multiply-add, and their stores stay global ones.
template <class T>
__device__ inline T* global_address_once(T* pointer) {
#if defined(__CUDA_ARCH__)
  asm("" : "+l"(pointer));
  __builtin_assume(__isGlobal(pointer));
#endif
  return pointer;
}

// ---------------------------------------------------------------------------------------------
// Values.

/// `x * scale` as the CPU backend computes it on x86-64 (and AArch64): a NaN operand comes back
/// quieted with its sign and payload, where the GPU would return its canonical NaN.
__device__ inline float scale_like_host(float x, float scale) {
  return x != x ? float_from_bits(float_bits(x) | 0x00400000u) : x * scale;
}

/// A kept value as densify writes it into an `Out` tensor (`T` itself, or float for the weight
/// gradients): copied bit for bit, or scaled by `scale` when the cache rescales.
template <class Out, class T>
__device__ inline Out densified(T value, bool rescale, float scale) {
  if constexpr (std::is_same_v<Out, T>) {
    if (!rescale) return value;
    return from_float<T>(scale_like_host(to_float(value), scale));
  } else {
    static_assert(std::is_same_v<Out, float>);
    return rescale ? to_float(value) * scale : to_float(value);
  }
}

/// A weight gradient stored into `out`: replacing it, or added to it in float and rounded once,
/// as the CPU backend's store_gradient does.
template <class T>
__device__ inline void store_gradient(T& out, float value, grad_mode mode) {
  out = from_float<T>(mode == grad_mode::accumulate ? to_float(out) + value : value);
}

}  // namespace dropit::detail::cuda
