// The 1-bit ReLU cache: bit i of word i/32 is set exactly where ReLU's backward passes the
// gradient, i.e. where !(y <= 0) (NaN included), and backward zeroes the rest.

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

// Independent reference: whether ReLU's backward passes the gradient at output y.
template <class T>
bool passes(T y) {
  return !(ref::value_of(y) <= 0.0);
}

}  // namespace

TEST_CASE_TEMPLATE("ReLU mask packs !(y <= 0) and backward keeps dy only there", T, float, half,
                   bfloat16) {
  for (std::int64_t n : {0, 1, 31, 32, 33, 1000, 4096 * 32 + 77}) {  // the last spans work items
    CAPTURE(n);
    const auto y = test::nasty_values<T>(n, static_cast<std::uint64_t>(n) + 1);
    const auto dy = test::smooth_values<T>(n, 2);
    std::vector<std::uint32_t> words(static_cast<std::size_t>(relu_mask_words(n)) + 1, 0xdeadbeef);
    CHECK(relu_mask_words(n) == ref::ceil_div(n, 32));
    pack_relu_mask<T>(cpu_backend{3}, test::view_of(y, {n}), words.data());
    CHECK(words.back() == 0xdeadbeef);  // nothing written past the mask
    std::vector<T> want(static_cast<std::size_t>(n), T{});
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool bit = (words[i / 32] >> (i % 32)) & 1u;
      wrong += bit != passes(y[i]);
      if (passes(y[i])) want[i] = dy[i];
    }
    CHECK(wrong == 0);
    if (n % 32 != 0) CHECK((words[n / 32] >> (n % 32)) == 0u);  // unused high bits stay clear

    std::vector<T> dx(static_cast<std::size_t>(n), test::make<T>(9.0));
    apply_relu_mask<T>(cpu_backend{3}, words.data(), test::view_of(dy, {n}),
                       test::view_of(dx, {n}));
    CHECK_BITS_EQUAL(dx, want);
    auto in_place = dy;  // dx may alias dy
    apply_relu_mask<T>(cpu_backend{1}, words.data(), test::view_of(in_place, {n}),
                       test::view_of(in_place, {n}));
    CHECK_BITS_EQUAL(in_place, want);
  }
}

TEST_CASE_TEMPLATE("ReLU forward with its mask: relu(x) and the mask of relu(x) in one pass", T,
                   float, half, bfloat16) {
  for (std::int64_t n : {0, 1, 31, 33, 1000, 4096 * 32 + 77}) {
    CAPTURE(n);
    const auto x = test::nasty_values<T>(n, static_cast<std::uint64_t>(n) + 5);
    // Reference: ReLU passes x where !(x <= 0) (NaN included) and is +-0 elsewhere.
    std::vector<T> want_y(static_cast<std::size_t>(n), T{});
    std::vector<std::uint32_t> want_words(static_cast<std::size_t>(ref::ceil_div(n, 32)), 0u);
    for (std::int64_t i = 0; i < n; ++i)
      if (passes(x[i])) {
        want_y[i] = x[i];
        want_words[i / 32] |= 1u << (i % 32);
      }
    std::vector<std::uint32_t> words(want_words.size() + 1, 0xdeadbeef);
    std::vector<T> y(static_cast<std::size_t>(n), test::make<T>(9.0));
    relu_with_mask<T>(cpu_backend{3}, test::view_of(x, {n}), test::view_of(y, {n}), words.data());
    CHECK(words.back() == 0xdeadbeef);
    words.pop_back();
    CHECK(words == want_words);
    CHECK_BITS_EQUAL(y, want_y);

    auto in_place = x;  // y may alias x
    std::vector<std::uint32_t> in_place_words(want_words.size());
    relu_with_mask<T>(cpu_backend{1}, test::view_of(in_place, {n}), test::view_of(in_place, {n}),
                      in_place_words.data());
    CHECK(in_place_words == want_words);
    CHECK_BITS_EQUAL(in_place, want_y);
  }
}

// A channels-last tensor's mask is its logical order's: bit (n, c, p) of N x C x P at
// (n * C + c) * P + p, while the elements lie at (n * P + p) * C + c.
TEST_CASE_TEMPLATE("ReLU mask of a channels-last tensor is in its logical order", T, float, half,
                   bfloat16) {
  for (const test::channels_last_case& d : test::channels_last_cases) {
    const std::int64_t pixels = d.pixels(), n = d.numel();
    CAPTURE(d.images);
    CAPTURE(d.channels);
    CAPTURE(pixels);
    const auto x = test::nasty_values<T>(n, static_cast<std::uint64_t>(n) + 9);
    const auto dy = test::smooth_values<T>(n, 4);
    std::vector<std::uint32_t> want_words(static_cast<std::size_t>(ref::ceil_div(n, 32)), 0u);
    std::vector<T> want_y(static_cast<std::size_t>(n), T{}), want_dx(want_y);
    for (std::int64_t image = 0; image < d.images; ++image)
      for (std::int64_t c = 0; c < d.channels; ++c)
        for (std::int64_t p = 0; p < pixels; ++p) {
          const std::int64_t at = d.stored_at(image, c, p);
          const std::int64_t bit = d.logical_at(image, c, p);
          if (!passes(x[at])) continue;
          want_words[bit / 32] |= 1u << (bit % 32);
          want_y[at] = x[at];
          want_dx[at] = dy[at];
        }
    const dropit::shape logical = d.logical();
    std::vector<std::uint32_t> words(want_words.size() + 1, 0xdeadbeef);
    std::vector<T> y(static_cast<std::size_t>(n), test::make<T>(9.0));
    relu_with_mask_channels_last<T>(cpu_backend{3}, {x.data(), logical}, {y.data(), logical},
                                    words.data());
    CHECK(words.back() == 0xdeadbeef);  // nothing written past the mask
    words.pop_back();
    CHECK(words == want_words);
    CHECK_BITS_EQUAL(y, want_y);

    std::vector<T> dx(static_cast<std::size_t>(n), test::make<T>(9.0));
    apply_relu_mask_channels_last<T>(cpu_backend{3}, words.data(), {dy.data(), logical},
                                     {dx.data(), logical});
    CHECK_BITS_EQUAL(dx, want_dx);
    auto in_place = x;  // y may alias x, dx may alias dy
    relu_with_mask_channels_last<T>(cpu_backend{2}, {in_place.data(), logical},
                                    {in_place.data(), logical}, words.data());
    CHECK(words == want_words);
    CHECK_BITS_EQUAL(in_place, want_y);
    in_place = dy;
    apply_relu_mask_channels_last<T>(cpu_backend{2}, words.data(), {in_place.data(), logical},
                                     {in_place.data(), logical});
    CHECK_BITS_EQUAL(in_place, want_dx);
  }
}

TEST_CASE("ReLU mask of a channels-last tensor: bad input") {
  const std::vector<float> y(40, 1.0f);
  std::vector<float> dx(40);
  std::vector<std::uint32_t> words(2);
  CHECK_ERROR(relu_with_mask_channels_last<float>(cpu_backend{1}, test::view_of(y, {4, 10}),
                                                  test::view_of(dx, {4, 10}), words.data()),
              "[4, 10]", "4-D");
  CHECK_ERROR(apply_relu_mask_channels_last<float>(cpu_backend{1}, words.data(),
                                                   test::view_of(y, {2, 2, 2, 5}),
                                                   test::view_of(dx, {2, 2, 5, 2})),
              "[2, 2, 2, 5]", "[2, 2, 5, 2]");
}

TEST_CASE("ReLU mask: zeros of both signs are off, NaN and tiny positives are on") {
  const std::vector<float> y = {0.0f,
                                -0.0f,
                                1e-45f,
                                -1e-45f,
                                test::from_bits<float>(0x7fc00000u),
                                test::from_bits<float>(0xffc00000u),
                                -1.0f,
                                2.0f};
  std::vector<std::uint32_t> words(1);
  pack_relu_mask<float>(cpu_backend{1}, test::view_of(y, {8}), words.data());
  CHECK(words[0] == 0b10110100u);
}

// The CUDA kernels decide on the bits (detail::relu_passes) so that flush-to-zero cannot change a
// subnormal's bit: every 16-bit pattern, and float patterns around every boundary, against the
// reference's double comparison.
TEST_CASE_TEMPLATE("ReLU mask: the bitwise test agrees with !(y <= 0) on every pattern", T, half,
                   bfloat16) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const T y = test::from_bits<T>(bits);
    CAPTURE(bits);
    CHECK(dropit::detail::relu_passes(y) == passes(y));
  }
}

TEST_CASE("ReLU mask: the bitwise test agrees with !(y <= 0) on float boundaries") {
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t magnitude : {0x0u, 0x1u, 0x2u, 0x7fffffu, 0x800000u, 0x3f800000u,
                                    0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fc00000u,
                                    0x7fffffffu}) {
      const float y = test::from_bits<float>(sign | magnitude);
      CAPTURE(sign | magnitude);
      CHECK(dropit::detail::relu_passes(y) == passes(y));
    }
}

TEST_CASE("ReLU mask: bad input") {
  const std::vector<float> y(40, 1.0f);
  std::vector<float> dx(40);
  std::vector<std::uint32_t> words(2);
  CHECK_ERROR(pack_relu_mask<float>(cpu_backend{1}, test::view_of(y, {40}), nullptr), "null", "2");
  CHECK_ERROR(pack_relu_mask<float>(cpu_backend{1}, {nullptr, dropit::shape{40}}, words.data()),
              "ReLU output", "null");
  CHECK_ERROR(apply_relu_mask<float>(cpu_backend{1}, words.data(), test::view_of(y, {40}),
                                     test::view_of(dx, {4, 10})),
              "[40]", "[4, 10]");
  CHECK_ERROR(relu_with_mask<float>(cpu_backend{1}, test::view_of(y, {40}),
                                    test::view_of(dx, {4, 10}), words.data()),
              "[40]", "[4, 10]");
  CHECK_ERROR(relu_with_mask<float>(cpu_backend{1}, test::view_of(y, {40}), test::view_of(dx, {40}),
                                    nullptr),
              "null", "2");
  CHECK_ERROR(apply_relu_mask<float>(cpu_backend{1}, nullptr, test::view_of(y, {40}),
                                     test::view_of(dx, {40})),
              "null");
}
