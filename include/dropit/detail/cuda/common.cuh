#pragma once
// Plumbing of the CUDA backend: the kernel attribute, launch shapes, the device-side
// view of a cache layout and the value conversions densify shares with the CPU backend.

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
// library's host stub to the other's registration.
#if defined(_WIN32)
#define DROPIT_KERNEL __global__
#else
#define DROPIT_KERNEL __attribute__((visibility("hidden"))) __global__
#endif

namespace dropit::detail::cuda {

/// Threads of every block the backend launches. Several kernels rely on it: a radix histogram of
/// 256 bins is scanned with one bin per thread.
inline constexpr int block_threads = 256;
inline constexpr int radix_bins = 256;
static_assert(radix_bins == block_threads);

/// Grid-stride loops everywhere, so no grid exceeds this many blocks whatever the size.
inline constexpr std::int64_t max_blocks = std::int64_t{1} << 20;

inline unsigned grid_for(std::int64_t items, std::int64_t items_per_block = block_threads) {
  const std::int64_t blocks = (items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_blocks));
}

// ---------------------------------------------------------------------------------------------
// Device-side descriptions of a layout. `cache_layout` carries a `shape` (a std::array) whose
// members are host-only without --expt-relaxed-constexpr, so kernels get these plain copies.

/// An element cache: chunks of `chunk_size` (min-k: one chunk of the whole tensor).
struct element_plan {
  std::int64_t n = 0, chunk_size = 0, full_chunks = 0, tail = 0;
  std::int64_t kept_per_chunk = 0, kept_per_tail = 0, words_per_chunk = 0;
  std::uint64_t seed = 0;
  bool rescale = false;
  float scale_full = 1.0f, scale_tail = 1.0f;

  DROPIT_HOST_DEVICE std::int64_t chunks() const { return full_chunks + (tail > 0 ? 1 : 0); }
  DROPIT_HOST_DEVICE std::int64_t chunk_begin(std::int64_t c) const { return c * chunk_size; }
  DROPIT_HOST_DEVICE std::int64_t chunk_length(std::int64_t c) const {
    return c < full_chunks ? chunk_size : tail;
  }
  DROPIT_HOST_DEVICE std::int64_t kept_in_chunk(std::int64_t c) const {
    return c < full_chunks ? kept_per_chunk : kept_per_tail;
  }
  DROPIT_HOST_DEVICE std::int64_t values_begin(std::int64_t c) const { return c * kept_per_chunk; }
  DROPIT_HOST_DEVICE std::int64_t mask_word_begin(std::int64_t c) const {
    return c * words_per_chunk;
  }
  DROPIT_HOST_DEVICE float scale(std::int64_t c) const {
    return c < full_chunks ? scale_full : scale_tail;
  }
};

inline element_plan element_plan_of(const cache_layout& layout) {
  element_plan p;
  p.n = layout.numel();
  p.chunk_size = layout.chunk_size;
  p.full_chunks = layout.full_chunk_count();
  p.tail = layout.tail_size();
  p.kept_per_chunk = layout.kept_per_chunk;
  p.kept_per_tail = layout.kept_per_tail;
  p.words_per_chunk = layout.mask_words_per_chunk();
  p.seed = layout.seed;
  p.rescale = layout.rescale;
  // The same float factors the CPU backend computes (cache_layout::value_scale).
  p.scale_full = layout.value_scale(0);
  p.scale_tail = layout.value_scale(p.full_chunks);
  return p;
}

/// A channel cache: the tensor as [outer, channels, inner], `kept` whole channels.
struct channel_plan {
  std::int64_t outer = 0, channels = 0, inner = 0, kept = 0;
  std::uint64_t seed = 0;
  bool rescale = false;
  float scale = 1.0f;
};

inline channel_plan channel_plan_of(const cache_layout& layout) {
  return {layout.outer, layout.channels, layout.inner,         layout.kept_channels,
          layout.seed,  layout.rescale,  layout.value_scale(0)};
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
