#pragma once
/// @file
/// The 1-bit cache of a ReLU. ReLU's backward only needs to know where its output was positive, so
/// it can keep one bit per element instead of the output itself, which is what lets the next
/// layer's compact cache actually free the activation.
///
/// Bit i of word i / 32 is set where `!(y[i] <= 0)`: exactly where ReLU's backward passes the
/// gradient (NaN included, as in PyTorch's threshold_backward).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend.hpp"
#include "detail/cpu/parallel.hpp"
#include "shape.hpp"
#include "types.hpp"

namespace dropit {

/// 32-bit words of the mask of `n` elements.
DROPIT_HOST_DEVICE constexpr std::int64_t relu_mask_words(std::int64_t n) { return (n + 31) / 32; }

namespace detail::cpu {

/// Calls `visit(word, length)` for each mask word of `n` elements (`length` of them in the word),
/// in parallel work items large enough to amortise scheduling.
template <class Visit>
void for_each_mask_word(const cpu_backend& backend, std::int64_t n, Visit&& visit) {
  constexpr std::int64_t words_per_item = 4096;
  const std::int64_t total = relu_mask_words(n);
  parallel_for(backend, (total + words_per_item - 1) / words_per_item, [&](std::int64_t item, int) {
    const std::int64_t end = std::min(total, (item + 1) * words_per_item);
    for (std::int64_t w = item * words_per_item; w < end; ++w)
      visit(w, static_cast<int>(std::min<std::int64_t>(32, n - w * 32)));
  });
}

}  // namespace detail::cpu

/// Packs the mask of a ReLU output `y` into `words` (`relu_mask_words(y.numel())` of them).
template <storage_type T>
void pack_relu_mask(const cpu_backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words) {
  const std::int64_t n = y.numel();
  detail::expect_data(y, "ReLU output");
  detail::expect(words != nullptr || n == 0, "ReLU mask buffer is null but ", relu_mask_words(n),
                 " words are required");
  detail::cpu::for_each_mask_word(backend, n, [&](std::int64_t w, int length) {
    std::uint32_t bits = 0;
    for (int j = 0; j < length; ++j)
      bits |= static_cast<std::uint32_t>(!(to_float(y.data[w * 32 + j]) <= 0.0f)) << j;
    words[w] = bits;
  });
}

/// ReLU backward from the mask: `dx = mask ? dy : 0`. `dx` may alias `dy`.
template <storage_type T>
void apply_relu_mask(const cpu_backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx) {
  detail::expect_data(dy, "ReLU dy");
  detail::expect_data(dx, "ReLU dx");
  detail::expect(dy.shape == dx.shape, "ReLU gradient shapes differ: dy ", dy.shape, " vs dx ",
                 dx.shape);
  const std::int64_t n = dy.numel();
  detail::expect(words != nullptr || n == 0, "ReLU mask buffer is null");
  detail::cpu::for_each_mask_word(backend, n, [&](std::int64_t w, int length) {
    // Masking the bits rather than branching lets the loop vectorise.
    using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;
    for (int j = 0; j < length; ++j) {
      const auto keep = static_cast<bits_type>(0u - ((words[w] >> j) & 1u));
      bits_type bits;
      std::memcpy(&bits, &dy.data[w * 32 + j], sizeof bits);
      bits &= keep;
      std::memcpy(static_cast<void*>(&dx.data[w * 32 + j]), &bits, sizeof bits);
    }
  });
}

}  // namespace dropit
