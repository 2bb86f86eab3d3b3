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
#include "detail/cpu/simd.hpp"
#include "shape.hpp"
#include "types.hpp"

namespace dropit {

/// 32-bit words of the mask of `n` elements.
DROPIT_HOST_DEVICE constexpr std::int64_t relu_mask_words(std::int64_t n) { return (n + 31) / 32; }

namespace detail {

// The checks of the ReLU mask operations, shared by every backend; each returns the element count.

template <class Y>
std::int64_t check_pack_relu_mask(const tensor_view<Y>& y, const std::uint32_t* words) {
  const std::int64_t n = y.numel();
  expect_data(y, "ReLU output");
  expect(words != nullptr || n == 0, "ReLU mask buffer is null but ", relu_mask_words(n),
         " words are required");
  return n;
}

template <class X, class Y>
std::int64_t check_relu_with_mask(const tensor_view<X>& x, const tensor_view<Y>& y,
                                  const std::uint32_t* words) {
  expect_data(x, "ReLU input");
  expect_data(y, "ReLU output");
  expect(x.shape == y.shape, "ReLU shapes differ: input ", x.shape, " vs output ", y.shape);
  return check_pack_relu_mask(y, words);
}

template <class DY, class DX>
std::int64_t check_apply_relu_mask(const std::uint32_t* words, const tensor_view<DY>& dy,
                                   const tensor_view<DX>& dx) {
  expect_data(dy, "ReLU dy");
  expect_data(dx, "ReLU dx");
  expect(dy.shape == dx.shape, "ReLU gradient shapes differ: dy ", dy.shape, " vs dx ", dx.shape);
  const std::int64_t n = dy.numel();
  expect(words != nullptr || n == 0, "ReLU mask buffer is null");
  return n;
}

}  // namespace detail

namespace detail::cpu {

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

}  // namespace detail::cpu

/// Packs the mask of a ReLU output `y` into `words` (`relu_mask_words(y.numel())` of them).
template <storage_type T>
void pack_relu_mask(const cpu_backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words) {
  const std::int64_t n = detail::check_pack_relu_mask(y, words);
  detail::cpu::for_each_mask_word_range(backend, n, [&](std::int64_t first, std::int64_t last) {
    detail::cpu::pack_mask_words(y.data, static_cast<T*>(nullptr), words, n, first, last);
  });
}

/// ReLU forward and its mask in one pass: `y = relu(x)`, and the mask of `y` into `words`
/// (`relu_mask_words(x.numel())` of them). `y` may alias `x`.
template <storage_type T>
void relu_with_mask(const cpu_backend& backend, tensor_view<const std::type_identity_t<T>> x,
                    tensor_view<T> y, std::uint32_t* words) {
  const std::int64_t n = detail::check_relu_with_mask(x, y, words);
  detail::cpu::for_each_mask_word_range(backend, n, [&](std::int64_t first, std::int64_t last) {
    detail::cpu::pack_mask_words(x.data, y.data, words, n, first, last);
  });
}

/// ReLU backward from the mask: `dx = mask ? dy : 0`. `dx` may alias `dy`.
template <storage_type T>
void apply_relu_mask(const cpu_backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx) {
  const std::int64_t n = detail::check_apply_relu_mask(words, dy, dx);
  detail::cpu::for_each_mask_word_range(backend, n, [&](std::int64_t first, std::int64_t last) {
    detail::cpu::apply_mask_words(words, dy.data, dx.data, n, first, last);
  });
}

}  // namespace dropit
