#pragma once
// A single-pass exclusive scan over tiles of work, by decoupled look-back (Merrill and Garland,
// "Single-pass Parallel Prefix Scan with Decoupled Look-back", 2016). A kernel that needs each
// tile's offset — the kept values before a span of the whole-tensor selection, or before a block
// of mask words — counts its tile, publishes the count, and adds up the counts its predecessors
// published, stopping at the first one that already published its inclusive prefix. The tiles are
// read once, in one launch, where a count kernel, a one-block scan and a second kernel read them
// twice in three launches.
//
// Blocks take tiles in order by a ticket, so a tile's predecessors are held by blocks already
// running, which publish their own count before they look back: no block waits on one that has
// not started, whatever the grid and the scheduler.

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "../common/workspace.hpp"
#include "common.cuh"

namespace dropit::detail::cuda {

/// The workspace of a look-back scan. `zeroed` — the ticket, then one status word per tile — must
/// be zero when the kernel starts (a memset, shared with whatever else the caller zeroes).
struct lookback_tiles {
  std::uint32_t* zeroed = nullptr;
  std::uint64_t* counts = nullptr;      // per tile: its own count
  std::uint64_t* inclusives = nullptr;  // per tile: the counts of the tiles up to it

  static constexpr std::size_t zeroed_words(std::int64_t tiles) {
    return 1 + static_cast<std::size_t>(tiles);
  }
};

/// Carves the scan of `tiles` tiles; its zeroed words are the caller's (zeroed_words of them).
inline lookback_tiles add_lookback_tiles(workspace_carver& carver, std::int64_t tiles,
                                         std::uint32_t* zeroed) {
  lookback_tiles t;
  t.zeroed = zeroed;
  t.counts = carver.add<std::uint64_t>(static_cast<std::size_t>(tiles));
  t.inclusives = carver.add<std::uint64_t>(static_cast<std::size_t>(tiles));
  return t;
}

enum tile_status : std::uint32_t { tile_pending = 0, tile_counted = 1, tile_inclusive = 2 };

using device_atomic_word = ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device>;
using device_atomic_count = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_device>;

/// The calling block's next tile (the same in every thread): tiles are handed out in order.
/// `slot` is the block's shared word for it.
__device__ inline std::uint32_t next_tile(const lookback_tiles& t, std::uint32_t& slot) {
  __syncthreads();  // every thread has read the previous ticket
  if (threadIdx.x == 0) slot = atomicAdd(t.zeroed, 1u);
  __syncthreads();
  return slot;
}

/// Stores `value` as tile `tile`'s count or inclusive prefix, then its status, which releases it.
__device__ inline void publish_tile(const lookback_tiles& t, std::uint32_t tile,
                                    std::uint64_t value, tile_status status) {
  std::uint64_t* values = status == tile_inclusive ? t.inclusives : t.counts;
  device_atomic_count(values[tile]).store(value, ::cuda::memory_order_relaxed);
  device_atomic_word(t.zeroed[1 + tile]).store(status, ::cuda::memory_order_release);
}

/// The sum of the counts of the tiles before `tile`, whose own count is `count`; publishes both.
/// Called by the 32 lanes of one warp together; every lane gets the sum. Lane l looks at the tile
/// l + 1 places back, so a warp reads 32 predecessors' statuses at once and takes every count up
/// to the nearest inclusive prefix. Sums must fit the value type (packed counts: each field's
/// total below its width).
__device__ inline std::uint64_t exclusive_prefix(const lookback_tiles& t, std::uint32_t tile,
                                                 std::uint64_t count) {
  const unsigned lane = threadIdx.x & 31u;
  if (tile == 0) {
    if (lane == 0) publish_tile(t, 0, count, tile_inclusive);
    return 0;
  }
  if (lane == 0) publish_tile(t, tile, count, tile_counted);
  std::uint64_t before = 0;
  for (std::int64_t end = tile;; end -= 32) {
    const std::int64_t predecessor = end - 1 - static_cast<std::int64_t>(lane);
    std::uint32_t status = tile_inclusive;  // before tile 0: nothing to add
    std::uint64_t value = 0;
    if (predecessor >= 0) {
      const device_atomic_word word(t.zeroed[1 + predecessor]);
      while ((status = word.load(::cuda::memory_order_acquire)) == tile_pending) __nanosleep(32);
      std::uint64_t* values = status == tile_inclusive ? t.inclusives : t.counts;
      value = device_atomic_count(values[predecessor]).load(::cuda::memory_order_relaxed);
    }
    const std::uint32_t inclusive = __ballot_sync(0xffffffffu, status == tile_inclusive);
    // Lanes are ordered nearest first: take lanes up to the nearest inclusive prefix, or all.
    const std::uint32_t taken = inclusive == 0 ? 0xffffffffu : inclusive ^ (inclusive - 1);
    before += warp_sum((taken >> lane) & 1u ? value : std::uint64_t{0});
    if (inclusive != 0) break;  // uniform across the warp
  }
  if (lane == 0) publish_tile(t, tile, before + count, tile_inclusive);
  return before;
}

}  // namespace dropit::detail::cuda
