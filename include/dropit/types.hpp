#pragma once
/// @file
/// Element types a cache can hold: `float` and two 16-bit storage types. Arithmetic always happens
/// in `float`; the 16-bit types only store bits and convert.

#include <concepts>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "config.hpp"

namespace dropit {

/// IEEE 754 binary16 storage.
struct half {
  std::uint16_t bits = 0;
};

/// bfloat16 storage (the upper half of an IEEE binary32).
struct bfloat16 {
  std::uint16_t bits = 0;
};

/// Runtime tag of an element type, recorded in a cache so backward can check what it is given.
enum class element_type : std::uint8_t { float32, float16, bfloat16 };

template <class T>
concept storage_type = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;

template <storage_type T>
inline constexpr element_type element_type_of = std::same_as<T, float>  ? element_type::float32
                                                : std::same_as<T, half> ? element_type::float16
                                                                        : element_type::bfloat16;

constexpr std::string_view name_of(element_type type) {
  switch (type) {
    case element_type::float32:
      return "float32";
    case element_type::float16:
      return "float16";
    case element_type::bfloat16:
      return "bfloat16";
  }
  return "unknown";
}

namespace detail {

DROPIT_HOST_DEVICE inline std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

DROPIT_HOST_DEVICE inline float float_from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

DROPIT_HOST_DEVICE inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return float_from_bits(sign);
  // Subnormal half: renormalise into a normal float.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3ffu;
  return float_from_bits(sign | (static_cast<std::uint32_t>(113 - shift) << 23) | (mantissa << 13));
}

/// Round to nearest even, NaN stays NaN, overflow goes to infinity.
DROPIT_HOST_DEVICE inline std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf or NaN
    return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (magnitude < 0x38800000u) {                        // below the smallest normal half
    if (magnitude < 0x33000000u) return sign;           // below half the smallest subnormal
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // value / 2^-24 == mantissa >> shift
    const std::uint32_t rounded = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    std::uint32_t result = rounded;
    if (remainder > halfway || (remainder == halfway && (rounded & 1u))) ++result;
    return sign | static_cast<std::uint16_t>(result);
  }
  std::uint32_t result = magnitude - 0x38000000u;  // rebias 127 -> 15
  result = (result + 0xfffu + ((result >> 13) & 1u)) >> 13;
  return sign | static_cast<std::uint16_t>(result);
}

DROPIT_HOST_DEVICE inline float bfloat16_to_float(std::uint16_t b) {
  return float_from_bits(static_cast<std::uint32_t>(b) << 16);
}

/// Round to nearest even; NaN stays a (quiet) NaN.
DROPIT_HOST_DEVICE inline std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace detail

template <storage_type T>
DROPIT_HOST_DEVICE inline float to_float(T value) {
  if constexpr (std::same_as<T, float>)
    return value;
  else if constexpr (std::same_as<T, half>)
    return detail::half_to_float(value.bits);
  else
    return detail::bfloat16_to_float(value.bits);
}

template <storage_type T>
DROPIT_HOST_DEVICE inline T from_float(float value) {
  if constexpr (std::same_as<T, float>)
    return value;
  else if constexpr (std::same_as<T, half>)
    return half{detail::float_to_half(value)};
  else
    return bfloat16{detail::float_to_bfloat16(value)};
}

/// Raw bits of a stored value, used for bit-exact comparisons.
template <storage_type T>
DROPIT_HOST_DEVICE inline std::uint32_t bits_of(T value) {
  if constexpr (std::same_as<T, float>)
    return detail::float_bits(value);
  else
    return value.bits;
}

namespace detail {

/// The unsigned integer of a stored value's size: elements copied or masked as plain bits.
template <storage_type T>
using element_bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

}  // namespace detail

}  // namespace dropit
