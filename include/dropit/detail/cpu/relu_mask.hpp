#pragma once
// The CPU backend's ReLU mask loops: pack (with the fused ReLU forward) and apply, a word of 32
// elements at a time; channels-last tensors a tile of 32 pixels by up to 1024 channels at a time.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../backend.hpp"
#include "../../types.hpp"
#include "../common/relu_mask.hpp"
#include "parallel.hpp"
#include "simd.hpp"

namespace dropit::detail::cpu {

/// Calls `visit(first_word, last_word)` over the mask words of `n` elements, in parallel work items
/// large enough to amortise scheduling.
template <class Visit>
void for_each_mask_word_range(const cpu_backend& backend, std::int64_t n, Visit&& visit) {
  constexpr std::int64_t words_per_item = 4096;
  const std::int64_t total = relu_mask_words(n);
  parallel_for(backend, (total + words_per_item - 1) / words_per_item, [&](std::int64_t item, int) {
    visit(item * words_per_item, std::min(total, (item + 1) * words_per_item));
  });
}

/// `*out = bit ? *in : 0` (bit 0 of `bit`), as an AND of the element's bits, so that the loops
/// vectorise.
template <class T>
DROPIT_ALWAYS_INLINE void store_masked(T* out, const T* in, std::uint32_t bit) {
  using bits_type = element_bits<T>;
  const auto keep = static_cast<bits_type>(0u - (bit & 1u));
  bits_type value;
  std::memcpy(&value, in, sizeof value);
  value &= keep;
  std::memcpy(static_cast<void*>(out), &value, sizeof value);
}

/// Mask words [first, last) of `x`, and `relu(x)` into `y` unless `y` is null (`y` may be `x`).
template <class T>
void pack_mask_words_kernel(const T* x, T* y, std::uint32_t* words, std::int64_t n,
                            std::int64_t first, std::int64_t last) {
  for (std::int64_t w = first; w < last; ++w) {
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
    const T* in = x + w * 32;
    std::uint32_t bits = 0;
    for (int j = 0; j < length; ++j)
      bits |= static_cast<std::uint32_t>(!(to_float(in[j]) <= 0.0f)) << j;
    words[w] = bits;
    if (y == nullptr) continue;
    T* out = y + w * 32;
    for (int j = 0; j < length; ++j) store_masked(&out[j], &in[j], bits >> j);
  }
}
DROPIT_CPU_DISPATCH(pack_mask_words)

/// `dx = mask ? dy : 0` over mask words [first, last).
template <class T>
void apply_mask_words_kernel(const std::uint32_t* words, const T* dy, T* dx, std::int64_t n,
                             std::int64_t first, std::int64_t last) {
  for (std::int64_t w = first; w < last; ++w) {
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
    for (int j = 0; j < length; ++j) store_masked(&dx[w * 32 + j], &dy[w * 32 + j], words[w] >> j);
  }
}
DROPIT_CPU_DISPATCH(apply_mask_words)

/// Sets mask bits [position, position + length) to the low `length` bits of `bits` (length 1 to
/// 32). Only words wholly inside bits [owned_first, owned_last) belong to the caller's work item;
/// another item may write the other bits of the rest at the same time, so those are updated
/// atomically (each bit has one writer, so clearing and then setting ours is enough).
inline void store_mask_bits(std::uint32_t* words, std::int64_t position, std::uint32_t bits,
                            int length, std::int64_t owned_first, std::int64_t owned_last) {
  const int shift = static_cast<int>(position % 32);
  const std::uint64_t field = low_bits(length) << shift;
  const std::uint64_t value = (static_cast<std::uint64_t>(bits) << shift) & field;
  for (std::int64_t word = position / 32, k = 0; k < 2; ++word, ++k) {
    const auto word_field = static_cast<std::uint32_t>(field >> (32 * k));
    if (word_field == 0) continue;
    const auto word_value = static_cast<std::uint32_t>(value >> (32 * k));
    if (word * 32 >= owned_first && word * 32 + 32 <= owned_last) {
      words[word] = (words[word] & ~word_field) | word_value;
    } else {
      std::atomic_ref<std::uint32_t> shared(words[word]);
      shared.fetch_and(~word_field, std::memory_order_relaxed);
      shared.fetch_or(word_value, std::memory_order_relaxed);
    }
  }
}

/// The tiles the channels-last loops take: 32 pixels (one mask word's worth of a channel) by up to
/// 1024 channels, so that a tile is its pixels' rows read whole, one after the other, and the tile's
/// bits (4 KiB) stay in L1. Narrower tiles read rows C elements apart a few cache lines each: for C
/// a multiple of 256 those lines fall into a few L1 sets and evict one another (64-channel tiles
/// took 2-3x the flat loop's time at 256 and 512 channels).
constexpr int mask_tile_pixels = 32, mask_tile_channels = 1024;

/// Calls `visit(p0, pixels, c0, channels)` for the tiles of pixels [first_pixel, last_pixel) by
/// all `channels` (`pixels` and `channels` are how many of the tile's the range has).
template <class Visit>
DROPIT_ALWAYS_INLINE void for_each_mask_tile(std::int64_t first_pixel, std::int64_t last_pixel,
                                             std::int64_t channels, Visit&& visit) {
  for (std::int64_t p0 = first_pixel; p0 < last_pixel; p0 += mask_tile_pixels)
    for (std::int64_t c0 = 0; c0 < channels; c0 += mask_tile_channels)
      visit(p0, static_cast<int>(std::min<std::int64_t>(mask_tile_pixels, last_pixel - p0)), c0,
            static_cast<int>(std::min<std::int64_t>(mask_tile_channels, channels - c0)));
}

/// Pixels [first_pixel, last_pixel) of `image` of a channels-last `x`: their mask bits (in logical
/// order), and `relu(x)` into `y` unless `y` is null (`y` may be `x`).
template <class T>
void pack_mask_channels_last_kernel(const T* x, T* y, std::uint32_t* words,
                                    const channels_last_dims& d, std::int64_t image,
                                    std::int64_t first_pixel, std::int64_t last_pixel) {
  const auto pack_tile = [&](std::int64_t p0, int length, std::int64_t c0, int channels) {
    std::uint32_t tile_bits[mask_tile_channels] = {};
    for (int j = 0; j < length; ++j) {
      const std::int64_t row = (image * d.pixels + p0 + j) * d.channels + c0;
      const T* in = x + row;
      for (int c = 0; c < channels; ++c)
        tile_bits[c] |= static_cast<std::uint32_t>(!(to_float(in[c]) <= 0.0f)) << j;
      if (y == nullptr) continue;
      T* out = y + row;
      for (int c = 0; c < channels; ++c) store_masked(&out[c], &in[c], tile_bits[c] >> j);
    }
    for (int c = 0; c < channels; ++c) {
      const std::int64_t plane = (image * d.channels + c0 + c) * d.pixels;
      store_mask_bits(words, plane + p0, tile_bits[c], length, plane + first_pixel,
                      plane + last_pixel);
      // The tensor's last bits: the rest of their word is cleared, as the flat loops leave it.
      const std::int64_t end = plane + p0 + length;
      if (end == d.images * d.channels * d.pixels && end % 32 != 0)
        store_mask_bits(words, end, 0u, static_cast<int>(32 - end % 32), 0, 0);
    }
  };
  for_each_mask_tile(first_pixel, last_pixel, d.channels, pack_tile);
}
DROPIT_CPU_DISPATCH(pack_mask_channels_last)

/// `dx = mask ? dy : 0` over pixels [first_pixel, last_pixel) of `image`, both channels-last.
template <class T>
void apply_mask_channels_last_kernel(const std::uint32_t* words, const T* dy, T* dx,
                                     const channels_last_dims& d, std::int64_t image,
                                     std::int64_t first_pixel, std::int64_t last_pixel) {
  const auto apply_tile = [&](std::int64_t p0, int length, std::int64_t c0, int channels) {
    std::uint32_t tile_bits[mask_tile_channels];
    for (int c = 0; c < channels; ++c)
      tile_bits[c] = load_mask_bits(words, (image * d.channels + c0 + c) * d.pixels + p0, length);
    for (int j = 0; j < length; ++j) {
      const std::int64_t row = (image * d.pixels + p0 + j) * d.channels + c0;
      for (int c = 0; c < channels; ++c)
        store_masked(&dx[row + c], &dy[row + c], tile_bits[c] >> j);
    }
  };
  for_each_mask_tile(first_pixel, last_pixel, d.channels, apply_tile);
}
DROPIT_CPU_DISPATCH(apply_mask_channels_last)

/// Calls `visit(image, first_pixel, last_pixel)` over a channels-last tensor's pixels, in parallel
/// work items of whole pixel tiles and about as many elements as the flat loops' items.
template <class Visit>
void for_each_pixel_range(const cpu_backend& backend, const channels_last_dims& d, Visit&& visit) {
  constexpr std::int64_t elements_per_item = std::int64_t{4096} * 32;
  const std::int64_t tiles_per_item = std::max<std::int64_t>(
      1, elements_per_item / (mask_tile_pixels * std::max<std::int64_t>(d.channels, 1)));
  const std::int64_t pixels_per_item = tiles_per_item * mask_tile_pixels;
  const std::int64_t items_per_image = (d.pixels + pixels_per_item - 1) / pixels_per_item;
  parallel_for(backend, d.images * items_per_image, [&](std::int64_t item, int) {
    const std::int64_t image = item / items_per_image;
    const std::int64_t first = item % items_per_image * pixels_per_item;
    visit(image, first, std::min(d.pixels, first + pixels_per_item));
  });
}

template <storage_type T>
void pack_relu_mask_channels_last(const cpu_backend& backend, const T* x, T* y,
                                  const channels_last_dims& d, std::uint32_t* words) {
  for_each_pixel_range(backend, d, [&](std::int64_t image, std::int64_t first, std::int64_t last) {
    pack_mask_channels_last(x, y, words, d, image, first, last);
  });
}

template <storage_type T>
void apply_relu_mask_channels_last(const cpu_backend& backend, const std::uint32_t* words,
                                   const T* dy, T* dx, const channels_last_dims& d) {
  for_each_pixel_range(backend, d, [&](std::int64_t image, std::int64_t first, std::int64_t last) {
    apply_mask_channels_last(words, dy, dx, d, image, first, last);
  });
}

template <storage_type T>
void pack_relu_mask(const cpu_backend& backend, const T* x, T* y, std::int64_t n,
                    std::uint32_t* words) {
  for_each_mask_word_range(backend, n, [&](std::int64_t first, std::int64_t last) {
    pack_mask_words(x, y, words, n, first, last);
  });
}

template <storage_type T>
void apply_relu_mask(const cpu_backend& backend, const std::uint32_t* words, const T* dy, T* dx,
                     std::int64_t n) {
  for_each_mask_word_range(backend, n, [&](std::int64_t first, std::int64_t last) {
    apply_mask_words(words, dy, dx, n, first, last);
  });
}

}  // namespace dropit::detail::cpu
