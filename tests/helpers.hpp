#pragma once
// Test plumbing shared by the test files: input generators, bit-exact comparisons, cache
// inspection and the error-message check. The references themselves live in reference.hpp.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <dropit/dropit.hpp>

#include "reference.hpp"

namespace test {

using dropit::bfloat16;
using dropit::half;

template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, float>)
    return "float";
  else if constexpr (std::is_same_v<T, half>)
    return "half";
  else
    return "bfloat16";
}

template <class T>
T from_bits(std::uint32_t bits) {
  if constexpr (std::is_same_v<T, float>) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  } else {
    return T{static_cast<std::uint16_t>(bits)};
  }
}

template <class T>
T make(double x) {
  return dropit::from_float<T>(static_cast<float>(x));
}

// Bit patterns of special values per type.
template <class T>
struct special {
  static constexpr bool is_float = std::is_same_v<T, float>;
  static constexpr std::uint32_t sign = is_float ? 0x80000000u : 0x8000u;
  static constexpr std::uint32_t inf = is_float                  ? 0x7f800000u
                                       : std::is_same_v<T, half> ? 0x7c00u
                                                                 : 0x7f80u;
  static constexpr std::uint32_t quiet_nan = is_float                  ? 0x7fc00000u
                                             : std::is_same_v<T, half> ? 0x7e00u
                                                                       : 0x7fc0u;
  // Mantissa bits of a subnormal.
  static constexpr std::uint32_t subnormal_mask = is_float                  ? 0x7fffffu
                                                  : std::is_same_v<T, half> ? 0x3ffu
                                                                            : 0x7fu;
};

// Values that stress the ranking: ordinary numbers, many exact duplicates (ties), +0 and -0,
// subnormals, infinities of both signs and canonical NaNs of both signs.
template <class T>
std::vector<T> nasty_values(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> x(static_cast<std::size_t>(n));
  using S = special<T>;
  for (auto& v : x) {
    const auto category = rng() % 100;
    const std::uint32_t sign = (rng() & 1) ? S::sign : 0u;
    if (category < 55) {
      v = make<T>(normal(rng) * std::ldexp(1.0, static_cast<int>(rng() % 7) - 3));
    } else if (category < 70) {
      constexpr double pool[] = {0.5, 1.0, 2.0, 3.0};
      v = make<T>((sign ? -1.0 : 1.0) * pool[rng() % 4]);
    } else if (category < 78) {
      v = from_bits<T>(sign);  // +0 or -0
    } else if (category < 88) {
      v = from_bits<T>(sign | (1u + static_cast<std::uint32_t>(rng() % S::subnormal_mask)));
    } else if (category < 94) {
      v = from_bits<T>(sign | S::inf);
    } else {
      v = from_bits<T>(sign | S::quiet_nan);
    }
  }
  return x;
}

// Finite, non-zero, moderate values: gradients stay well inside every type's range.
template <class T>
std::vector<T> smooth_values(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) {
    double d = uniform(rng);
    if (std::fabs(d) < 1e-3) d = 0.5;
    v = make<T>(d);
  }
  return x;
}

// A 4-D tensor [N, C, H, W] stored channels-last, for the tests of the `_channels_last`
// operations: where an element lies in that storage and in the tensor's logical order.
struct channels_last_case {
  std::int64_t images, channels, height, width;

  std::int64_t pixels() const { return height * width; }
  std::int64_t numel() const { return images * channels * pixels(); }
  dropit::shape logical() const { return {images, channels, height, width}; }
  std::int64_t stored_at(std::int64_t image, std::int64_t channel, std::int64_t pixel) const {
    return (image * pixels() + pixel) * channels + channel;
  }
  std::int64_t logical_at(std::int64_t image, std::int64_t channel, std::int64_t pixel) const {
    return (image * channels + channel) * pixels() + pixel;
  }
};

// The cases those tests run: planes that start mid-word, that chunks cut mid-plane, and chunks
// ending mid-image; tiles of channels cut short (the ReLU mask's are 1024 channels wide); one
// channel; planes split over work items (3 channels: 43 680 pixels an item), in a tensor past the
// 2^16 elements that several threads select together; empty.
inline const channels_last_case channels_last_cases[] = {
    {3, 70, 7, 5}, {2, 130, 9, 9}, {2, 1030, 3, 7}, {5, 1, 3, 11}, {2, 3, 300, 200}, {2, 4, 0, 3}};

template <class T>
std::vector<std::uint32_t> bits_of(const std::vector<T>& x) {
  std::vector<std::uint32_t> out;
  out.reserve(x.size());
  for (const T& v : x) out.push_back(dropit::bits_of(v));
  return out;
}

// Empty when a and b agree bit for bit, otherwise a description of the first difference.
template <class T>
std::string bit_difference(const std::vector<T>& got, const std::vector<T>& want) {
  std::ostringstream out;
  if (got.size() != want.size()) {
    out << "size " << got.size() << " != " << want.size();
    return out.str();
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (dropit::bits_of(got[i]) != dropit::bits_of(want[i])) {
      out << "first difference at " << i << ": got bits 0x" << std::hex << dropit::bits_of(got[i])
          << ", want 0x" << dropit::bits_of(want[i]);
      return out.str();
    }
  return {};
}

#define CHECK_BITS_EQUAL(got, want)                                        \
  do {                                                                     \
    const std::string difference_ = ::test::bit_difference((got), (want)); \
    CHECK_MESSAGE(difference_.empty(), difference_);                       \
  } while (0)

template <class T>
dropit::tensor_view<const T> view_of(const std::vector<T>& x, dropit::shape s) {
  return {x.data(), s};
}

template <class T>
dropit::tensor_view<T> view_of(std::vector<T>& x, dropit::shape s) {
  return {x.data(), s};
}

// The encoded positions of a cache, as raw bytes.
template <class T>
std::vector<unsigned char> position_bytes(const dropit::cache<T>& c) {
  const auto* p = static_cast<const unsigned char*>(c.view().positions);
  return std::vector<unsigned char>(p, p + c.layout().position_bytes());
}

template <class T>
std::vector<T> values_of(const dropit::cache<T>& c) {
  return std::vector<T>(c.values().begin(), c.values().end());
}

inline dropit::shape shape_of(const std::vector<std::int64_t>& dims) { return dropit::shape(dims); }

/// One thread: the reference the threaded results are compared with.
inline const dropit::cpu_backend serial{1};

// ---------------------------------------------------------------------------------------------
// Every selection x granularity combination, with and without rescaling: f(policy, name).

template <class F>
void for_each_policy(double gamma, int channel_axis, F&& f) {
  using namespace dropit;
  f(policy<chunked_min_k_selection>{{gamma, default_chunk_size}}, "chunked min-k, D = 2^14");
  f(policy<chunked_min_k_selection>{{gamma, 7}}, "chunked min-k, D = 7");
  f(policy<min_k_selection>{{gamma}}, "min-k");
  f(policy<random_selection>{{.gamma = gamma, .seed = 12345, .chunk_size = 64}}, "random, D = 64");
  f(policy<random_selection>{{.gamma = gamma, .seed = 7, .chunk_size = 50, .rescale = true}},
    "random, D = 50, rescaled");
  f(policy<min_k_selection, channel_granularity>{{gamma}, {channel_axis}}, "channel min-k");
  f(policy<random_selection, channel_granularity>{{.gamma = gamma, .seed = 99}, {channel_axis}},
    "channel random");
  f(policy<random_selection, channel_granularity>{{.gamma = gamma, .seed = 5, .rescale = true},
                                                  {channel_axis}},
    "channel random, rescaled");
}

// The kept positions as the cache encodes them, decoded straight from the documented formats:
// LSB-first 32-bit mask words per chunk, 16/32-bit offsets within a chunk, or a list of channels.
// Empty for seeded caches, whose positions are not stored.
template <class T>
std::vector<bool> decoded_mask(const dropit::cache<T>& c) {
  const dropit::cache_layout& l = c.layout();
  const void* raw = c.view().positions;
  std::vector<bool> mask(static_cast<std::size_t>(l.numel()), false);
  const std::int64_t n = l.numel(), d = l.chunk_size;
  switch (l.encoding) {
    case dropit::position_encoding::bitmask:
      for (std::int64_t begin = 0, chunk = 0; begin < n; begin += d, ++chunk) {
        const auto* words = static_cast<const std::uint32_t*>(raw) + chunk * ref::ceil_div(d, 32);
        for (std::int64_t i = 0; i < std::min(d, n - begin); ++i)
          if ((words[i / 32] >> (i % 32)) & 1u) mask[begin + i] = true;
      }
      break;
    case dropit::position_encoding::offsets: {
      std::int64_t value = 0;
      for (std::int64_t begin = 0; begin < n; begin += d) {
        const std::int64_t length = std::min(d, n - begin);
        const std::int64_t kept = length == d ? l.kept_per_chunk : l.kept_per_tail;
        std::int64_t previous = -1;
        for (std::int64_t j = 0; j < kept; ++j, ++value) {
          const std::int64_t offset = l.offset_bytes == 2
                                          ? static_cast<const std::uint16_t*>(raw)[value]
                                          : static_cast<const std::uint32_t*>(raw)[value];
          CHECK_MESSAGE(offset > previous, "offsets must ascend within a chunk");
          REQUIRE(offset < length);
          previous = offset;
          mask[begin + offset] = true;
        }
      }
      break;
    }
    case dropit::position_encoding::channel_list: {
      const auto* list = static_cast<const std::uint32_t*>(raw);
      for (std::int64_t j = 0; j < l.kept_channels; ++j) {
        if (j > 0) CHECK_MESSAGE(list[j] > list[j - 1], "the channel list must ascend");
        REQUIRE(list[j] < l.channels);
        for (std::int64_t o = 0; o < l.outer; ++o)
          for (std::int64_t i = 0; i < l.inner; ++i)
            mask[(o * l.channels + list[j]) * l.inner + i] = true;
      }
      break;
    }
    case dropit::position_encoding::seeded:
      mask.clear();
      break;
  }
  return mask;
}

// ---------------------------------------------------------------------------------------------
// Errors: the call must throw dropit::error whose message names every `needles` entry.

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const dropit::error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a dropit::error: ") + e.what() + ">";
  }
  return "<no exception>";
}

#define CHECK_ERROR(expr, ...)                                                                     \
  do {                                                                                             \
    const std::string message_ = ::test::error_message([&] { (void)(expr); });                     \
    INFO("call: " #expr);                                                                          \
    INFO("message: ", message_);                                                                   \
    CHECK_MESSAGE(message_.rfind("dropit: ", 0) == 0, "expected a dropit::error");                 \
    for (const std::string& needle_ : std::initializer_list<std::string>{__VA_ARGS__})             \
      CHECK_MESSAGE(message_.find(needle_) != std::string::npos, "message should name '", needle_, \
                    "'");                                                                          \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Gradient tolerance: |got - want| <= in_rel * sum|terms| + out_rel * |want| + absolute. The
// first term bounds float summation in any order; the second the rounding of a 16-bit result.

struct tolerance {
  double in_rel = 1e-5, out_rel = 0.0, absolute = 1e-30;
};

template <class T>
tolerance tolerance_for() {
  if constexpr (std::is_same_v<T, float>)
    return {};
  else if constexpr (std::is_same_v<T, half>)
    return {1e-5, 0x1p-10, 0x1p-24};
  else
    return {1e-5, 0x1p-7, 1e-38};
}

template <class T>
std::vector<float> as_float(const std::vector<T>& x) {
  std::vector<float> out;
  out.reserve(x.size());
  for (const T& v : x) out.push_back(static_cast<float>(ref::value_of(v)));
  return out;
}

// The operand of the weight gradients, as the contract defines it: densify(cache) before its
// rounding to T, i.e. every kept value times n/k in float (rescaled random caches). The positions
// come from densifying the same buffers without rescaling; the scale is computed here from the
// chunk lengths and kept counts.
template <class T>
std::vector<float> gradient_operand(const dropit::cache<T>& c) {
  dropit::cache_layout plain = c.layout();
  plain.rescale = false;
  const dropit::cache_view<const T> view{plain, c.view().values, c.view().positions};
  std::vector<float> out = as_float(dropit::densify(dropit::cpu_backend{1}, view));
  const dropit::cache_layout& l = c.layout();
  if (!l.rescale) return out;
  const auto n = static_cast<std::int64_t>(out.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double scale;
    if (l.channel_granularity) {
      scale = static_cast<double>(l.channels) / static_cast<double>(l.kept_channels);
    } else {
      const std::int64_t begin = i / l.chunk_size * l.chunk_size;
      const std::int64_t length = std::min(l.chunk_size, n - begin);
      scale = static_cast<double>(length) /
              static_cast<double>(length == l.chunk_size ? l.kept_per_chunk : l.kept_per_tail);
    }
    out[i] *= static_cast<float>(scale);
  }
  return out;
}

template <class T>
std::string gradient_difference(const std::vector<T>& got, const ref::dense_gradient& want,
                                tolerance tol) {
  std::ostringstream out;
  if (got.size() != want.value.size()) {
    out << "size " << got.size() << " != " << want.value.size();
    return out.str();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = ref::value_of(got[i]), w = want.value[i];
    const double bound = tol.in_rel * want.magnitude[i] + tol.out_rel * std::fabs(w) + tol.absolute;
    if (!(std::fabs(g - w) <= bound)) {
      out << "element " << i << ": got " << g << ", want " << w << " (bound " << bound << ")";
      return out.str();
    }
  }
  return {};
}

#define CHECK_GRADIENT(got, want, tol)                                                 \
  do {                                                                                 \
    const std::string difference_ = ::test::gradient_difference((got), (want), (tol)); \
    CHECK_MESSAGE(difference_.empty(), difference_);                                   \
  } while (0)

}  // namespace test
