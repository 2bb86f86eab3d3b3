#pragma once
// Selection keys and the random generator shared by every backend. Both sides rank candidates by
// the same 32-bit keys, so they keep the same sets bit for bit.

#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../../types.hpp"

namespace dropit::detail {

/// The largest magnitude key (magnitude_key below), every NaN's: the smallest NaN of the format,
/// infinity's bits plus one (in the high half for 16-bit types).
template <storage_type T>
inline constexpr std::uint32_t magnitude_key_max = std::is_same_v<T, float>  ? 0x7f800001u
                                                   : std::is_same_v<T, half> ? 0x7c01u << 16
                                                                             : 0x7f81u << 16;

/// No magnitude, clamped or not (magnitude_order below), exceeds this: |x|'s bits have their sign
/// cleared.
inline constexpr std::uint32_t magnitude_order_max = 0x7fffffffu;

/// A magnitude key's bits are those of |x|, shifted into the high half for 16-bit types.
template <storage_type T>
inline constexpr int magnitude_key_shift = sizeof(T) == 4 ? 0 : 16;

/// magnitude_key before the clamp of NaN payloads: `magnitude_order(x) >= t` exactly where
/// `magnitude_key(x) >= t`, for every t up to magnitude_key_max — so a comparison against a cut,
/// which is a key, needs no clamp.
template <storage_type T>
DROPIT_HOST_DEVICE inline std::uint32_t magnitude_order(T value) {
  const std::uint32_t magnitude = bits_of(value) & (sizeof(T) == 4 ? 0x7fffffffu : 0x7fffu);
  return magnitude << magnitude_key_shift<T>;
}

/// Key ordering elements by magnitude. Clearing the sign bit of an IEEE value leaves an unsigned
/// integer that grows with |x|, puts every NaN above infinity and maps +0 and -0 together; NaN
/// payloads are clamped to one key so that all NaNs tie (and ties go to the lower index). 16-bit
/// types are shifted into the high half so that a radix pass over the top bits sees their
/// exponent, just as it does for float.
template <storage_type T>
DROPIT_HOST_DEVICE inline std::uint32_t magnitude_key(T value) {
  // Clamped before the shift, which the compiler then folds into a radix pass's own.
  constexpr int shift = magnitude_key_shift<T>;
  constexpr std::uint32_t nan_magnitude = magnitude_key_max<T> >> shift;
  const std::uint32_t magnitude = magnitude_order(value) >> shift;
  return (magnitude < nan_magnitude ? magnitude : nan_magnitude) << shift;
}

/// The top bits of a magnitude key that can be set: all 32 for float, the high 16 for 16-bit types
/// (a radix pass over the low half would decide nothing).
template <storage_type T>
inline constexpr int magnitude_key_bits = 8 * static_cast<int>(sizeof(T));

DROPIT_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  // splitmix64's finaliser: a bijection with full avalanche.
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A random stream's key: 64 bits of (`seed`, `stream`) with full avalanche. `random_key` asks for
/// it per draw; a loop over one stream's draws leaves it loop-invariant, and the compilers hoist it
/// (the CPU's vectorised draw loop and the GPU's staging loop, counted in SASS, compute it once).
DROPIT_HOST_DEVICE inline std::uint64_t random_stream_key(std::uint64_t seed,
                                                          std::uint64_t stream) {
  return mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ull));
}

/// Draw `index` of the stream keyed by `stream_key`: 32-bit arithmetic only (a few instructions,
/// eight lanes to an AVX2 vector), where a 64-bit mix per draw cost most of a random compress.
/// The index's Weyl step from the key's low half is hashed by two multiply-xorshift rounds
/// (lowbias32), the key's high half entering between them, so that streams whose steps overlap
/// still rank their draws independently. Every step is a bijection of 32-bit words: a stream's
/// draws for distinct indices below 2^32 are distinct (no ties within a chunk).
DROPIT_HOST_DEVICE inline std::uint32_t random_draw(std::uint64_t stream_key, std::uint64_t index) {
  std::uint32_t x = static_cast<std::uint32_t>(stream_key) +
                    static_cast<std::uint32_t>(index) * 0x9e3779b9u +
                    static_cast<std::uint32_t>(index >> 32) * 0x85ebca6bu;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= (x >> 15) ^ static_cast<std::uint32_t>(stream_key >> 32);
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

/// Counter-based generator: a 32-bit uniform key for (`seed`, `stream`, `index`). Random selection
/// keeps the `k` largest keys of a chunk (stream = chunk) or of the channels (stream =
/// `channel_stream`), which draws `k` positions uniformly without replacement.
DROPIT_HOST_DEVICE inline std::uint32_t random_key(std::uint64_t seed, std::uint64_t stream,
                                                   std::uint64_t index) {
  return random_draw(random_stream_key(seed, stream), index);
}

inline constexpr std::uint64_t channel_stream = ~std::uint64_t{0};

/// The cut produced by a selection: keep every key above `key`, and the first `ties` candidates
/// (in index order) whose key equals it. Ties therefore go to the lower index.
struct threshold {
  std::uint32_t key = 0;
  std::int64_t ties = 0;
};

/// Channel scores are sums of squares accumulated in double, in a fixed order every backend can
/// reproduce: each run of `channel_score_block` consecutive elements (in [outer, inner] order) is
/// summed sequentially, then the run sums are added in order.
inline constexpr std::int64_t channel_score_block = 1024;

/// Ranks channel scores like magnitudes: NaN above everything, then larger sums.
DROPIT_HOST_DEVICE inline bool channel_ranks_before(double score_a, std::int64_t a, double score_b,
                                                    std::int64_t b) {
  const bool nan_a = score_a != score_a, nan_b = score_b != score_b;
  if (nan_a != nan_b) return nan_a;
  if (!nan_a && score_a != score_b) return score_a > score_b;
  return a < b;
}

}  // namespace dropit::detail
