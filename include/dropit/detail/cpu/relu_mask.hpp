#pragma once
// The CPU backend's ReLU mask loops: pack (with the fused ReLU forward) and apply, a word of 32
// elements at a time.

#include <algorithm>
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

/// The bits of a 16- or 32-bit element, so that masking is an AND and the loops vectorise.
template <class T>
using element_bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

/// Mask words [first, last) of `x`, and `relu(x)` into `y` unless `y` is null (`y` may be `x`).
template <class T>
void pack_mask_words_kernel(const T* x, T* y, std::uint32_t* words, std::int64_t n,
                            std::int64_t first, std::int64_t last) {
  using bits_type = element_bits<T>;
  for (std::int64_t w = first; w < last; ++w) {
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
    const T* in = x + w * 32;
    std::uint32_t bits = 0;
    for (int j = 0; j < length; ++j)
      bits |= static_cast<std::uint32_t>(!(to_float(in[j]) <= 0.0f)) << j;
    words[w] = bits;
    if (y == nullptr) continue;
    T* out = y + w * 32;
    for (int j = 0; j < length; ++j) {
      const auto keep = static_cast<bits_type>(0u - ((bits >> j) & 1u));
      bits_type value;
      std::memcpy(&value, &in[j], sizeof value);
      value &= keep;
      std::memcpy(static_cast<void*>(&out[j]), &value, sizeof value);
    }
  }
}
DROPIT_CPU_DISPATCH(pack_mask_words)

/// `dx = mask ? dy : 0` over mask words [first, last).
template <class T>
void apply_mask_words_kernel(const std::uint32_t* words, const T* dy, T* dx, std::int64_t n,
                             std::int64_t first, std::int64_t last) {
  using bits_type = element_bits<T>;
  for (std::int64_t w = first; w < last; ++w) {
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
    for (int j = 0; j < length; ++j) {
      const auto keep = static_cast<bits_type>(0u - ((words[w] >> j) & 1u));
      bits_type value;
      std::memcpy(&value, &dy[w * 32 + j], sizeof value);
      value &= keep;
      std::memcpy(static_cast<void*>(&dx[w * 32 + j]), &value, sizeof value);
    }
  }
}
DROPIT_CPU_DISPATCH(apply_mask_words)

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
