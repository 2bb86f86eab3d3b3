#pragma once
// What the ReLU mask operations of every backend share: the mask's size and the checks of their
// operands.

#include <cstdint>

#include "../../config.hpp"
#include "../../shape.hpp"

namespace dropit {

/// 32-bit words of the mask of `n` elements.
DROPIT_HOST_DEVICE constexpr std::int64_t relu_mask_words(std::int64_t n) { return (n + 31) / 32; }

namespace detail {

// Each check returns the element count.

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
}  // namespace dropit
