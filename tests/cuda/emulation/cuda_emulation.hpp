#pragma once
// The CUDA device emulated on the CPU, for the CUDA backend's tests on machines without a GPU.
//
// A translation unit compiled by the host compiler with this header first (-include) and
// tests/cuda/emulation/include before the toolkit's headers compiles the backend's kernels as plain
// C++; the CUDA runtime functions the backend and its tests call are defined by
// cuda_emulation.cpp instead of libcudart, and cuBLAS's by cublas_emulation.cpp. A launch
// (detail/cuda/common.cuh's `launch`) runs its blocks as the device does, up to `resident_blocks`
// at once, each on its own host thread, taking them in order as earlier ones finish; a block's
// threads are fibers of that host thread, switched only where a thread waits: at __syncthreads, at
// a warp collective (__ballot_sync, __shfl_sync and its variants, __all_sync, __syncwarp) until
// all lanes of its warp have reached one, and at __nanosleep. So the kernels'
// index arithmetic, their warp and block collectives, their shared-memory protocols and what
// blocks tell one another through global memory (atomics, look-back, the grid-wide barrier of a
// cooperative launch) run for real; what only hardware shows (timing, races between
// unsynchronised threads of a block that the fiber schedule happens to order, resource limits)
// does not.
//
// `__shared__` variables are thread-local statics: one per kernel and host thread, so one per
// running block. Emulated launches run one at a time in the process.

#include <cuda_runtime.h>  // the runtime API's declarations and vector types, host side

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__ inline
#define __device__
#define __host__
#define __shared__ static thread_local
#define __forceinline__ inline
#define __launch_bounds__(...)

#define DROPIT_CUDA_EMULATION 1

namespace dropit_emulation {

/// What a thread of a launch knows of itself (CUDA's built-in variables).
struct thread_position {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
/// The running thread's (null outside a launch).
extern constinit thread_local const thread_position* current_position;
inline const thread_position& position() { return *current_position; }

/// Blocks the emulated device holds at once (four multiprocessors of one block each): the most a
/// launch runs at once, and the largest grid of a cooperative launch.
inline constexpr unsigned resident_blocks = 4;

void sync_block();
/// A cooperative launch's grid-wide barrier (cooperative_groups::grid_group::sync).
void sync_grid();
void yield_spinning();
void* dynamic_shared_memory();
/// cp.async: the running thread's copies happen at its wait (complete_copies), not before.
void copy_16_bytes_later(void* to, const void* from);
void complete_copies();

/// Runs `grid` x `block` threads of `body`, up to resident_blocks blocks at once, with
/// `shared_bytes` of dynamic shared memory per block; rethrows the first failure of a block. A
/// `cooperative` launch, as cudaLaunchCooperativeKernel, runs every block at once, or nothing
/// where they do not fit (cudaErrorCooperativeLaunchTooLarge); only its blocks may wait at the
/// grid-wide barrier.
cudaError_t run_grid(dim3 grid, dim3 block, std::size_t shared_bytes,
                     const std::function<void()>& body, bool cooperative = false);

/// Whether the `bytes` from `pointer` lie in one allocation of device memory (cudaMalloc's).
bool in_one_allocation(const void* pointer, std::size_t bytes);

template <class T>
T exchanged(std::uint64_t bits) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
template <class T>
std::uint64_t exchangeable(const T& value) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
/// Aborts unless the block has exactly `threads` threads, as CUB's block algorithms require.
inline void expect_block_of(int threads) {
  const thread_position& p = position();
  if (p.block_dim.x != static_cast<unsigned>(threads) || p.block_dim.y != 1 || p.block_dim.z != 1)
    std::abort();
}

/// What a warp collective gives each lane: the value of each lane of the warp that takes part
/// (every lane that has not exited), 0 for the others, and their bits.
struct warp_values {
  std::uint64_t of_lane[32];
  std::uint32_t taking_part = 0;
};
/// The collective `intrinsic` of the calling warp over each lane's `value` (full warps only: `mask`
/// all ones, else it aborts naming the intrinsic).
warp_values collective(const char* intrinsic, unsigned mask, std::uint64_t value);

}  // namespace dropit_emulation

#define threadIdx (::dropit_emulation::position().thread)
#define blockIdx (::dropit_emulation::position().block)
#define blockDim (::dropit_emulation::position().block_dim)
#define gridDim (::dropit_emulation::position().grid_dim)

inline void __syncthreads() { ::dropit_emulation::sync_block(); }
/// The calling warp's lanes wait for one another (a collective: its memory effects are ordered by
/// the exchange's own synchronisation).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::dropit_emulation::collective("__syncwarp", mask, 0);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) { ::dropit_emulation::yield_spinning(); }

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const auto got = ::dropit_emulation::collective("__ballot_sync", mask, predicate != 0);
  unsigned bits = 0;
  for (int lane = 0; lane < 32; ++lane) bits |= (got.of_lane[lane] != 0 ? 1u : 0u) << lane;
  return bits;
}
inline int __all_sync(unsigned mask, int predicate) {
  const auto got = ::dropit_emulation::collective("__all_sync", mask, predicate != 0);
  for (int lane = 0; lane < 32; ++lane)
    if (((got.taking_part >> lane) & 1u) != 0 && got.of_lane[lane] == 0) return 0;
  return 1;
}
template <class T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
  const auto got =
      ::dropit_emulation::collective("__shfl_sync", mask, ::dropit_emulation::exchangeable(value));
  // The source lane within this lane's segment of `width` lanes (a power of two).
  const int lane = static_cast<int>(threadIdx.x % 32);
  return ::dropit_emulation::exchanged<T>(
      got.of_lane[(lane & ~(width - 1)) | (source & (width - 1))]);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const auto got = ::dropit_emulation::collective("__shfl_up_sync", mask,
                                                  ::dropit_emulation::exchangeable(value));
  // A source below this lane's segment of `width` lanes gives the lane its own value.
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int source = lane - static_cast<int>(delta);
  return ::dropit_emulation::exchanged<T>(
      got.of_lane[source < (lane & ~(width - 1)) ? lane : source]);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  const auto got = ::dropit_emulation::collective("__shfl_xor_sync", mask,
                                                  ::dropit_emulation::exchangeable(value));
  // A source past this lane's segment of `width` lanes gives the lane its own value.
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int source = lane ^ (lane_mask & 31);
  return ::dropit_emulation::exchanged<T>(
      got.of_lane[source > (lane | (width - 1)) ? lane : source]);
}

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
/// A load that bypasses the L1 cache: a plain load here.
template <class T>
T __ldcg(const T* address) {
  return *address;
}
// Arithmetic of the device's math library that the backend's kernels call.
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
template <class T>
T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
template <class T>
T atomicOr(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_or(value);
}
template <class T>
T atomicAnd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_and(value);
}

// The runtime's C++ overloads taking a kernel, which cuda_runtime.h declares for nvcc only.
template <class Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Kernel* kernel) {
  return cudaFuncGetAttributes(attributes, reinterpret_cast<const void*>(kernel));
}
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}
template <class Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel* kernel,
                                                          int block_size, std::size_t shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(kernel), block_size, shared);
}
