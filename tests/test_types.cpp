// Element types: float <-> half / bfloat16 conversions checked against expectations derived
// independently (exact constants, an exhaustive decoder and a nearest-value search), plus the
// small vocabulary types (shape, element_type).

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;

float float_from_bits(std::uint32_t bits) { return test::from_bits<float>(bits); }
std::uint16_t half_bits(float x) { return dropit::from_float<half>(x).bits; }
std::uint16_t bf16_bits(float x) { return dropit::from_float<bfloat16>(x).bits; }

// Round-to-nearest-even into half by searching the sorted list of every finite half magnitude.
std::uint16_t expected_half_bits(float x) {
  static const std::vector<double> magnitudes = [] {
    std::vector<double> m;
    for (std::uint32_t b = 0; b <= 0x7bff; ++b) m.push_back(ref::value_of(half{std::uint16_t(b)}));
    return m;
  }();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;  // any NaN; callers only test NaN-ness
  const double m = std::fabs(static_cast<double>(x));
  if (m >= 65520.0) return sign | 0x7c00;  // at or beyond the midpoint of 65504 and 2^16
  const auto upper = std::lower_bound(magnitudes.begin(), magnitudes.end(), m);
  if (upper == magnitudes.end()) return sign | 0x7bff;  // (65504, 65520): down to the largest
  const auto hi = static_cast<std::uint32_t>(upper - magnitudes.begin());
  if (magnitudes[hi] == m || hi == 0) return static_cast<std::uint16_t>(sign | hi);
  const std::uint32_t lo = hi - 1;
  const double below = m - magnitudes[lo], above = magnitudes[hi] - m;
  const std::uint32_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<std::uint16_t>(sign | pick);
}

// Round-to-nearest-even into bfloat16 by comparing the two neighbouring truncations in double.
std::uint16_t expected_bf16_bits(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
  const std::uint32_t lo = magnitude >> 16, hi = lo + 1;
  const auto value = [](std::uint32_t b16) {
    return b16 == 0x7f80 ? std::ldexp(1.0, 128) : ref::value_of(bfloat16{std::uint16_t(b16)});
  };
  const double m = std::fabs(static_cast<double>(x));
  if (magnitude >= 0x7f800000u) return static_cast<std::uint16_t>((sign >> 16) | lo);  // inf
  const double below = m - value(lo), above = value(hi) - m;
  const std::uint32_t pick = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<std::uint16_t>((sign >> 16) | pick);
}

}  // namespace

TEST_CASE("half: exact values, subnormals, extremes") {
  CHECK(half_bits(1.0f) == 0x3c00);
  CHECK(half_bits(-2.0f) == 0xc000);
  CHECK(half_bits(0.5f) == 0x3800);
  CHECK(half_bits(65504.0f) == 0x7bff);                  // largest finite half
  CHECK(half_bits(std::ldexp(1.0f, -14)) == 0x0400);     // smallest normal
  CHECK(half_bits(std::ldexp(1.0f, -24)) == 0x0001);     // smallest subnormal
  CHECK(half_bits(std::ldexp(1023.0f, -24)) == 0x03ff);  // largest subnormal
  CHECK(half_bits(0.0f) == 0x0000);
  CHECK(half_bits(-0.0f) == 0x8000);
  CHECK(dropit::to_float(half{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(dropit::to_float(half{0x03ff}) == std::ldexp(1023.0f, -24));
  CHECK(dropit::to_float(half{0x7bff}) == 65504.0f);
  CHECK(dropit::to_float(half{0xfbff}) == -65504.0f);
  CHECK(std::signbit(dropit::to_float(half{0x8000})));
}

TEST_CASE("half: round to nearest, ties to even, overflow to infinity") {
  CHECK(half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie: 1.0 has even mantissa
  CHECK(half_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie: rounds up to even
  CHECK(half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);  // above tie
  CHECK(half_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even is 0
  CHECK(half_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(half_bits(3 * std::ldexp(1.0f, -25)) == 0x0002);  // subnormal tie to even
  CHECK(half_bits(65519.0f) == 0x7bff);                   // below the midpoint to 2^16
  CHECK(half_bits(65520.0f) == 0x7c00);                   // the midpoint: even is infinity
  CHECK(half_bits(1e10f) == 0x7c00);
  CHECK(half_bits(-1e10f) == 0xfc00);
  CHECK(half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
}

TEST_CASE("half: infinity and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(half_bits(inf) == 0x7c00);
  CHECK(half_bits(-inf) == 0xfc00);
  CHECK(std::isinf(dropit::to_float(half{0x7c00})));
  // NaN stays NaN, including payloads that live only in the low float bits a cast would drop.
  for (std::uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u}) {
    const std::uint16_t h = half_bits(float_from_bits(nan));
    INFO("float NaN bits 0x" << std::hex << nan << " -> half 0x" << h);
    CHECK((h & 0x7c00) == 0x7c00);
    CHECK((h & 0x03ff) != 0);
    CHECK(std::isnan(dropit::to_float(half{h})));
  }
  CHECK(std::isnan(dropit::to_float(half{0x7c01})));
  CHECK(std::isnan(dropit::to_float(half{0xfe00})));
}

TEST_CASE("half -> float is exact for every bit pattern") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const half h{static_cast<std::uint16_t>(b)};
    const double want = ref::value_of(h);
    const float got = dropit::to_float(h);
    if (std::isnan(want)) {
      if (!std::isnan(got)) FAIL_CHECK("half 0x" << std::hex << b << " should decode to NaN");
      continue;
    }
    if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want))
      FAIL_CHECK("half 0x" << std::hex << b << " decodes to " << got << ", want " << want);
    // Every finite half survives the round trip.
    if (half_bits(got) != b) FAIL_CHECK("round trip of half 0x" << std::hex << b);
  }
}

TEST_CASE("float -> half matches a nearest-value search") {
  std::vector<float> inputs;
  // Midpoints between consecutive halves, and their neighbours: where rounding decides.
  for (std::uint32_t b = 0; b < 0x7bff; ++b) {
    const double mid =
        (ref::value_of(half{std::uint16_t(b)}) + ref::value_of(half{std::uint16_t(b + 1)})) / 2;
    const auto f = static_cast<float>(mid);  // exact: a half midpoint needs 12 significant bits
    for (float v : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) inputs.push_back(float_from_bits(rng()));
  for (int i = 0; i < 100000; ++i)  // random bits concentrated on the half range
    inputs.push_back(float_from_bits((rng() & 0x807fffffu) | ((100u + rng() % 60u) << 23)));
  int failures = 0;
  for (float x : inputs) {
    if (std::isnan(x)) continue;
    const std::uint16_t got = half_bits(x), want = expected_half_bits(x);
    if (got != want && ++failures <= 5)
      FAIL_CHECK(x << " (bits 0x" << std::hex << test::bits_of(std::vector<float>{x})[0]
                   << ") -> half 0x" << got << ", want 0x" << want);
  }
  CHECK(failures == 0);
}

TEST_CASE("bfloat16: exact values, rounding, infinity and NaN") {
  CHECK(bf16_bits(1.0f) == 0x3f80);
  CHECK(bf16_bits(-2.0f) == 0xc000);
  CHECK(bf16_bits(-0.0f) == 0x8000);
  CHECK(bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie to even (down)
  CHECK(bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie to even (up)
  CHECK(bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3f81);
  CHECK(bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest
  CHECK(bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(dropit::to_float(bfloat16{0x0001}) == std::ldexp(1.0f, -133));  // subnormal bfloat16
  for (std::uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u}) {
    const std::uint16_t b = bf16_bits(float_from_bits(nan));
    INFO("float NaN bits 0x" << std::hex << nan << " -> bfloat16 0x" << b);
    CHECK(std::isnan(dropit::to_float(bfloat16{b})));
  }
}

TEST_CASE("float -> bfloat16 matches a nearest-value comparison") {
  std::mt19937 rng(11);
  int failures = 0;
  for (int i = 0; i < 300000; ++i) {
    std::uint32_t bits = rng();
    if (i % 3 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    const float x = float_from_bits(bits);
    if (std::isnan(x)) continue;
    const std::uint16_t got = bf16_bits(x), want = expected_bf16_bits(x);
    if (got != want && ++failures <= 5)
      FAIL_CHECK("bits 0x" << std::hex << bits << " -> bfloat16 0x" << got << ", want 0x" << want);
  }
  CHECK(failures == 0);
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {  // every bfloat16 decodes exactly
    const bfloat16 v{static_cast<std::uint16_t>(b)};
    const float got = dropit::to_float(v);
    if (std::isnan(ref::value_of(v)) ? !std::isnan(got) : bf16_bits(got) != b)
      FAIL_CHECK("bfloat16 0x" << std::hex << b);
  }
}

TEST_CASE("element types and their names") {
  CHECK(dropit::element_type_of<float> == dropit::element_type::float32);
  CHECK(dropit::element_type_of<half> == dropit::element_type::float16);
  CHECK(dropit::element_type_of<bfloat16> == dropit::element_type::bfloat16);
  CHECK(dropit::name_of(dropit::element_type::float16) == "float16");
  CHECK(dropit::bits_of(half{0x1234}) == 0x1234u);
  CHECK(dropit::bits_of(1.0f) == 0x3f800000u);
  CHECK(sizeof(half) == 2);
  CHECK(sizeof(bfloat16) == 2);
}

TEST_CASE("shape: extents, numel, printing") {
  const dropit::shape s{2, 3, 4};
  CHECK(s.rank == 3);
  CHECK(s.numel() == 24);
  CHECK(s.product(1, 3) == 12);
  CHECK(dropit::shape{}.numel() == 1);  // a scalar
  CHECK(dropit::shape{5, 0, 7}.numel() == 0);
  CHECK(dropit::shape(std::vector<int>{2, 3, 4}) == s);
  std::ostringstream out;
  out << s;
  CHECK(out.str() == "[2, 3, 4]");
}
