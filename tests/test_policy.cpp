// k(n), plan_cache and the byte counts of every encoding, checked against formulas written from
// the table "Memory per cached element" in docs/api.md.

#include <limits>
#include <random>

#include "helpers.hpp"

namespace {

using dropit::position_encoding;

constexpr std::int64_t sizes[] = {0,     1,     2,     31,    32,    33,    100,   1000,
                                  16383, 16384, 16385, 50000, 65536, 65537, 200003};
constexpr std::int64_t chunk_sizes[] = {1, 2, 31, 32, 33, 100, 1024, 16384, 65535, 65536};

// Policies compose at compile time; chunked min-k has no channel form.
template <class S, class G>
concept composable = requires {
  typename dropit::policy<S, G>;
};
static_assert(composable<dropit::min_k_selection, dropit::channel_granularity>);
static_assert(composable<dropit::random_selection, dropit::channel_granularity>);
static_assert(composable<dropit::chunked_min_k_selection, dropit::element_granularity>);
static_assert(!composable<dropit::chunked_min_k_selection, dropit::channel_granularity>);
static_assert(dropit::policy_type<dropit::policy<dropit::random_selection>>);
static_assert(!dropit::policy_type<dropit::random_selection>);

}  // namespace

TEST_CASE("kept_count is n - floor(gamma * n) for decimal rates") {
  CHECK(dropit::kept_count(100, 0.29) == 71);  // 0.29 * 100 is 28.999999999999996 in binary
  CHECK(dropit::kept_count(10, 0.9) == 1);
  CHECK(dropit::kept_count(16384, 0.9) == 1639);
  CHECK(dropit::kept_count(0, 0.5) == 0);
  for (const ref::rate& r : ref::decimal_rates) {
    INFO("gamma = " << r.gamma);
    int failures = 0;
    for (std::int64_t n = 0; n <= 70000; ++n)
      if (dropit::kept_count(n, r.gamma) != ref::kept(n, r) && ++failures <= 3)
        FAIL_CHECK("n = " << n << ": " << dropit::kept_count(n, r.gamma)
                          << " != " << ref::kept(n, r));
    // Large n, up to the 2^32 elements a whole-tensor min-k may address.
    std::mt19937_64 rng(42);
    for (int i = 0; i < 20000; ++i) {
      const auto n = static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 32));
      if (dropit::kept_count(n, r.gamma) != ref::kept(n, r) && ++failures <= 3)
        FAIL_CHECK("n = " << n << ": " << dropit::kept_count(n, r.gamma)
                          << " != " << ref::kept(n, r));
    }
    CHECK(failures == 0);
  }
}

TEST_CASE("kept_count: gamma = 0 keeps everything, and something is always kept") {
  for (std::int64_t n : {1, 2, 3, 100, 65536, 1 << 30}) {
    CHECK(dropit::kept_count(n, 0.0) == n);
    CHECK(dropit::kept_count(n, std::nextafter(1.0, 0.0)) >= 1);
    CHECK(dropit::kept_count(n, 0.999) >= 1);
  }
}

// The floor must not be bent for rates with more decimals than the allowance anticipates:
// 0.49999995 * 10 = 4.9999995, so 4 are dropped and 6 kept.
TEST_CASE("kept_count: floor is exact for rates with many decimals") {
  CHECK(dropit::kept_count(10, 0.49999995) == 6);
  CHECK(dropit::kept_count(1000000, 0.0000009999995) == 1000000);  // 0.9999995 dropped: floor 0
}

TEST_CASE_TEMPLATE("plan_cache: chunked min-k counts and the smaller position encoding", T, float,
                   dropit::half, dropit::bfloat16) {
  for (std::int64_t n : sizes)
    for (std::int64_t d : chunk_sizes)
      for (const ref::rate& r : ref::decimal_rates) {
        CAPTURE(n);
        CAPTURE(d);
        CAPTURE(r.gamma);
        const auto layout = dropit::plan_cache<T>(
            dropit::policy<dropit::chunked_min_k_selection>{{r.gamma, d}}, dropit::shape{n});
        const std::int64_t kept = ref::chunked_kept(n, d, r);
        const std::int64_t bitmask = ref::bitmask_bytes(n, d), offsets = 2 * kept;
        REQUIRE(layout.kept() == kept);
        CHECK(layout.kept_per_chunk == ref::kept(d, r));
        CHECK(layout.kept_per_tail == ref::kept(n % d, r));
        CHECK(layout.chunk_count() == ref::ceil_div(n, d));
        CHECK(layout.value_bytes() == static_cast<std::size_t>(kept) * sizeof(T));
        CHECK(layout.encoding ==
              (bitmask <= offsets ? position_encoding::bitmask : position_encoding::offsets));
        CHECK(layout.position_bytes() == static_cast<std::size_t>(std::min(bitmask, offsets)));
        CHECK(layout.bytes() == layout.value_bytes() + layout.position_bytes());
      }
}

TEST_CASE("plan_cache: bitmask at gamma 0.9, offsets at gamma 0.99, bitmask on a tie") {
  const dropit::shape big{std::int64_t{1} << 20};
  const auto at = [&](double gamma, std::int64_t d, dropit::shape s) {
    return dropit::plan_cache<float>(dropit::policy<dropit::chunked_min_k_selection>{{gamma, d}},
                                     s);
  };
  const auto dense = at(0.9, 16384, big);
  CHECK(dense.encoding == position_encoding::bitmask);
  CHECK(dense.position_bytes() == (std::size_t{1} << 20) / 8);  // exactly one bit per element
  const auto sparse = at(0.99, 16384, big);
  CHECK(sparse.encoding == position_encoding::offsets);
  CHECK(sparse.position_bytes() == 64 * 164 * 2);  // k(16384) = 164 per chunk, 2 bytes each
  // D = 64: the mask is 2 words = 8 bytes per chunk; 60/64 dropped leaves 4 offsets = 8 bytes.
  CHECK(at(60.0 / 64, 64, dropit::shape{640}).encoding == position_encoding::bitmask);
  CHECK(at(61.0 / 64, 64, dropit::shape{640}).encoding == position_encoding::offsets);
}

TEST_CASE_TEMPLATE("plan_cache: whole-tensor min-k uses 2-byte offsets up to 2^16, then 4", T,
                   float, dropit::half, dropit::bfloat16) {
  const std::int64_t huge = std::numeric_limits<std::uint32_t>::max();  // 2^32 - 1 is allowed
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{65536},
                         std::int64_t{65537}, std::int64_t{1} << 24, huge})
    for (const ref::rate& r : ref::decimal_rates) {
      CAPTURE(n);
      CAPTURE(r.gamma);
      // Planning allocates nothing, so even 2^32 - 1 elements are cheap here.
      const auto layout =
          dropit::plan_cache<T>(dropit::policy<dropit::min_k_selection>{{r.gamma}}, {n});
      const std::int64_t kept = ref::kept(n, r);
      const std::int64_t bitmask = 4 * ref::ceil_div(n, 32);
      const std::int64_t offsets = kept * (n > 65536 ? 4 : 2);
      CHECK(layout.kept() == kept);
      CHECK(layout.value_bytes() == static_cast<std::size_t>(kept) * sizeof(T));
      CHECK(layout.position_bytes() == static_cast<std::size_t>(std::min(bitmask, offsets)));
      CHECK(layout.encoding ==
            (bitmask <= offsets ? position_encoding::bitmask : position_encoding::offsets));
      if (layout.encoding == position_encoding::offsets)
        CHECK(layout.offset_bytes == (n > 65536 ? 4 : 2));
    }
}

TEST_CASE_TEMPLATE("plan_cache: random selection stores values only", T, float, dropit::half,
                   dropit::bfloat16) {
  for (std::int64_t n : sizes)
    for (std::int64_t d : chunk_sizes)
      for (const ref::rate& r : ref::decimal_rates) {
        CAPTURE(n);
        CAPTURE(d);
        CAPTURE(r.gamma);
        const auto layout = dropit::plan_cache<T>(
            dropit::policy<dropit::random_selection>{
                {.gamma = r.gamma, .seed = 3, .chunk_size = d}},
            {n});
        CHECK(layout.encoding == position_encoding::seeded);
        CHECK(layout.kept() == ref::chunked_kept(n, d, r));
        CHECK(layout.position_bytes() == 0);
        CHECK(layout.bytes() == static_cast<std::size_t>(ref::chunked_kept(n, d, r)) * sizeof(T));
      }
}

TEST_CASE_TEMPLATE("plan_cache: channel granularity keeps whole channels", T, float, dropit::half,
                   dropit::bfloat16) {
  struct Case {
    std::vector<std::int64_t> dims;
    int axis;
  };
  const Case cases[] = {{{8, 64, 7, 7}, 1}, {{8, 64, 7, 7}, -3}, {{512, 300}, -1},
                        {{4, 33, 300}, -1}, {{4, 33, 300}, 2},   {{10, 3}, 0},
                        {{1000}, 0},        {{0, 16, 4, 4}, 1},  {{2, 0, 5}, 1}};
  for (const Case& c : cases)
    for (const ref::rate& r : ref::decimal_rates) {
      CAPTURE(c.axis);
      CAPTURE(r.gamma);
      const ref::channel_split s = ref::split_at(c.dims, c.axis);
      const std::int64_t kept_channels = ref::kept(s.channels, r);
      const auto min_k = dropit::plan_cache<T>(
          dropit::policy<dropit::min_k_selection, dropit::channel_granularity>{{r.gamma}, {c.axis}},
          test::shape_of(c.dims));
      CHECK(min_k.encoding == position_encoding::channel_list);
      CHECK(min_k.kept_channels == kept_channels);
      CHECK(min_k.kept() == s.outer * kept_channels * s.inner);
      CHECK(min_k.value_bytes() ==
            static_cast<std::size_t>(s.outer * kept_channels * s.inner) * sizeof(T));
      CHECK(min_k.position_bytes() == static_cast<std::size_t>(4 * kept_channels));

      const auto random = dropit::plan_cache<T>(
          dropit::policy<dropit::random_selection, dropit::channel_granularity>{{.gamma = r.gamma},
                                                                                {c.axis}},
          test::shape_of(c.dims));
      CHECK(random.encoding == position_encoding::seeded);
      CHECK(random.kept() == s.outer * kept_channels * s.inner);
      CHECK(random.position_bytes() == 0);
    }
}

TEST_CASE("cache::bytes reports the layout's exact size") {
  std::vector<float> x = test::smooth_values<float>(5000, 1);
  const dropit::shape s{50, 100};
  const dropit::cpu_backend cpu{1};
  const auto check = [&](const auto& p, std::int64_t expected_bytes) {
    const auto c = dropit::compress(cpu, p, test::view_of(x, s));
    CHECK(c.bytes() == static_cast<std::size_t>(expected_bytes));
    CHECK(c.bytes() == c.layout().bytes());
    CHECK(c.values().size() == static_cast<std::size_t>(c.layout().kept()));
  };
  const ref::rate r{0.9, 9, 10};
  // Chunked, D = 128: 39 chunks of 128 keep 13 each, the 8-element tail keeps 1 -> 508 values;
  // mask = 4 * (39 * 4 + 1) = 628 bytes < 1016 bytes of offsets.
  check(dropit::policy<dropit::chunked_min_k_selection>{{0.9, 128}}, 508 * 4 + 628);
  check(dropit::policy<dropit::min_k_selection>{{0.9}}, 500 * 4 + 4 * ref::ceil_div(5000, 32));
  check(dropit::policy<dropit::random_selection>{{.gamma = 0.9, .chunk_size = 128}}, 508 * 4);
  check(dropit::policy<dropit::min_k_selection, dropit::channel_granularity>{{0.9}, {-1}},
        50 * ref::kept(100, r) * 4 + 4 * ref::kept(100, r));
  check(dropit::policy<dropit::random_selection, dropit::channel_granularity>{{.gamma = 0.9}, {0}},
        ref::kept(50, r) * 100 * 4);
}

TEST_CASE("a run-time policy_spec plans exactly like the matching policy") {
  const dropit::shape s{6, 10, 5, 7};
  const auto same = [&](const dropit::policy_spec& spec, const auto& p) {
    const auto a = dropit::plan_cache(spec, s, dropit::element_type::bfloat16);
    const auto b = dropit::plan_cache<dropit::bfloat16>(p, s);
    CHECK(a.selection == b.selection);
    CHECK(a.channel_granularity == b.channel_granularity);
    CHECK(a.encoding == b.encoding);
    CHECK(a.gamma == b.gamma);
    CHECK(a.seed == b.seed);
    CHECK(a.rescale == b.rescale);
    CHECK(a.chunk_size == b.chunk_size);
    CHECK(a.kept() == b.kept());
    CHECK(a.bytes() == b.bytes());
    CHECK(a.channel_axis == b.channel_axis);
    CHECK(a.kept_channels == b.kept_channels);
  };
  using dropit::selection_kind;
  same({.selection = selection_kind::chunked_min_k, .gamma = 0.8, .chunk_size = 100},
       dropit::policy<dropit::chunked_min_k_selection>{{0.8, 100}});
  same({.selection = selection_kind::min_k, .gamma = 0.95},
       dropit::policy<dropit::min_k_selection>{{0.95}});
  same({.selection = selection_kind::random,
        .gamma = 0.5,
        .chunk_size = 64,
        .seed = 9,
        .rescale = true},
       dropit::policy<dropit::random_selection>{
           {.gamma = 0.5, .seed = 9, .chunk_size = 64, .rescale = true}});
  same({.selection = selection_kind::min_k,
        .channel_granularity = true,
        .channel_axis = -1,
        .gamma = 0.5},
       dropit::policy<dropit::min_k_selection, dropit::channel_granularity>{{0.5}, {-1}});
  same({.selection = selection_kind::random,
        .channel_granularity = true,
        .channel_axis = 1,
        .gamma = 0.7,
        .seed = 3},
       dropit::policy<dropit::random_selection, dropit::channel_granularity>{
           {.gamma = 0.7, .seed = 3}, {1}});
  CHECK_ERROR(
      dropit::plan_cache({.selection = selection_kind::chunked_min_k, .channel_granularity = true},
                         s, dropit::element_type::float32),
      "chunked_min_k", "channel granularity");
  CHECK_ERROR(dropit::plan_cache({.selection = selection_kind::min_k, .gamma = 1.25}, s,
                                 dropit::element_type::float32),
              "1.25");
}
