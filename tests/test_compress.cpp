// compress / densify for min-k, chunked min-k and channel granularity: the kept set must be the
// brute-force reference's, bit for bit, through the value buffer, the encoded positions and
// densify. Random selection has its own file.

#include <algorithm>
#include <cmath>

#include "helpers.hpp"

namespace {

using dropit::bfloat16;
using dropit::half;
using namespace dropit;

using test::serial;

// compress(x) under p must keep exactly `mask`: values in ascending position order, positions as
// encoded, and densify equal to x masked, bit for bit.
template <class T, class P>
void check_keeps(const std::vector<T>& x, const dropit::shape& s, const P& p,
                 const std::vector<bool>& mask, const cpu_backend& backend = serial) {
  const auto c = compress(backend, p, test::view_of(x, s));
  const auto count = std::count(mask.begin(), mask.end(), true);
  REQUIRE(c.layout().kept() == count);
  CHECK_BITS_EQUAL(test::values_of(c), ref::kept_values(x, mask));
  if (c.layout().encoding != position_encoding::seeded) CHECK(test::decoded_mask(c) == mask);
  CHECK_BITS_EQUAL(densify(backend, c), ref::masked(x, mask));
  // Into an output that holds something else: densify writes its zeros too.
  std::vector<T> dense(x.size(), test::make<T>(7.0));
  std::vector<std::byte> memory(densify_workspace_bytes<T>(backend, c.layout()));
  densify<T>(backend, c.view(), test::view_of(dense, s), workspace(memory));
  CHECK_BITS_EQUAL(dense, ref::masked(x, mask));
}

const ref::rate some_rates[] = {{0.0, 0, 1}, {0.29, 29, 100}, {0.5, 1, 2},
                                {0.8, 4, 5}, {0.9, 9, 10},    {0.99, 99, 100}};

}  // namespace

TEST_CASE_TEMPLATE("min-k keeps the k largest magnitudes of the whole tensor", T, float, half,
                   bfloat16) {
  std::uint64_t seed = 1;
  // Around each change of selection method: ordering a copy up to 512 keys, a radix histogram
  // beyond, a sampled bracket from 4096.
  for (std::int64_t n : {1, 2, 3, 10, 33, 100, 512, 513, 1000, 4095, 4096, 5000})
    for (const ref::rate& r : some_rates) {
      CAPTURE(n);
      CAPTURE(r.gamma);
      const auto x = test::nasty_values<T>(n, seed++);
      check_keeps(x, {n}, policy<min_k_selection>{{r.gamma}}, ref::min_k_mask(x, r));
    }
}

TEST_CASE_TEMPLATE("min-k over more than 2^16 elements (32-bit offsets and bitmask)", T, float,
                   half, bfloat16) {
  const std::int64_t n = 7 * 10001;  // > 2^16: offsets need 32 bits
  const auto x = test::nasty_values<T>(n, 77);
  for (const ref::rate& r : {ref::rate{0.99, 99, 100}, ref::rate{0.5, 1, 2}}) {
    CAPTURE(r.gamma);
    const auto c = compress(serial, policy<min_k_selection>{{r.gamma}}, test::view_of(x, {n}));
    CHECK(c.layout().encoding ==
          (r.gamma > 0.9 ? position_encoding::offsets : position_encoding::bitmask));
    check_keeps(x, {7, 10001}, policy<min_k_selection>{{r.gamma}}, ref::min_k_mask(x, r));
  }
}

TEST_CASE_TEMPLATE("min-k over a long tensor, selected by several threads together", T, float, half,
                   bfloat16) {
  // From 2^16 elements, the only chunk of a min-k layout is keyed, counted and emitted by every
  // thread, range by range; the kept set must still be the reference's, ties to the lower index.
  using S = test::special<T>;
  const std::int64_t n = 70001;
  std::vector<std::vector<T>> inputs = {test::nasty_values<T>(n, 21), test::smooth_values<T>(n, 22),
                                        std::vector<T>(n, test::make<T>(2.0))};  // one big tie
  std::vector<T> nans(n, test::from_bits<T>(S::quiet_nan));  // more NaNs than places
  for (std::int64_t i = 0; i < n; i += 5) nans[i] = test::make<T>(1.0);
  inputs.push_back(nans);
  std::vector<T> one_bin(n);  // nearly equal keys: the cut is resolved among one radix bin
  const std::uint32_t one = dropit::bits_of(test::make<T>(1.0));
  for (std::int64_t i = 0; i < n; ++i)
    one_bin[i] = test::from_bits<T>(one + static_cast<std::uint32_t>((i * 7919) % 61));
  inputs.push_back(one_bin);
  for (const auto& x : inputs)
    for (const ref::rate& r : some_rates)
      for (int threads : {2, 3}) {
        CAPTURE(r.gamma);
        CAPTURE(threads);
        check_keeps(x, {n}, policy<min_k_selection>{{r.gamma}}, ref::min_k_mask(x, r),
                    cpu_backend{threads});
      }
}

TEST_CASE_TEMPLATE("chunked min-k keeps k(D) per chunk and k(tail) in the tail", T, float, half,
                   bfloat16) {
  std::uint64_t seed = 100;
  for (std::int64_t n : {1, 100, 1000, 5003})
    for (std::int64_t d : {1, 3, 32, 33, 100, 1024})
      for (const ref::rate& r : some_rates) {
        CAPTURE(n);
        CAPTURE(d);
        CAPTURE(r.gamma);
        const auto x = test::nasty_values<T>(n, seed++);
        check_keeps(x, {n}, policy<chunked_min_k_selection>{{r.gamma, d}},
                    ref::chunked_min_k_mask(x, d, r));
      }
}

TEST_CASE_TEMPLATE("chunked min-k with the largest chunk, D = 65536", T, float, half, bfloat16) {
  const std::int64_t d = 65536, n = 2 * d + 777;
  const auto x = test::nasty_values<T>(n, 5);
  for (const ref::rate& r : {ref::rate{0.9, 9, 10}, ref::rate{0.99, 99, 100}}) {
    CAPTURE(r.gamma);
    check_keeps(x, {n}, policy<chunked_min_k_selection>{{r.gamma, d}},
                ref::chunked_min_k_mask(x, d, r));
  }
}

TEST_CASE_TEMPLATE("chunked min-k on inputs that mislead the sampled bracket", T, float, half,
                   bfloat16) {
  // From 4096 keys, selection brackets the cut from every 16th key, then counts and gathers the
  // rest in one pass; where the sample lies, it must fall back to counting every key. Inputs
  // whose sampled positions hold the smallest or the largest values, a ramp, one tie across the
  // chunk and blocks of very different scale, with a tail that is not a whole mask word.
  for (std::int64_t d : {4096, 16384}) {
    const std::int64_t n = 2 * d + 1000 + 5;
    const auto noise = test::nasty_values<T>(n, 31);
    std::vector<std::vector<T>> inputs;
    for (double sampled : {0.5, 64.0}) {  // below or above everything else
      std::vector<T> x(n);
      for (std::int64_t i = 0; i < n; ++i)
        x[i] = test::make<T>(i % 16 == 0 ? sampled : 1.0 + static_cast<double>(i % 61) / 64.0);
      inputs.push_back(x);
    }
    std::vector<T> ramp(n), scales(n);
    for (std::int64_t i = 0; i < n; ++i) {
      ramp[i] = test::make<T>(static_cast<double>(i % 1999) / 16.0);
      scales[i] = test::make<T>(std::ldexp(1.0 + static_cast<double>(i % 7) / 8.0,
                                           static_cast<int>(i / 1024 % 9) * 3 - 12));
    }
    inputs.push_back(ramp);
    inputs.push_back(scales);
    inputs.push_back(std::vector<T>(n, test::make<T>(3.0)));
    inputs.push_back(noise);
    for (std::size_t input = 0; input < inputs.size(); ++input)
      for (const ref::rate& r : some_rates) {
        CAPTURE(d);
        CAPTURE(input);
        CAPTURE(r.gamma);
        check_keeps(inputs[input], {n}, policy<chunked_min_k_selection>{{r.gamma, d}},
                    ref::chunked_min_k_mask(inputs[input], d, r));
      }
  }
}

TEST_CASE("chunked min-k with D = 1 keeps every element") {
  const auto x = test::nasty_values<float>(1000, 3);
  check_keeps(x, {10, 100}, policy<chunked_min_k_selection>{{0.99, 1}},
              std::vector<bool>(x.size(), true));
}

TEST_CASE_TEMPLATE("min-k ranks NaN first, then infinities, ties to the lower index", T, float,
                   half, bfloat16) {
  using S = test::special<T>;
  const T nan = test::from_bits<T>(S::quiet_nan),
          neg_nan = test::from_bits<T>(S::sign | S::quiet_nan);
  const T inf = test::from_bits<T>(S::inf), neg_inf = test::from_bits<T>(S::sign | S::inf);
  const T zero = test::from_bits<T>(0), neg_zero = test::from_bits<T>(S::sign);
  const T tiny = test::from_bits<T>(1), tiny2 = test::from_bits<T>(2);  // subnormals
  const auto keep = [](std::initializer_list<int> kept, std::size_t n) {
    std::vector<bool> mask(n, false);
    for (int i : kept) mask[i] = true;
    return mask;
  };
  const auto min_k = [](double gamma) { return policy<min_k_selection>{{gamma}}; };

  // NaN (either sign) outranks infinity, which outranks every finite value.
  std::vector<T> x = {test::make<T>(1), neg_inf, test::make<T>(-1e4), nan, test::make<T>(3), inf,
                      neg_nan,          zero};
  check_keeps(x, {8}, min_k(0.5), keep({1, 3, 5, 6}, 8));
  check_keeps(x, {8}, min_k(0.75), keep({3, 6}, 8));
  // Equal magnitudes (sign ignored) tie; the lower index wins.
  x = {test::make<T>(2), test::make<T>(-2), test::make<T>(1), test::make<T>(2)};
  check_keeps(x, {4}, min_k(0.5), keep({0, 1}, 4));
  check_keeps(x, {4}, min_k(0.75), keep({0}, 4));
  // +0 and -0 tie; subnormals order by magnitude and beat zero.
  x = {zero, neg_zero, tiny, neg_zero, tiny2, zero};
  check_keeps(x, {6}, min_k(0.5), keep({0, 2, 4}, 6));
  check_keeps(x, {6}, min_k(1.0 / 6), keep({0, 1, 2, 3, 4}, 6));
  // The same rules inside every chunk.
  x = {zero, nan, tiny, inf, neg_zero, zero, tiny2, tiny, test::make<T>(-5), neg_inf};
  check_keeps(x, {10}, policy<chunked_min_k_selection>{{0.5, 4}}, keep({1, 3, 6, 7, 9}, 10));
}

TEST_CASE_TEMPLATE("all-equal inputs keep the first k of every chunk", T, float, half, bfloat16) {
  using S = test::special<T>;
  const std::int64_t n = 1000, d = 64;
  const ref::rate r{0.8, 4, 5};
  for (std::uint32_t bits : {0u, S::sign, S::inf, S::quiet_nan, S::sign | S::quiet_nan, 1u,
                             dropit::bits_of(test::make<T>(-1.5))}) {
    CAPTURE(bits);
    const std::vector<T> x(n, test::from_bits<T>(bits));
    std::vector<bool> first(n, false);
    for (std::int64_t i = 0; i < n; ++i)
      first[i] = i % d < ref::kept(std::min(d, n - i / d * d), r);
    check_keeps(x, {n}, policy<chunked_min_k_selection>{{r.gamma, d}}, first);
    std::vector<bool> prefix(n, false);
    std::fill_n(prefix.begin(), ref::kept(n, r), true);
    check_keeps(x, {n}, policy<min_k_selection>{{r.gamma}}, prefix);
  }
}

TEST_CASE_TEMPLATE("channel min-k keeps the channels with the largest sums of squares", T, float,
                   half, bfloat16) {
  struct Case {
    std::vector<std::int64_t> dims;
    int axis;
  };
  const Case cases[] = {{{3, 10, 4, 5}, 1}, {{3, 10, 4, 5}, -3}, {{40, 33}, -1}, {{2, 5, 33}, -1},
                        {{17, 6}, 0},       {{1, 64, 1, 1}, 1},  {{50}, 0}};
  std::uint64_t seed = 900;
  for (const Case& c : cases)
    for (const ref::rate& r : some_rates) {
      CAPTURE(c.axis);
      CAPTURE(r.gamma);
      const auto x = test::smooth_values<T>(dropit::shape(c.dims).numel(), seed++);
      const ref::channel_split s = ref::split_at(c.dims, c.axis);
      const auto channels = ref::top_channels(ref::channel_scores(x, s), ref::kept(s.channels, r));
      check_keeps(x, test::shape_of(c.dims),
                  policy<min_k_selection, channel_granularity>{{r.gamma}, {c.axis}},
                  ref::channel_mask(s, channels));
    }
}

TEST_CASE_TEMPLATE("channel min-k: NaN channel first, infinity next, ties to the lower channel", T,
                   float, half, bfloat16) {
  using S = test::special<T>;
  // [outer 2, channels 8, inner 3]; channel c holds the value v[c] everywhere.
  const double v[8] = {1, 3, 2, 3, 0.5, 3, 0, 1};
  std::vector<T> x(2 * 8 * 3);
  for (int o = 0; o < 2; ++o)
    for (int c = 0; c < 8; ++c)
      for (int i = 0; i < 3; ++i) x[(o * 8 + c) * 3 + i] = test::make<T>((c % 2 ? -1 : 1) * v[c]);
  x[(1 * 8 + 4) * 3 + 2] = test::from_bits<T>(S::sign | S::quiet_nan);  // channel 4: NaN
  x[(0 * 8 + 6) * 3 + 1] = test::from_bits<T>(S::inf);                  // channel 6: inf
  const auto mask = [](std::vector<std::int64_t> channels) {
    return ref::channel_mask({2, 8, 3}, channels);
  };
  const auto with = [](double gamma) {
    return policy<min_k_selection, channel_granularity>{{gamma}, {1}};
  };
  // k = 4: NaN channel 4, inf channel 6, then the tie at score 54 (channels 1, 3, 5) goes to 1, 3.
  check_keeps(x, {2, 8, 3}, with(0.5), mask({1, 3, 4, 6}));
  check_keeps(x, {2, 8, 3}, with(0.75), mask({4, 6}));
  check_keeps(x, {2, 8, 3}, with(0.875), mask({4}));
  check_keeps(x, {2, 8, 3}, with(0.375), mask({1, 3, 4, 5, 6}));  // k = 8 - 3
}

TEST_CASE("channel min-k scores by the sum of squares, not |x| or max|x|") {
  const auto one_of_two = policy<min_k_selection, channel_granularity>{{0.5}, {1}};
  // A = {3, 0, 0, 0}: squares 9, |x| 3.  B = {1.4 x4}: squares 7.84, |x| 5.6.
  std::vector<float> x = {3, 0, 0, 0, 1.4f, 1.4f, 1.4f, 1.4f};
  check_keeps(x, {1, 2, 4}, one_of_two, ref::channel_mask({1, 2, 4}, {0}));
  // A again against C = {2.9, 2.9, 0, 0}: squares 16.82 but max|x| 2.9 < 3.
  x = {3, 0, 0, 0, 2.9f, 2.9f, 0, 0};
  check_keeps(x, {1, 2, 4}, one_of_two, ref::channel_mask({1, 2, 4}, {1}));
}

TEST_CASE("gamma = 0 keeps everything under every policy") {
  for (const std::vector<std::int64_t>& dims :
       {std::vector<std::int64_t>{5, 7, 3, 2}, std::vector<std::int64_t>{300, 9}}) {
    const auto x = test::nasty_values<float>(dropit::shape(dims).numel(), 4);
    test::for_each_policy(0.0, 1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      check_keeps(x, test::shape_of(dims), p, std::vector<bool>(x.size(), true));
    });
  }
}

TEST_CASE_TEMPLATE("an empty tensor gives an empty cache", T, float, half, bfloat16) {
  for (const std::vector<std::int64_t>& dims :
       {std::vector<std::int64_t>{0}, std::vector<std::int64_t>{0, 5},
        std::vector<std::int64_t>{3, 0, 4}, std::vector<std::int64_t>{0, 8, 2, 2}}) {
    test::for_each_policy(0.9, -1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      const dropit::tensor_view<const T> empty{nullptr, test::shape_of(dims)};
      const auto c = compress(serial, p, empty);
      CHECK(c.layout().kept() == 0);
      CHECK(c.values().empty());
      CHECK(c.layout().value_bytes() == 0);
      // Only a channel list over existing channels has anything to store.
      const auto& l = c.layout();
      const std::size_t positions =
          l.encoding == position_encoding::channel_list ? 4 * std::size_t(l.kept_channels) : 0;
      CHECK(c.bytes() == positions);
      CHECK(densify(serial, c).empty());
    });
  }
}

TEST_CASE_TEMPLATE("min-k among values that share one radix bin", T, float, half, bfloat16) {
  // Consecutive representable values just above 1 share their top bits, so the selection has to
  // resolve the cut among nearly equal keys.
  const std::int64_t n = 3000;
  std::vector<T> x(n);
  const std::uint32_t one = dropit::bits_of(test::make<T>(1.0));
  for (std::int64_t i = 0; i < n; ++i)
    x[i] = test::from_bits<T>(one + static_cast<std::uint32_t>((i * 7919) % 61));  // with repeats
  for (const ref::rate& r : some_rates) {
    CAPTURE(r.gamma);
    check_keeps(x, {n}, policy<min_k_selection>{{r.gamma}}, ref::min_k_mask(x, r));
    check_keeps(x, {n}, policy<chunked_min_k_selection>{{r.gamma, 1000}},
                ref::chunked_min_k_mask(x, 1000, r));
  }
}

// Every NaN outranks every number, and NaNs rank equally among themselves: with more NaNs than
// places, the lower indices win whatever the payloads.
TEST_CASE("min-k: NaNs with different payloads tie, lower index first") {
  const float low_payload = test::from_bits<float>(0x7fc00000u);
  const float high_payload = test::from_bits<float>(0x7fc12345u);
  const float signalling = test::from_bits<float>(0x7f800001u);
  const std::vector<float> x = {low_payload, 1.0f, high_payload, signalling, 2.0f, low_payload};
  check_keeps(x, {6}, policy<min_k_selection>{{0.5}}, {true, false, true, true, false, false});
  check_keeps(x, {6}, policy<min_k_selection>{{0.8}}, {true, false, true, false, false, false});
  const std::vector<half> h = {half{0x7e00}, half{0x3c00}, half{0x7fff}, half{0x7c01}};
  check_keeps(h, {4}, policy<min_k_selection>{{0.5}}, {true, false, true, false});
}

// A 4-D tensor stored channels-last is compressed in its logical order: its cache is, byte for
// byte, the cache of the same tensor stored contiguously (transposed here by brute force), for
// every policy and whether chunks are gathered one by one or the tensor is transposed whole.
TEST_CASE_TEMPLATE("compress of a channels-last tensor is the contiguous tensor's", T, float, half,
                   bfloat16) {
  for (const test::channels_last_case& d : test::channels_last_cases) {
    const std::int64_t n = d.numel();
    CAPTURE(d.channels);
    CAPTURE(d.pixels());
    const dropit::shape logical = d.logical();
    const auto stored = test::smooth_values<T>(n, static_cast<std::uint64_t>(n) + 3);
    std::vector<T> contiguous(static_cast<std::size_t>(n));
    for (std::int64_t image = 0; image < d.images; ++image)
      for (std::int64_t c = 0; c < d.channels; ++c)
        for (std::int64_t p = 0; p < d.pixels(); ++p)
          contiguous[d.logical_at(image, c, p)] = stored[d.stored_at(image, c, p)];
    const auto check_policy = [&](const auto& p, const char* name) {
      CAPTURE(name);
      const auto want = compress(serial, p, test::view_of(contiguous, logical));
      const cache_layout layout = plan_cache<T>(p, logical);
      for (const int threads : {1, 3}) {
        CAPTURE(threads);
        const cpu_backend backend{threads};
        std::vector<T> values(static_cast<std::size_t>(layout.kept()));
        std::vector<unsigned char> positions(layout.position_bytes());
        const cache_view<T> out{layout, values.data(), positions.data()};
        const std::size_t bytes = compress_channels_last_workspace_bytes<T>(backend, layout);
        std::vector<std::byte> memory(bytes);
        compress_channels_last<T>(backend, test::view_of(stored, logical), out, memory);
        CHECK_BITS_EQUAL(values, test::values_of(want));
        CHECK(positions == test::position_bytes(want));
        if (bytes > 0)
          CHECK_ERROR(compress_channels_last<T>(backend, test::view_of(stored, logical), out,
                                                workspace(memory.data(), bytes - 1)),
                      "compress", std::to_string(bytes - 1), std::to_string(bytes));
      }
    };
    test::for_each_policy(0.8, 1, check_policy);
    check_policy(policy<chunked_min_k_selection>{{0.9, 100}}, "chunked min-k, D = 100");
    check_policy(policy<min_k_selection, channel_granularity>{{0.5}, {3}}, "channel min-k, axis 3");
  }
}

TEST_CASE("compress of a channels-last tensor: bad input") {
  const std::vector<float> x(60, 1.0f);
  const cache_layout flat = plan_cache<float>(policy<min_k_selection>{{0.5}}, {60});
  std::vector<float> values(static_cast<std::size_t>(flat.kept()));
  std::vector<std::uint32_t> positions((flat.position_bytes() + 3) / 4);
  CHECK_ERROR(compress_channels_last_workspace_bytes<float>(serial, flat), "compress input", "[60]",
              "not 4-D");
  CHECK_ERROR(compress_channels_last<float>(serial, test::view_of(x, {60}),
                                            {flat, values.data(), positions.data()}, {}),
              "compress input", "[60]", "not 4-D");
  // The layout is checked against the input as for a contiguous one.
  CHECK_ERROR(compress_channels_last<float>(serial, test::view_of(x, {3, 4, 5, 1}),
                                            {flat, values.data(), positions.data()}, {}),
              "compress input", "[3, 4, 5, 1]", "[60]");
}
