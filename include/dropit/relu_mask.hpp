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
#include <type_traits>

#include "backend.hpp"
#include "detail/cpu/parallel.hpp"
#include "shape.hpp"
#include "types.hpp"

namespace dropit {

/// 32-bit words of the mask of `n` elements.
DROPIT_HOST_DEVICE constexpr std::int64_t relu_mask_words(std::int64_t n) { return (n + 31) / 32; }

namespace detail::cpu {
/// Words per parallel work item: large enough to amortise scheduling, a multiple of a cache line.
inline constexpr std::int64_t mask_words_per_item = 4096;
}  // namespace detail::cpu

/// Packs the mask of a ReLU output `y` into `words` (`relu_mask_words(y.numel())` of them).
template <storage_type T>
void pack_relu_mask(const cpu_backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words) {
  const std::int64_t n = y.numel();
  detail::expect_data(y, "ReLU output");
  detail::expect(words != nullptr || n == 0, "ReLU mask buffer is null but ", relu_mask_words(n),
                 " words are required");
  const std::int64_t total = relu_mask_words(n);
  const std::int64_t items =
      (total + detail::cpu::mask_words_per_item - 1) / detail::cpu::mask_words_per_item;
  detail::cpu::parallel_for(backend, items, [&](std::int64_t item, int) {
    const std::int64_t end = std::min(total, (item + 1) * detail::cpu::mask_words_per_item);
    for (std::int64_t w = item * detail::cpu::mask_words_per_item; w < end; ++w) {
      const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
      std::uint32_t bits = 0;
      for (int j = 0; j < length; ++j)
        bits |= static_cast<std::uint32_t>(!(to_float(y.data[w * 32 + j]) <= 0.0f)) << j;
      words[w] = bits;
    }
  });
}

/// ReLU backward from the mask: `dx = mask ? dy : 0`. `dx` may alias `dy`.
template <storage_type T>
void apply_relu_mask(const cpu_backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx) {
  detail::expect(dy.shape == dx.shape, "ReLU gradient shapes differ: dy ", dy.shape, " vs dx ",
                 dx.shape);
  detail::expect_data(dy, "ReLU dy");
  detail::expect_data(dx, "ReLU dx");
  const std::int64_t n = dy.numel();
  detail::expect(words != nullptr || n == 0, "ReLU mask buffer is null");
  const std::int64_t total = relu_mask_words(n);
  const std::int64_t items =
      (total + detail::cpu::mask_words_per_item - 1) / detail::cpu::mask_words_per_item;
  detail::cpu::parallel_for(backend, items, [&](std::int64_t item, int) {
    const std::int64_t end = std::min(total, (item + 1) * detail::cpu::mask_words_per_item);
    for (std::int64_t w = item * detail::cpu::mask_words_per_item; w < end; ++w) {
      const int length = static_cast<int>(std::min<std::int64_t>(32, n - w * 32));
      for (int j = 0; j < length; ++j)
        dx.data[w * 32 + j] = (words[w] >> j) & 1u ? dy.data[w * 32 + j] : T{};
    }
  });
}

}  // namespace dropit
