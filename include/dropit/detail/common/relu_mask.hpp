#pragma once
// What the ReLU mask operations of every backend share: the mask's size and the checks of their
// operands.

#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../../shape.hpp"
#include "../../types.hpp"

namespace dropit {

/// 32-bit words of the mask of `n` elements.
DROPIT_HOST_DEVICE constexpr std::int64_t relu_mask_words(std::int64_t n) { return (n + 31) / 32; }

namespace detail {

/// Whether ReLU passes the gradient at output `y`: `!(y <= 0)` (positive, +inf or any NaN), decided
/// on the bits, so that flush-to-zero arithmetic (nvcc's --use_fast_math, -ftz) cannot read a
/// positive subnormal as zero.
template <storage_type T>
DROPIT_HOST_DEVICE inline bool relu_passes(T y) {
  constexpr std::uint32_t sign = sizeof(T) == 4 ? 0x80000000u : 0x8000u;
  constexpr std::uint32_t infinity = sizeof(T) == 4            ? 0x7f800000u
                                     : std::is_same_v<T, half> ? 0x7c00u
                                                               : 0x7f80u;
  const std::uint32_t bits = bits_of(y);
  const std::uint32_t magnitude = bits & (sign - 1);
  return magnitude > infinity || (magnitude != 0 && (bits & sign) == 0);
}

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

/// A mask of the low `length` bits (0 to 63).
DROPIT_HOST_DEVICE constexpr std::uint64_t low_bits(int length) {
  return (std::uint64_t{1} << length) - 1;
}

/// Mask bits [position, position + length) as the low bits of the result (length 1 to 32).
DROPIT_HOST_DEVICE inline std::uint32_t load_mask_bits(const std::uint32_t* words,
                                                       std::int64_t position, int length) {
  const std::int64_t word = position / 32;
  const int shift = static_cast<int>(position % 32);
  std::uint64_t bits = words[word] >> shift;
  if (shift + length > 32) bits |= static_cast<std::uint64_t>(words[word + 1]) << (32 - shift);
  return static_cast<std::uint32_t>(bits & low_bits(length));
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
